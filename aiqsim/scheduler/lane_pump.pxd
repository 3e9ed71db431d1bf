# The compiled build's C layout of LanePump (aiqsim.compiled.module_digest): attributes in C fields,
# which the classes' own methods read without a lookup. The .py is the one source of behaviour; pure
# Python never reads this file.
cdef class LanePump:
    cdef public object _name, _running, _runtime, _soon, _step, _stopped, _timer
