# The compiled build's C layout of MultiQuota (aiqsim.compiled.module_digest): attributes in C fields,
# which the classes' own methods read without a lookup. The .py is the one source of behaviour; pure
# Python never reads this file.
cdef class MultiQuota:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object concurrency, in_flight, limits, paused_until, requests, tokens
