# The compiled build's C layout of MemoryStore (aiqsim.compiled.module_digest): attributes in C fields,
# which the classes' own methods read without a lookup. The .py is the one source of behaviour; pure
# Python never reads this file.
cdef class MemoryStore:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _job_owners, _jobs, _owners, _poison, _tasks, deferred_commit, writes
