"""The simulation runtime: the scheduler's coroutines driven on a ``simpy.Environment``.

Each spawned coroutine gets one small driver (:class:`SimTask`) that steps it with
``send``/``throw``; an ``await`` yields a SimPy event and the driver resumes the
coroutine from that event's callback. No SimPy ``Process`` is created per await (that
costs 1.5-4.5x), and exceptions are thrown back as the original objects (SimPy's
``Process`` would re-create them as ``type(e)(*e.args)``).

Virtual time only advances when SimPy pops an event, so a simulation of hours runs
in milliseconds, and equal-time events run in scheduling order: the same inputs and
seed always give the same event sequence.

Hot path (measured by ``benchmarks/bench_sim_vs_native.py``): ``wait_for`` on a coroutine
runs it inside the awaiting task under a deadline, as ``asyncio.timeout`` does, instead of
spawning a child task per provider call; ``wait_for(x, None)`` is ``x`` itself; and
:meth:`SimPyRuntime.run` pops the event heap itself when the environment is a plain
``simpy.Environment``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from heapq import heappop, heappush
from math import inf, nextafter  # names, not math.x: one lookup fewer per call in the hot path
from types import CoroutineType
from typing import Any, NoReturn, TypeVar

import simpy
from simpy.events import NORMAL, PENDING

from aiqsim.core.errors import SchedulingError
from aiqsim.runtime.protocol import Cancelled, DeadlineExceeded

T = TypeVar("T")

_Environment = simpy.Environment
"""Events on a plain environment are pushed on its heap here, as ``Environment.schedule`` does
(same key: time, priority, then the environment's event counter, so the same order), without
that method's call on every wake-up; a subclass of it keeps its own ``schedule``."""

_Event = simpy.Event
"""Read at every coroutine step: a module constant, not ``simpy.Event`` (an attribute lookup each time)."""


class InvalidStateError(SchedulingError, RuntimeError):
    """A future was resolved twice, or its result was read before it had one."""


class SimulationDeadlock(SchedulingError, RuntimeError):
    """The main coroutine is still waiting but nothing is left to happen."""


class RuntimeAlreadyRunningError(SchedulingError, RuntimeError):
    """:meth:`SimPyRuntime.run` was called while that runtime is already running (from one of its
    own tasks or callbacks), as asyncio refuses a nested ``run``: await the coroutine instead."""


class SimFuture(simpy.Event):
    """A one-shot future that is also a SimPy event (so awaiting it costs no extra object)."""

    def done(self) -> bool:
        """True once a result or an exception was set (even before SimPy processes the event)."""
        return self._value is not PENDING

    def cancelled(self) -> bool:
        """True when the future was resolved by :meth:`cancel`."""
        return self._value is not PENDING and not self._ok and isinstance(self._value, Cancelled)

    def set_result(self, value: Any) -> None:
        if self._value is not PENDING:
            raise InvalidStateError("future already resolved")
        self._ok = True
        self._value = value
        if self.callbacks:
            env = self.env
            if type(env) is _Environment:  # env.schedule(self), inlined (see _Environment)
                heappush(env._queue, (env._now, NORMAL, next(env._eid), self))
            else:
                env.schedule(self)
        else:  # nobody is waiting: processed at once, no heap event (later awaiters see it done)
            self.callbacks = None

    def set_exception(self, exc: BaseException) -> None:
        if self._value is not PENDING:
            raise InvalidStateError("future already resolved")
        self._defused = True  # failures are delivered to awaiters, never crash the environment
        self._ok = False
        self._value = exc
        if self.callbacks:
            self.env.schedule(self)
        else:
            self.callbacks = None

    def cancel(self) -> bool:
        if self._value is not PENDING:
            return False
        self.set_exception(Cancelled())
        return True

    def result(self) -> Any:
        """The value, or raise the exception that was set (the original object)."""
        if self._value is PENDING:
            raise InvalidStateError("result is not ready")
        if self._ok:
            return self._value
        raise self._value

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        if self.callbacks is not None:
            self.callbacks.append(fn)
        else:
            soon = simpy.Event(self.env)
            soon.callbacks.append(lambda _ev: fn(self))
            soon.succeed()

    def __await__(self) -> Generator[Any, None, Any]:
        if self._value is PENDING:
            try:
                return (yield self)
            except BaseException:
                # The error thrown in here is this future's value, and its traceback holds this
                # frame: without ``self`` the frame no longer holds the error, so the error, its
                # traceback and their frames are freed by reference counting, not by the cycle
                # collector (a failed call's garbage).
                del self
                raise
        if self._ok:
            return self._value
        raise self._value


class _RuntimeFuture(SimFuture):
    """A :class:`SimFuture` made by the runtime (:meth:`SimPyRuntime.create_future`, a task's done
    future): the same future, built without a Python ``__init__`` to run (see :class:`_Sleep`)."""

    __init__ = object.__init__  # type: ignore[assignment]


def _new_future(env: simpy.Environment) -> SimFuture:
    """A pending :class:`SimFuture` on ``env``: ``simpy.Event.__init__``, inlined, and ``_value``
    set to ``PENDING`` on the instance (the class's default, which ``simpy.Event`` leaves to the
    class: set here, every future's attributes have one layout, which 3.11 reads faster: +0.6%
    instructions per M/M/c customer without it)."""
    future = _RuntimeFuture()
    future.env = env
    future.callbacks = []
    future._value = PENDING
    return future


class _Sleep(simpy.Timeout):
    """A SimPy timeout that a coroutine can await directly; made by :func:`_new_sleep`."""

    # No __init__ of its own to run: _new_sleep fills one in (one is made per sleep, and a class
    # call that runs a Python __init__ costs a frame more than a function that fills an empty object)
    __init__ = object.__init__  # type: ignore[assignment]

    def __await__(self) -> Iterator[Any]:
        # yields itself once, like ``yield self`` but without a generator frame to create and resume
        # (a sleep resumes with None; an exception thrown in is raised in the awaiting coroutine)
        return iter((self,))


def _new_sleep(env: simpy.Environment, delay: float) -> _Sleep:
    """A :class:`_Sleep` of ``delay`` (already clamped to >= 0) scheduled on ``env``:
    ``simpy.Timeout.__init__``, inlined."""
    sleep = _Sleep()
    sleep.env = env
    sleep.callbacks = []
    sleep._value = None
    sleep._delay = delay
    sleep._ok = True
    if type(env) is _Environment:  # env.schedule(sleep, NORMAL, delay), inlined (see _Environment)
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), sleep))
    else:
        env.schedule(sleep, NORMAL, delay)
    return sleep


class _ScheduledCall:
    """A callback run when SimPy pops this event (:meth:`SimPyRuntime.call_soon` / ``call_later``).

    An event of its own, not a coroutine: a lane's dispatcher woken this way costs a third of
    what resuming a waiting coroutine does. It has only what the SimPy loop reads of an event
    (``callbacks``, ``_ok``), in slots: one is made per wake-up. ``cancel`` leaves it on the heap
    (SimPy cannot unschedule an event) but empties it."""

    __slots__ = ("_callback", "_defused", "_name", "_ok", "_rt", "_value", "callbacks")

    callbacks: list[Callable[[Any], None]] | None
    _callback: Callable[[], None] | None
    # made by _schedule_call, which fills it in: no Python __init__ to run per wake-up (see _Sleep)
    __init__ = object.__init__  # type: ignore[assignment]

    def cancel(self) -> None:
        self._callback = None

    def _run(self, _event: Any) -> None:
        callback, self._callback = self._callback, None
        if callback is None:
            return
        try:
            callback()
        except Exception as error:  # reported like a failed task nobody awaits; the run goes on
            self._rt.task_errors.append((self._name, error))
        finally:
            # an error raised under the callback keeps this frame in its traceback: without the
            # callback (which may hold that error's future) the frame leads back to nothing
            callback = None


def _schedule_call(
    rt: SimPyRuntime, delay: float, callback: Callable[[], None], name: str | None
) -> _ScheduledCall:
    """A :class:`_ScheduledCall` of ``callback``, scheduled ``delay`` (>= 0) from now on ``rt``'s env."""
    call = _ScheduledCall()
    call.callbacks = [call._run]
    call._value = None
    call._ok = True
    call._rt = rt
    call._callback = callback
    call._name = name
    env = rt.env
    ready = rt._ready
    if ready is not None and delay == 0:  # run() drives a plain environment: this instant's line
        ready.append((env._now, NORMAL, next(env._eid), call))
    elif type(env) is _Environment:  # env.schedule(call, NORMAL, delay), inlined (see _Environment)
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), call))
    else:
        env.schedule(call, NORMAL, delay)  # type: ignore[arg-type]
    return call


class _Outcome:
    """A triggered event reduced to what the SimPy loop and :meth:`SimTask._resume` read of one
    (``callbacks``, ``_ok``, ``_value``): a step no event delivers (a cancellation, a deadline's
    marker). Slots and no ``simpy.Event.__init__``. (A task's first step needs none: the task is
    its own first event.)"""

    __slots__ = ("_defused", "_ok", "_value", "callbacks")

    def __init__(self, ok: bool, value: Any, callbacks: list[Callable[[Any], None]] | None = None) -> None:
        self._ok = ok
        self._value = value
        self.callbacks = callbacks


class SimTask:
    """Drives one coroutine on the environment; awaitable and cancellable like an asyncio Task."""

    __slots__ = (
        "_cancel_pending",
        "_cancel_requests",
        "_coro",
        "_deadlines",
        "_done",
        "_ended",
        "_ok",
        "_outcome",
        "_rt",
        "_value",
        "_waiting",
        "callbacks",
        "name",
    )

    _done: SimFuture | None
    _ended: bool | None
    _outcome: Any
    _deadlines: list[_Deadline]
    callbacks: list[Callable[[Any], None]] | None
    _waiting: simpy.Event | _Outcome | SimTask | None

    def __init__(self, rt: SimPyRuntime, coro: Coroutine[Any, Any, Any], name: str | None) -> None:
        _start_task(self, rt, coro, name)

    # -- driving -------------------------------------------------------------------------
    def _resume(self, event: simpy.Event) -> None:
        """Step the coroutine with ``event``'s outcome (the callback of whatever it awaits)."""
        if event is not self._waiting:
            return  # stale wake-up from an await that was abandoned by cancellation
        self._waiting = None
        rt = self._rt
        outer, rt.current_task = rt.current_task, self
        try:
            if event._ok:
                yielded = self._coro.send(event._value)
            else:
                event._defused = True
                yielded = self._coro.throw(event._value)
        except StopIteration as stop:
            self._end(True, stop.value)
            return
        except Cancelled as cancelled:
            self._end(False, cancelled)
            return
        except (KeyboardInterrupt, SystemExit) as stop:  # the process stops (Ctrl-C): out of run(), as
            self._end(False, stop)  # asyncio's tasks let them out of the loop; not a task's error
            raise
        except BaseException as error:
            if self._done is None or not self._done.callbacks:  # nobody waits: do not lose the error
                self._rt.task_errors.append((self.name, error))
            self._end(False, error)
            return
        finally:
            rt.current_task = outer
        if not isinstance(yielded, _Event):
            # awaited something of another event loop (asyncio.sleep, an asyncio future): the error
            # is thrown in at that await in a later event, as asyncio throws "Task got bad yield",
            # so the code that awaited it fails like any call (a provider's attempt fails and frees
            # its slot) instead of the task dying where no one looks
            error = TypeError(f"SimPy runtime cannot await {yielded!r}; await runtime primitives only")
            self._resume_later(False, error)
            return
        self._waiting = yielded
        callbacks = yielded.callbacks
        if callbacks is not None:
            callbacks.append(self._resume)
        else:  # already processed: resume in a fresh event at the current time
            self._resume_later(yielded._ok, yielded._value)

    def _resume_later(self, ok: bool, value: Any) -> None:
        """Resume the coroutine in a fresh event at the current time: ``value`` sent (``ok``) or thrown."""
        again = simpy.Event(self._rt.env)
        self._waiting = again
        again.callbacks.append(self._resume)
        again._ok = ok
        again._value = value
        if not ok:
            again._defused = True
        self._rt.env.schedule(again)

    def _end(self, ok: bool, value: Any) -> None:
        """The coroutine returned ``value`` (``ok``) or raised it: the task is done."""
        self._ended = ok
        self._outcome = value
        done = self._done
        if done is not None:
            if ok:
                done.set_result(value)
            else:
                done.set_exception(value)

    def _done_future(self) -> SimFuture:
        """The future that resolves with the task's outcome, made on first use: most tasks (a
        scheduler's runners) are only ever cancelled, never awaited, and a future each that
        nobody reads was one more event object per task."""
        done = self._done
        if done is None:
            done = self._done = _new_future(self._rt.env)
            if self._ended is not None:  # already over: resolved at once, as it was when it ended
                if self._ended:
                    done.set_result(self._outcome)
                else:
                    done.set_exception(self._outcome)
        return done

    def _step(self, value: Any, exc: BaseException | None) -> None:
        """Step the coroutine now with ``value`` sent or ``exc`` thrown (not from an event it awaited)."""
        wakeup = _Outcome(exc is None, value if exc is None else exc)
        self._waiting = wakeup
        self._resume(wakeup)  # type: ignore[arg-type]

    def _deliver_cancel(self, _event: simpy.Event) -> None:
        if self._ended is not None or not self._cancel_pending:
            return
        self._cancel_pending = False
        self._waiting = None
        if getattr(self._coro, "cr_frame", self) is None:  # closed by cancel() before its first step
            self._end(False, Cancelled())
            return
        deadlines = self._deadlines
        if deadlines and deadlines[-1].future_wait and deadlines[-1].owns_timeout():
            # The task waits on a future in ``_wait_for_future`` (its innermost open deadline, and
            # that function's only await) and this cancellation is that deadline's own timeout:
            # resume it with a marker instead of throwing ``Cancelled`` through every frame only to
            # have it caught there. Same instant, same event, same outcome (a dispatcher's timed
            # wait that expires: the common case of a quota-limited lane).
            self._step(_TIMED_OUT, None)
            return
        self._step(None, Cancelled())

    # -- public API ----------------------------------------------------------------------
    def cancel(self) -> bool:
        """Ask the coroutine to stop: :class:`Cancelled` is thrown at its current await.

        A task that has not taken its first step never runs (as an asyncio Task cancelled that
        early), and its coroutine is closed right here: the run may end before the cancellation
        is delivered, and an unstarted coroutine left to the garbage collector dies with only a
        "was never awaited" warning. The task is still done, cancelled, at the delivery.
        """
        if self._ended is not None:
            return False
        self._cancel_requests += 1
        # not started: its own first event is what it waits for (a coroutine-state test would miss
        # awaitables that are not CoroutineType)
        if self._waiting is self:
            self._coro.close()
        self._request_cancel()
        return True

    def _request_cancel(self) -> None:
        if not self._cancel_pending:
            self._cancel_pending = True
            self._waiting = None  # whatever it awaited stays pending (SimPy cannot unschedule it)
            soon = simpy.Event(self._rt.env)
            soon.callbacks.append(self._deliver_cancel)
            soon._ok = True
            soon._value = None
            self._rt.env.schedule(soon)

    def done(self) -> bool:
        return self._ended is not None

    def cancelled(self) -> bool:
        return self._ended is False and isinstance(self._outcome, Cancelled)

    def result(self) -> Any:
        if self._ended is None:
            raise InvalidStateError("result is not ready")
        if self._ended:
            return self._outcome
        raise self._outcome

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._done_future().add_done_callback(lambda _ev: fn(self))

    def __await__(self) -> Generator[Any, None, Any]:
        return self._done_future().__await__()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<SimTask {self.name or ''} {state}>"


class _SpawnedTask(SimTask):
    """A :class:`SimTask` made by :meth:`SimPyRuntime.spawn`: the same task, built by calling the
    class without a Python ``__init__`` (then :func:`_start_task`), which costs less than a class
    call that runs one (a task per call of a simulation; see :class:`_Sleep`)."""

    __slots__ = ()
    __init__ = object.__init__  # type: ignore[assignment]


def _start_task(task: SimTask, rt: SimPyRuntime, coro: Coroutine[Any, Any, Any], name: str | None) -> None:
    """Fill in a new ``task`` and schedule its first step at the current instant."""
    task._rt = rt
    task._coro = coro
    task.name = name
    task._done = None  # made when first asked for (_done_future): rarely
    task._ended = None  # None while running; then True (returned) or False (raised)
    task._outcome = None  # what it returned or raised
    task._cancel_pending = False
    task._cancel_requests = 0  # calls of the public cancel(); a wait_for deadline is not one
    task._deadlines = []  # the wait_for deadlines open in this task, outermost first
    # The task is its own first event (what the SimPy loop reads of one: ``callbacks``, ``_ok``,
    # ``_value``): one object less per task than a separate start event.
    task.callbacks = [task._resume]
    task._ok = True
    task._value = None
    task._waiting = task
    env = rt.env
    ready = rt._ready
    if ready is not None:  # run() drives a plain environment: its line of this instant's events
        ready.append((env._now, NORMAL, next(env._eid), task))
    elif type(env) is _Environment:  # env.schedule(task), inlined (see _Environment)
        heappush(env._queue, (env._now, NORMAL, next(env._eid), task))
    else:
        env.schedule(task)  # type: ignore[arg-type]


_TIMED_OUT: Any = object()
"""Sent into a task whose ``_wait_for_future`` deadline expired (see :meth:`SimTask._deliver_cancel`)."""


class _Deadline:
    """The timer of one ``wait_for``: cancels the awaiting task if still armed."""

    __slots__ = ("armed", "cancel_requests", "expired", "future_wait", "task")

    task: SimTask | None
    """The task it cancels; ``None`` once closed (the wheel may hold a closed deadline until its
    timer fires, up to a whole timeout later: it must not keep a finished task alive)."""
    armed: bool
    expired: bool
    cancel_requests: int
    """The task's count of public cancellations when the deadline was opened."""
    future_wait: bool
    """True for the deadline of ``_wait_for_future``, which can take its timeout as a marker."""

    # filled in by SimPyRuntime._open_deadline, its only maker: no Python __init__ per call (see _Sleep)
    __init__ = object.__init__  # type: ignore[assignment]

    def expire(self, _event: Any) -> None:
        task = self.task
        if self.armed and task is not None and task._ended is None:
            self.expired = True
            task._request_cancel()

    def owns_timeout(self) -> bool:
        """Whether the cancellation that reached this ``wait_for`` is its own timeout.

        Not when the task was cancelled from outside since, and not when an enclosing ``wait_for``
        of the same task expired too (deadlines at the same instant): the one cancellation must
        then reach the outer one, or code between the two that handles the inner timeout (a
        ``Signal.wait`` returning False) would keep running past the outer deadline.
        """
        task = self.task
        if task is None or not self.expired or task._cancel_requests != self.cancel_requests:
            return False
        for outer in task._deadlines:
            if outer is self:
                return True
            if outer.expired:
                return False
        return True


def _close_deadline(deadline: _Deadline) -> None:
    """Disarm ``deadline`` (the wheel drops it lazily) and forget it in its task, and the task in it."""
    deadline.armed = False
    task = deadline.task
    if task is not None:
        task._deadlines.remove(deadline)
        deadline.task = None


class _DeadlineWheel:
    """All ``wait_for`` deadlines of a runtime behind one SimPy timer.

    A provider call's attempt timeout almost never fires: the call ends long before. Giving every
    call its own SimPy timeout put one extra event per attempt on the heap (a fifth of all events in
    a typical run). The wheel keeps deadlines of its own and one timer armed for the earliest
    deadline still armed; disarmed deadlines are dropped when the timer fires.

    Deadlines are kept in two sorted stores that :meth:`_first` merges by ``(when, seq)``: a FIFO
    for deadlines that come no earlier than the last one appended to it (the common case: one
    attempt timeout for every call, so each new deadline is the latest; an O(1) append) and a heap
    for the others. Expiry order is the same as with one heap.
    """

    __slots__ = ("_env", "_heap", "_seq", "_tail", "_tail_when", "_timer", "_timer_at")

    def __init__(self, env: simpy.Environment) -> None:
        self._env = env
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._tail: deque[tuple[float, int, _Deadline]] = deque()
        self._tail_when = -inf
        self._seq = 0
        self._timer: _Sleep | None = None
        self._timer_at = inf

    def add(self, when: float, deadline: _Deadline) -> None:
        self._seq += 1
        if when >= self._tail_when:
            self._tail.append((when, self._seq, deadline))
            self._tail_when = when
        else:
            heappush(self._heap, (when, self._seq, deadline))
        if when < self._timer_at:
            self._arm(when)

    def _first(self) -> tuple[float, int, _Deadline] | None:
        """The earliest entry by ``(when, seq)``, left in place (``None`` when there is none)."""
        heap, tail = self._heap, self._tail
        if not tail:
            return heap[0] if heap else None
        if heap and heap[0][:2] < tail[0][:2]:
            return heap[0]
        return tail[0]

    def _pop_first(self) -> tuple[float, int, _Deadline]:
        heap, tail = self._heap, self._tail
        if tail and not (heap and heap[0][:2] < tail[0][:2]):
            return tail.popleft()
        return heappop(heap)

    def _arm(self, when: float) -> None:
        now = self._env._now
        wait = when - now
        while wait > 0 and now + wait < when:  # make sure the timer fires at or after ``when``
            wait = nextafter(wait, inf)
        timer = _new_sleep(self._env, wait if wait > 0 else 0)
        timer.callbacks.append(self._fire)
        self._timer, self._timer_at = timer, when

    def _fire(self, event: Any) -> None:
        if event is not self._timer:
            return  # superseded by an earlier deadline's timer
        self._timer, self._timer_at = None, inf
        now = self._env._now
        first = self._first()
        while first is not None and (first[0] <= now or not first[2].armed):
            _, _, deadline = self._pop_first()
            if deadline.armed:
                deadline.expire(None)
            first = self._first()
        if first is not None:
            self._arm(first[0])


def _deadlock(env: simpy.Environment) -> SimulationDeadlock:
    """What :meth:`SimPyRuntime.run` raises when its main task waits and no event is left."""
    return SimulationDeadlock(f"main task still waiting at t={env.now:g} but no event is scheduled")


def _raise_undefused(event: Any) -> NoReturn:
    """A failed event nobody defused crashes the run, exactly as in ``simpy.Environment.step``."""
    exc = type(event._value)(*event._value.args)
    exc.__cause__ = event._value
    raise exc


class SimPyRuntime:
    """Runs scheduler coroutines in virtual time on a ``simpy.Environment``."""

    # slots: the scheduler reads the runtime's attributes on every step, and an attribute in a slot
    # is read without the instance-dict lookup (an instance may still take attributes of its own)
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_deadlines",
        "_ready",
        "_running",
        "current_task",
        "env",
        "task_errors",
    )

    def __init__(self, env: simpy.Environment | None = None) -> None:
        self.env = env if env is not None else simpy.Environment()
        self.current_task: SimTask | None = None
        """The task whose coroutine is being stepped right now (``None`` between steps)."""
        self._deadlines = _DeadlineWheel(self.env)
        self.task_errors: list[tuple[str | None, BaseException]] = []
        """Exceptions that ended spawned tasks nobody was awaiting (cancellation excluded)."""
        self._running = False  # run() is driving the environment (it cannot be nested)
        self._ready: deque[tuple[float, int, int, Any]] | None = None
        """While :meth:`run` drives a ``simpy.Environment`` (not a subclass): the events scheduled
        for the current instant by :meth:`spawn` and :meth:`call_soon` (see :meth:`_run_until`);
        else ``None``."""

    def now(self) -> float:
        return self.env._now

    def sleep(self, seconds: float) -> Awaitable[None]:
        return _new_sleep(self.env, seconds if seconds > 0 else 0)

    def create_future(self) -> SimFuture:
        return _new_future(self.env)

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> SimTask:
        task = _SpawnedTask()
        _start_task(task, self, coro, name)
        return task

    def cancelling(self) -> bool:
        task = self.current_task
        return task is not None and task._cancel_requests > 0

    def call_soon(self, callback: Callable[[], None], *, name: str | None = None) -> None:
        """Run ``callback()`` in an event of its own at the current instant, after those already
        scheduled for it; an exception it raises goes to :attr:`task_errors` under ``name``."""
        _schedule_call(self, 0, callback, name)

    def call_later(
        self, delay: float, callback: Callable[[], None], *, name: str | None = None
    ) -> _ScheduledCall:
        """Run ``callback()`` ``delay`` virtual seconds from now unless the returned call is cancelled."""
        return _schedule_call(self, delay if delay > 0 else 0, callback, name)

    def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> Awaitable[T]:
        """Like ``asyncio.wait_for``: on timeout the inner work is cancelled and ``TimeoutError`` raised.

        A coroutine or a future is awaited inside the awaiting task under a deadline (no child
        task, no timer of its own); a task is awaited until it finishes or the timeout passes,
        and is then cancelled, as is a future that timed out.
        """
        if timeout is None:
            return awaitable
        if type(awaitable) is CoroutineType:  # a provider call: the hot case, checked first
            return self._wait_for_coroutine(awaitable, timeout)
        if isinstance(awaitable, SimFuture) and self.current_task is not None:
            return self._wait_for_future(awaitable, timeout)
        if isinstance(awaitable, SimFuture | SimTask):
            return self._wait_for_event(awaitable, timeout)
        return self._wait_for_coroutine(awaitable, timeout)  # type: ignore[arg-type]

    async def _wait_for_coroutine(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        task = self.current_task
        if task is None:  # not driven by a SimTask (a coroutine stepped by hand): use a child task
            return await self._wait_for_event(self.spawn(coro, name="wait_for"), timeout)
        deadline = self._open_deadline(task, timeout)
        try:
            result = await coro
        except BaseException as error:
            if deadline.owns_timeout():
                # the timeout wins over whatever the cancelled work raised on its way out
                cause = None if isinstance(error, Cancelled) else error
                raise DeadlineExceeded(f"timed out after {timeout:g} s (virtual)") from cause
            raise  # the work's own outcome, or a cancel from outside or for an outer deadline
        finally:
            _close_deadline(deadline)
        if deadline.expired:  # the inner work swallowed the cancellation: the timeout still wins
            raise DeadlineExceeded(f"timed out after {timeout:g} s (virtual)")
        return result

    def _open_deadline(self, task: SimTask, timeout: float, *, future_wait: bool = False) -> _Deadline:
        """Arm a deadline for ``task`` on the wheel and note it among the task's open ones."""
        deadline = _Deadline()
        deadline.task = task
        deadline.armed = True
        deadline.expired = False
        deadline.cancel_requests = task._cancel_requests
        deadline.future_wait = future_wait
        self._deadlines.add(self.env._now + (timeout if timeout > 0 else 0), deadline)
        task._deadlines.append(deadline)
        return deadline

    async def _wait_for_future(self, future: SimFuture, timeout: float) -> Any:
        """A future under a deadline of the wheel: a dispatcher's timed wait that is usually
        woken by a notify long before its deadline costs no timer event of its own."""
        task = self.current_task
        assert task is not None
        if future._value is not PENDING:
            return future.result()
        deadline = self._open_deadline(task, timeout, future_wait=True)
        try:
            result = await future
        except Cancelled:
            if not deadline.owns_timeout():
                raise  # the future was cancelled, or the task was, or an outer deadline expired
            result = _TIMED_OUT
        finally:
            _close_deadline(deadline)
        if result is _TIMED_OUT:  # our deadline expired (thrown as Cancelled or sent as the marker)
            if future._value is not PENDING and not future.cancelled():
                return future.result()  # resolved at the deadline's instant: the result wins
            callbacks = future.callbacks
            if callbacks is not None and task._resume in callbacks:
                # this task stopped waiting on it: no stale wake-up event for the cancellation
                callbacks.remove(task._resume)
            future.cancel()
            raise DeadlineExceeded(f"timed out after {timeout:g} s (virtual)")
        return result

    async def _wait_for_event(self, awaitable: SimFuture | SimTask, timeout: float) -> Any:
        child: SimTask | None = None
        if isinstance(awaitable, SimFuture):
            target = awaitable
        else:
            child, target = awaitable, awaitable._done_future()
        if target._value is not PENDING:
            return target.result()
        gate = _new_future(self.env)

        def _open(finished: bool) -> Callable[[Any], None]:
            def callback(_event: Any) -> None:
                if gate._value is PENDING:
                    gate.set_result(finished)

            return callback

        target.callbacks.append(_open(True))
        _new_sleep(self.env, timeout if timeout > 0 else 0).callbacks.append(_open(False))
        try:
            finished = await gate
        except Cancelled:
            if child is not None:
                child.cancel()
            raise
        if finished:
            return target.result()
        if child is not None:
            child.cancel()
            try:
                await child
            except BaseException:  # the child's own outcome is superseded by the timeout
                pass
        else:
            target.cancel()
        raise DeadlineExceeded(f"timed out after {timeout:g} s (virtual)")

    def run(self, coro: Coroutine[Any, Any, T], *, until: float | None = None) -> T:
        """Run ``coro`` as the main task until it finishes and return its result.

        Stops when the main task is done, not when the event heap is empty (timers that
        nobody awaits any more may still be scheduled). With ``until``, stops at that
        virtual time at the latest and cancels the main task. Raises
        :class:`RuntimeAlreadyRunningError` when called while this runtime runs (and closes ``coro``).
        """
        if self._running:
            coro.close()
            raise RuntimeAlreadyRunningError(
                "SimPyRuntime.run() called while this runtime is already running (from one of its tasks "
                "or callbacks); await the coroutine there instead, or spawn it"
            )
        self._running = True
        try:
            return self._run_main(coro, until)
        finally:
            self._running = False

    def _run_main(self, coro: Coroutine[Any, Any, T], until: float | None) -> T:
        main = self.spawn(coro, name="main")
        env = self.env
        done = main._done_future()
        horizon = inf if until is None else until
        if type(env).step is simpy.Environment.step:
            self._run_until(env, main, done, horizon)
            return main.result()
        queue = env._queue  # an Environment subclass (e.g. real time) keeps its own step
        while done._value is PENDING:
            if not queue:
                raise _deadlock(env)
            if queue[0][0] > horizon:
                env._now = max(env._now, horizon)
                main.cancel()
                horizon = inf
                continue
            env.step()
        return main.result()

    def _run_until(self, env: simpy.Environment, main: SimTask, done: SimFuture, horizon: float) -> None:
        """:meth:`run`'s loop for a plain environment: ``simpy.Environment.step`` inlined.

        The events :meth:`spawn` and :meth:`call_soon` schedule for the current instant (a task's
        first step, a dispatcher's wake-up: half of a simulated call's events) wait in a line of
        their own, not on the heap, where each went to the top and back down (~8 tuple comparisons).
        Their keys are those ``env.schedule`` gives, all for the current instant and in the order
        made, so the loop takes events in exactly the heap's order: the line's first unless the
        heap's top has a smaller key. Left over when the run ends, they go on the heap.

        ``horizon`` (``inf`` without ``until``) is checked on each event taken from the heap (the
        line holds only events of the current instant, never past it): an event later than the
        horizon goes back on the heap as it was (the same key: nothing reorders) and the main task
        is cancelled at the horizon, as :meth:`run` promises."""
        queue = env._queue
        ready: deque[tuple[float, int, int, Any]] = deque()
        # the line only for SimPy's own class: a subclass may override schedule() (to trace, say)
        self._ready = ready if type(env) is _Environment else None
        try:
            while done._value is PENDING:
                if ready and (not queue or (top := queue[0])[0] > env._now or top > ready[0]):
                    event = ready.popleft()[3]
                else:
                    try:
                        at, priority, eid, event = heappop(queue)
                    except IndexError:
                        raise _deadlock(env) from None
                    if at > horizon:
                        heappush(queue, (at, priority, eid, event))
                        env._now = max(env._now, horizon)
                        main.cancel()
                        horizon = inf
                        continue
                    env._now = at
                callbacks, event.callbacks = event.callbacks, None
                for callback in callbacks:
                    callback(event)
                if not event._ok and not hasattr(event, "_defused"):
                    _raise_undefused(event)
        finally:
            self._hand_back(ready)

    def _hand_back(self, ready: deque[tuple[float, int, int, Any]]) -> None:
        """The run is over: events still in the line go on the heap with their keys, where
        whatever drives the environment next finds them."""
        self._ready = None
        queue = self.env._queue
        for entry in ready:
            heappush(queue, entry)
