# The compiled build's C layout of _LazyQueue and _FifoQueue (aiqsim.compiled.module_digest): attributes in C fields,
# which the classes' own methods read without a lookup. The .py is the one source of behaviour; pure
# Python never reads this file.
cdef class _LazyQueue:
    cdef public object _removals, _size

cdef class _FifoQueue(_LazyQueue):
    cdef public object _items
