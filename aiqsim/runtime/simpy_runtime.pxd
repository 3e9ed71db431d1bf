# The compiled build's C layout of SimPyRuntime, SimTask, _Deadline and _DeadlineWheel (aiqsim.compiled.module_digest): attributes in C fields,
# which the classes' own methods read without a lookup. The .py is the one source of behaviour; pure
# Python never reads this file.
cdef class SimPyRuntime:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _deadlines, _ready, _running, current_task, env, task_errors

cdef class SimTask:
    cdef public object _cancel_pending, _cancel_requests, _coro, _deadlines, _done, _ended, _ok
    cdef public object _outcome, _rt, _value, _waiting, callbacks, name

cdef class _Deadline:
    cdef public object armed, cancel_requests, expired, future_wait, task

cdef class _DeadlineWheel:
    cdef public object _env, _heap, _seq, _tail, _tail_when, _timer, _timer_at
