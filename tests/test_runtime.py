"""Runtime protocol semantics, identical on asyncio and on the SimPy driver."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import simpy

from aiqsim.runtime import (
    Cancelled,
    Lock,
    Queue,
    RuntimeAlreadyRunningError,
    Signal,
    SimPyRuntime,
    SimulationDeadlock,
)
from tests.cyclic_garbage import cyclic_garbage
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, make_runtime, run_on

both = pytest.mark.parametrize("rt_name", RUNTIMES)


class Marker(Exception):
    def __init__(self, a: int, b: int) -> None:  # two-arg init: SimPy's Process would fail to re-create it
        super().__init__(a)
        self.b = b


@both
def test_sleep_advances_the_clock(rt_name: str) -> None:
    async def body(rt):
        t0 = rt.now()
        await rt.sleep(2.5)
        return rt.now() - t0

    elapsed = run_on(rt_name, body)
    if rt_name == "simpy":
        assert elapsed == 2.5
    else:
        assert 2.5 <= elapsed < 2.5 + ASYNCIO_LATENESS_S


@both
def test_future_delivers_the_original_exception_object(rt_name: str) -> None:
    async def body(rt):
        future = rt.create_future()
        error = Marker(1, 2)

        async def fail_later():
            await rt.sleep(1)
            future.set_exception(error)

        rt.spawn(fail_later())
        try:
            await future
        except Marker as caught:
            return caught is error, caught.b
        return False, None

    assert run_on(rt_name, body) == (True, 2)


@both
def test_task_result_and_exception(rt_name: str) -> None:
    async def body(rt):
        async def ok():
            await rt.sleep(1)
            return 42

        async def bad():
            await rt.sleep(1)
            raise Marker(3, 4)

        good, failing = rt.spawn(ok()), rt.spawn(bad())
        value = await good
        try:
            await failing
        except Marker as caught:
            return value, caught.b
        return value, None

    assert run_on(rt_name, body) == (42, 4)


@both
def test_cancel_is_delivered_at_the_await_and_not_swallowed_by_except_exception(rt_name: str) -> None:
    async def body(rt):
        log = []

        async def worker():
            try:
                await rt.sleep(100)
            except Exception:  # must NOT catch cancellation
                log.append("swallowed")
            except Cancelled:
                log.append("cancelled")
                raise

        handle = rt.spawn(worker())
        await rt.sleep(1)
        assert handle.cancel()
        try:
            await handle
        except Cancelled:
            log.append("awaiter saw cancel")
        return log, handle.cancelled(), rt.now()

    log, cancelled, now = run_on(rt_name, body)
    assert log == ["cancelled", "awaiter saw cancel"]
    assert cancelled
    assert now < 50


@both
def test_cancel_before_start_never_runs_the_body(rt_name: str) -> None:
    async def body(rt):
        ran = []

        async def worker():
            ran.append(True)

        handle = rt.spawn(worker())
        handle.cancel()
        try:
            await handle
        except Cancelled:
            pass
        return ran

    assert run_on(rt_name, body) == []


def test_a_timeout_inside_the_awaited_work_is_its_own_not_the_deadline_of_wait_for() -> None:
    """Before: on asyncio, work whose own ``asyncio.timeout`` fired (an SDK's read timeout) raised
    DeadlineExceeded, 'timed out after 60 s', although 60 s had not passed: Python 3.11 raises
    both timeouts as TimeoutError from a cancellation. The work's own error now passes as is, and
    the deadline of wait_for still says it was the deadline."""
    import asyncio

    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.runtime.protocol import DeadlineExceeded

    rt = AsyncioRuntime()

    async def reads_with_its_own_timeout() -> None:
        async with asyncio.timeout(0.02):
            await asyncio.sleep(10)

    async def body() -> tuple[BaseException, BaseException]:
        with pytest.raises(TimeoutError) as own:
            await rt.wait_for(reads_with_its_own_timeout(), 60.0)
        with pytest.raises(DeadlineExceeded) as deadline:
            await rt.wait_for(asyncio.sleep(10), 0.02)
        return own.value, deadline.value

    own, deadline = asyncio.run(body())
    assert type(own) is TimeoutError and isinstance(own.__cause__, asyncio.CancelledError)
    assert "timed out after 0.02 s" in str(deadline)


@both
@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_the_timeout_wins_over_what_the_cancelled_work_ends_with(rt_name: str, ending: str) -> None:
    """Before: on asyncio, work that caught the deadline's cancellation and returned what it had
    made the attempt succeed with it ('partial'), and a cleanup error on the way out was reported
    instead of the timeout; SimPyRuntime reported the timeout in both cases (review)."""

    async def body(rt):
        async def swallowing() -> str:
            try:
                await rt.sleep(100)
            except Cancelled:
                if ending == "returns":
                    return "partial"
                raise RuntimeError("stream closed while reading") from None
            return "full"

        try:
            outcome = await rt.wait_for(swallowing(), 3)
        except TimeoutError as error:
            return "timed out", type(error.__cause__).__name__
        return "returned", outcome

    said, detail = run_on(rt_name, body)
    assert said == "timed out"
    assert detail == ("NoneType" if ending == "returns" else "RuntimeError")


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_a_deadline_already_passed_still_cancels_the_work_on_asyncio(timeout: float) -> None:
    """Before (7e75624, review): with a timeout <= 0, wait_for cancelled the marking wrapper before
    it ran, so the awaited work was never awaited (a RuntimeWarning, an error in this suite) and a
    wait_readable future never cancelled kept its descriptor registered with the loop."""
    import asyncio
    import socket

    from aiqsim.runtime import AsyncioRuntime

    rt = AsyncioRuntime()

    async def work() -> str:
        await asyncio.sleep(10)
        return "late"

    async def body() -> tuple[int, dict[int, Any]]:
        timeouts = 0
        for awaitable in (work(), rt.wait_readable(reader.fileno())):
            try:
                await rt.wait_for(awaitable, timeout)
            except TimeoutError:
                timeouts += 1
        return timeouts, dict(rt._readers)

    reader, writer = socket.socketpair()
    try:
        assert asyncio.run(body()) == (2, {})
    finally:
        reader.close()
        writer.close()


def test_cancelling_work_that_ends_on_its_own_when_cancelled_logs_nothing() -> None:
    """Before (470e6a1, review): a task cancelled from outside while its provider call returned
    what it had on the way out left asyncio logging 'Task exception was never retrieved' for the
    runtime's internal marker, on every such cancel."""
    import asyncio

    from aiqsim.runtime import AsyncioRuntime

    rt = AsyncioRuntime()
    logged: list[dict[str, Any]] = []

    async def returns_partial() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "partial"
        return "full"

    async def body() -> bool:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: logged.append(context))
        attempt = asyncio.ensure_future(rt.wait_for(returns_partial(), 60.0))
        await asyncio.sleep(0.01)
        attempt.cancel()
        try:
            await attempt
        except asyncio.CancelledError:
            pass
        import gc

        gc.collect()
        await asyncio.sleep(0)
        return attempt.cancelled()

    assert asyncio.run(body()) is True
    assert logged == []


@both
def test_wait_for_times_out_and_cancels_the_inner_work(rt_name: str) -> None:
    async def body(rt):
        seen = []

        async def slow():
            try:
                await rt.sleep(100)  # finishing would be later than any timer's tolerated lateness
            except Cancelled:
                seen.append("inner cancelled")
                raise
            return "late"

        async def fast():
            await rt.sleep(1)
            return "early"

        start = rt.now()
        try:
            await rt.wait_for(slow(), 3)
        except TimeoutError:
            seen.append("timeout")
        timed_out_after = rt.now() - start
        seen.append(await rt.wait_for(fast(), 100))
        return seen, timed_out_after

    seen, timed_out_after = run_on(rt_name, body)
    assert seen == ["inner cancelled", "timeout", "early"]
    if rt_name == "simpy":
        assert timed_out_after == 3
    else:
        assert 3 <= timed_out_after < 3 + ASYNCIO_LATENESS_S


@both
def test_lock_is_fifo_and_a_cancelled_waiter_passes_the_lock_on(rt_name: str) -> None:
    async def body(rt):
        lock = Lock(rt)
        order = []

        async def user(name, hold):
            async with lock:
                order.append(name)
                await rt.sleep(hold)

        await lock.acquire()
        a = rt.spawn(user("a", 1))
        b = rt.spawn(user("b", 1))
        c = rt.spawn(user("c", 1))
        await rt.sleep(0.5)
        lock.release()  # hands the lock to a
        b.cancel()  # b gives up while waiting
        await a
        await c
        try:
            await b
        except Cancelled:
            pass
        return order, lock.locked()

    assert run_on(rt_name, body) == (["a", "c"], False)


@both
def test_lock_granted_then_cancelled_hands_the_lock_on(rt_name: str) -> None:
    async def body(rt):
        lock = Lock(rt)
        await lock.acquire()
        order = []

        async def user(name):
            async with lock:
                order.append(name)

        first = rt.spawn(user("first"))
        second = rt.spawn(user("second"))
        await rt.sleep(1)
        lock.release()  # ownership goes to `first`...
        first.cancel()  # ...which is cancelled before it resumes
        await second
        return order, lock.locked()

    assert run_on(rt_name, body) == (["second"], False)


@both
def test_queue_get_waits_and_cancelled_getters_lose_nothing(rt_name: str) -> None:
    async def body(rt):
        queue = Queue(rt)
        got = []

        async def consumer():
            got.append(await queue.get())

        quitter = rt.spawn(consumer())
        keeper = rt.spawn(consumer())
        await rt.sleep(1)
        quitter.cancel()
        queue.put_nowait("x")
        await keeper
        return got, len(queue)

    assert run_on(rt_name, body) == (["x"], 0)


@both
def test_signal_wait_times_out_or_is_notified(rt_name: str) -> None:
    async def body(rt):
        signal = Signal(rt)
        timed_out = await signal.wait(1)

        async def poke():
            await rt.sleep(1)
            signal.notify()

        rt.spawn(poke())
        notified = await signal.wait(100)  # far beyond the notify, even with a late timer
        return timed_out, notified, rt.now()

    timed_out, notified, now = run_on(rt_name, body)
    assert (timed_out, notified) == (False, True)
    if rt_name == "simpy":
        assert now == 2
    else:
        assert 2 <= now < 2 + ASYNCIO_LATENESS_S


def test_simpy_reports_a_deadlock() -> None:
    runtime = SimPyRuntime()

    async def body():
        await runtime.create_future()

    with pytest.raises(SimulationDeadlock):
        runtime.run(body())


@pytest.mark.parametrize("until", [None, 100.0], ids=["plain loop", "with until"])
def test_simpy_a_failed_event_nobody_defused_stops_the_run_as_simpy_does(until: float | None) -> None:
    """Both of run's loops (the plain one and the one that watches ``until``) treat a raw SimPy
    event that failed with nobody to defuse it as ``simpy.Environment.step`` does: the run stops
    with a copy of the error, the original as its cause, at the event's time."""
    import simpy

    runtime = SimPyRuntime()
    original = ValueError("a raw SimPy event failed")

    async def body():
        fail = lambda _event: simpy.Event(runtime.env).fail(original)  # noqa: E731
        simpy.Timeout(runtime.env, 2.0).callbacks.append(fail)
        await runtime.sleep(5.0)

    with pytest.raises(ValueError, match="a raw SimPy event failed") as raised:
        runtime.run(body(), until=until)
    assert raised.value is not original and raised.value.__cause__ is original
    assert runtime.now() == 2.0


@pytest.mark.parametrize("until", [None, 100.0], ids=["plain loop", "with until"])
def test_simpy_reports_a_deadlock_in_either_loop(until: float | None) -> None:
    runtime = SimPyRuntime()

    async def body():
        await runtime.sleep(3.0)
        await runtime.create_future()

    with pytest.raises(SimulationDeadlock, match="t=3"):
        runtime.run(body(), until=until)


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_run_until_cancels_the_main_task_at_the_horizon(rt_name: str) -> None:
    runtime = make_runtime(rt_name)
    reached, cancelled_at = [], []

    async def forever():
        try:
            while True:
                await runtime.sleep(1.0)
                reached.append(runtime.now())
        except Cancelled:
            cancelled_at.append(runtime.now())
            raise

    with pytest.raises(Cancelled):
        runtime.run(forever(), until=5.5)
    if rt_name == "simpy":
        assert reached == [1, 2, 3, 4, 5] and cancelled_at == [5.5] and runtime.now() == 5.5
    else:
        # Late wake-ups add up from tick to tick (each sleep starts when the last one ended), so
        # a loaded machine may reach fewer ticks; the cancel itself is due at 5.5 on the clock.
        (at,) = cancelled_at
        assert 5.5 <= at < 5.5 + ASYNCIO_LATENESS_S
        assert len(reached) <= 5 and all(b - a >= 1.0 for a, b in itertools.pairwise(reached))


# ---------------------------------------------------------------------------- no coroutine dies silently
def _never_awaited_warnings(run: Callable[[], object]) -> list[str]:
    """The "coroutine ... was never awaited" warnings raised while ``run`` runs and its garbage is freed."""
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
        gc.collect()
    return [str(w.message) for w in caught if "never awaited" in str(w.message)]


@both
def test_a_task_cancelled_before_its_first_step_never_runs_and_leaves_no_coroutine(rt_name: str) -> None:
    """Cancelled before it ran, a task's body never runs, and its coroutine is closed at once: on SimPy
    the run may end before the cancellation is delivered, which left the coroutine to the garbage
    collector ("coroutine ... was never awaited", tests/test_serve.py's warning)."""
    ran: list[str] = []

    async def child() -> None:
        ran.append("child")

    async def body(rt):
        task = rt.spawn(child(), name="child")
        task.cancel()
        return task

    tasks: list[object] = []
    assert _never_awaited_warnings(lambda: tasks.append(run_on(rt_name, body))) == []
    assert ran == []


def test_a_scheduler_closed_before_its_dispatchers_ran_leaves_no_coroutine() -> None:
    """The reported case: a scheduler started and closed in one step of the SimPy run (its dispatcher
    was spawned, never stepped, then cancelled) must not leave a never-awaited ``_dispatch_loop``."""
    from aiqsim import Scheduler
    from aiqsim.stores.memory import MemoryStore
    from tests.fakes import ScriptedProvider

    async def body(rt):
        scheduler = Scheduler(rt, [ScriptedProvider(rt)], store=MemoryStore())
        scheduler.submit("llm", {"input": "a"})
        await scheduler.close()

    assert _never_awaited_warnings(lambda: run_on("simpy", body)) == []


# ------------------------------------------------------------------ callbacks (call_soon / call_later)


@both
def test_call_soon_runs_after_the_caller_yields_in_order(rt_name: str) -> None:
    async def body(rt):
        ran: list[str] = []
        rt.call_soon(lambda: ran.append("first"))
        rt.call_soon(lambda: ran.append("second"))
        assert ran == []  # never inside the caller
        await rt.sleep(0)
        await rt.sleep(0)
        return ran

    assert run_on(rt_name, body) == ["first", "second"]


@both
def test_call_later_runs_at_its_time_unless_cancelled(rt_name: str) -> None:
    async def body(rt):
        fired: dict[str, float] = {}
        start = rt.now()
        rt.call_later(2.0, lambda: fired.setdefault("kept", rt.now() - start))
        rt.call_later(1.0, lambda: fired.setdefault("cancelled", rt.now() - start)).cancel()
        await rt.sleep(3.0)
        return fired

    fired = run_on(rt_name, body)
    assert set(fired) == {"kept"}
    if rt_name == "simpy":
        assert fired["kept"] == 2.0
    else:
        assert 2.0 <= fired["kept"] < 2.0 + ASYNCIO_LATENESS_S


def test_simpy_call_soon_runs_after_events_already_due_now() -> None:
    """A callback scheduled for this instant runs after what was scheduled for it before (a woken
    coroutine's step), as a resumed coroutine would: deterministic same-instant order."""
    rt = SimPyRuntime()
    order: list[str] = []

    async def spawned():
        order.append("coroutine")  # its first step was scheduled (by spawn) before the callback

    async def body():
        rt.spawn(spawned())
        rt.call_soon(lambda: order.append("callback"))
        await rt.sleep(1)

    rt.run(body())
    assert order == ["coroutine", "callback"]


def test_simpy_a_failing_callback_is_reported_under_its_name_and_the_run_goes_on() -> None:
    rt = SimPyRuntime()

    def broken() -> None:
        raise RuntimeError("sink broke")

    async def body():
        rt.call_soon(broken, name="dispatch-llm")
        await rt.sleep(1)
        return rt.now()

    assert rt.run(body()) == 1
    assert [(name, str(error)) for name, error in rt.task_errors] == [("dispatch-llm", "sink broke")]


def test_an_environment_subclass_gives_the_same_run_as_a_plain_one() -> None:
    """On a plain ``simpy.Environment`` the runtime pushes events on the heap itself and pops them in
    its own loop; a subclass keeps its own ``schedule`` and ``step``. Both must give one run."""
    import simpy

    class CountingEnvironment(simpy.Environment):
        steps = 0

        def step(self) -> None:
            CountingEnvironment.steps += 1
            super().step()

    def trace(rt: SimPyRuntime) -> list[tuple[float, str]]:
        log: list[tuple[float, str]] = []

        async def worker(name: str, delay: float) -> str:
            await rt.sleep(delay)
            log.append((rt.now(), f"{name} woke"))
            return name

        async def slow() -> None:
            await rt.sleep(10)

        async def body() -> None:
            first = rt.spawn(worker("a", 1.5))
            rt.spawn(worker("b", 0.5))
            rt.call_soon(lambda: log.append((rt.now(), "soon")))
            rt.call_later(1.0, lambda: log.append((rt.now(), "later")))
            future = rt.create_future()
            rt.call_later(2.0, lambda: future.set_result("set"))
            name = await first
            log.append((rt.now(), name))
            value = await future
            log.append((rt.now(), value))
            try:
                await rt.wait_for(slow(), 1.0)
            except TimeoutError:
                log.append((rt.now(), "timed out"))

        rt.run(body())
        return log

    plain = trace(SimPyRuntime())
    subclassed = trace(SimPyRuntime(CountingEnvironment()))
    assert CountingEnvironment.steps > 0  # its own step ran
    assert subclassed == plain
    assert plain == [
        (0.0, "soon"),
        (0.5, "b woke"),
        (1.0, "later"),
        (1.5, "a woke"),
        (1.5, "a"),
        (2.0, "set"),
        (3.0, "timed out"),
    ]


def test_a_deadline_the_wheel_still_holds_keeps_no_finished_task_alive() -> None:
    # A call that ends long before its timeout leaves its disarmed deadline on the wheel until the
    # wheel's timer fires, up to a whole timeout later: it must not hold the task (and through it
    # the coroutine and whatever that referenced) all that time.
    rt = SimPyRuntime()

    async def call() -> str:
        await rt.sleep(1.0)
        return "done"

    async def attempt() -> str:
        return await rt.wait_for(call(), 60.0)

    async def main() -> list[str]:
        results = [await rt.spawn(attempt()) for _ in range(3)]
        await rt.sleep(5.0)  # the deadlines (due at 61, 62, 63) are still on the wheel
        return results

    assert rt.run(main()) == ["done"] * 3
    assert rt.now() == 8.0
    held = list(rt._deadlines._tail) + list(rt._deadlines._heap)
    assert len(held) == 3
    assert all(not deadline.armed and deadline.task is None for _, _, deadline in held)


def test_what_the_runtime_builds_is_what_the_public_classes_build() -> None:
    # spawn() and create_future() build their objects without a Python __init__ (a class call that
    # runs one costs more on 3.11): the objects must be the public classes' own, filled alike
    from aiqsim.runtime import SimFuture, SimTask

    rt = SimPyRuntime()
    order: list[str] = []

    async def step(name: str) -> str:
        order.append(name)
        await rt.sleep(1.0)
        return name

    spawned = rt.spawn(step("spawned"), name="a")
    public = SimTask(rt, step("public"), "b")
    assert isinstance(spawned, SimTask) and type(public) is SimTask
    slots = [name for name in SimTask.__slots__ if name not in ("_coro", "_waiting", "callbacks", "name")]
    assert [getattr(spawned, name) for name in slots] == [getattr(public, name) for name in slots]
    future = rt.create_future()
    assert isinstance(future, SimFuture) and not future.done()
    assert future.env is rt.env and future.callbacks == [] and future._value is SimFuture(rt.env)._value

    async def main() -> list[str]:
        return [await spawned, await public, await future]

    rt.call_later(3.0, lambda: future.set_result("future"))
    assert rt.run(main()) == ["spawned", "public", "future"]
    assert order == ["spawned", "public"] and rt.now() == 3.0
    assert repr(spawned) == "<SimTask a done>"


class _SteppedEnvironment(simpy.Environment):
    """A plain environment driven through its own ``step`` (as a subclass with a custom step is):
    every event goes through the heap, which makes it the reference order."""

    def step(self) -> None:
        super().step()


def _same_instant_program(rt: SimPyRuntime, until: float | None = None) -> list[str]:
    """Events of one instant made every way the runtime and SimPy make them, in one log."""
    log: list[str] = []
    env = rt.env

    def process(name: str):  # a raw SimPy process: its start is an URGENT event
        log.append(f"{name} starts")
        yield env.timeout(0)
        log.append(f"{name} after timeout(0)")

    async def child(name: str) -> None:
        log.append(f"{name} runs")
        await rt.sleep(0)
        log.append(f"{name} after sleep(0)")

    async def main() -> list[str]:
        for round_ in range(3):
            rt.spawn(child(f"task{round_}a"))
            rt.call_soon(lambda r=round_: log.append(f"call{r}"))
            env.process(process(f"proc{round_}"))
            rt.spawn(child(f"task{round_}b"))
            future = rt.create_future()
            future.add_done_callback(lambda _f, r=round_: log.append(f"future{r} done"))
            future.set_result(None)
            event = env.event()
            event.callbacks.append(lambda _e, r=round_: log.append(f"event{r}"))
            event.succeed()
            await rt.sleep(0)
            log.append(f"main after round {round_}")
            await rt.sleep(1.0)
        return log

    return rt.run(main(), until=until)


@pytest.mark.parametrize("until", [None, 100.0], ids=["no horizon", "horizon"])
def test_the_line_of_this_instants_events_keeps_the_heaps_order(until: float | None) -> None:
    # run() keeps spawn/call_soon events of the current instant in a line beside the heap; taken
    # together they must come in exactly the order the heap alone gives (with and without a horizon)
    fast = _same_instant_program(SimPyRuntime(), until)
    reference = _same_instant_program(SimPyRuntime(_SteppedEnvironment()), until)
    assert fast == reference
    assert len(fast) == 3 * 10 and fast.index("proc0 starts") < fast.index("task0a runs")


def test_events_still_in_the_line_when_a_run_ends_are_handed_to_the_heap() -> None:
    rt = SimPyRuntime()
    log: list[str] = []

    async def child() -> None:
        log.append("child")

    async def first() -> None:
        rt.spawn(child())  # its first step is due in this instant, after first() has returned
        rt.call_soon(lambda: log.append("call"))

    rt.run(first())
    assert log == [] and rt._ready is None and len(rt.env._queue) == 2
    rt.env.step()  # anything driving the environment next finds them, in order
    rt.env.step()
    assert log == ["child", "call"]


def test_a_run_that_fails_hands_its_line_to_the_heap_too() -> None:
    rt = SimPyRuntime()

    async def boom() -> None:
        rt.call_soon(lambda: None)
        await rt.create_future()  # nothing will resolve it: deadlock once the call has run

    with pytest.raises(SimulationDeadlock):
        rt.run(boom())
    assert rt._ready is None


def test_run_cannot_be_nested_and_says_so() -> None:
    rt = SimPyRuntime()
    seen: list[BaseException] = []

    async def inner() -> str:
        return "inner"

    async def outer() -> str:
        try:
            rt.run(inner())
        except RuntimeAlreadyRunningError as error:
            seen.append(error)
        return await inner()  # what to do instead

    assert rt.run(outer()) == "inner"
    assert len(seen) == 1 and "await the coroutine" in str(seen[0])
    assert rt.run(inner()) == "inner"  # the runtime is usable again once run() returned


def test_an_environment_that_overrides_schedule_still_sees_every_event_scheduled() -> None:
    # the line beside the heap is SimPy's own Environment's: a subclass's schedule() is not bypassed
    class Tracing(simpy.Environment):
        scheduled = 0

        def schedule(self, event, priority=simpy.events.NORMAL, delay=0):  # type: ignore[no-untyped-def]
            Tracing.scheduled += 1
            super().schedule(event, priority, delay)

    rt = SimPyRuntime(Tracing())

    async def child() -> None:
        await rt.sleep(0)

    async def main() -> None:
        for _ in range(3):
            rt.spawn(child())
            rt.call_soon(lambda: None)
        await rt.sleep(1.0)

    rt.run(main())
    assert Tracing.scheduled >= 1 + 3 * 3 + 1  # main's start, 3 x (start, call, child's sleep), main's sleep


def test_simpy_an_await_it_cannot_drive_raises_at_that_await_in_a_later_event() -> None:
    """As asyncio throws "Task got bad yield" into the task: the awaiting code sees the error (and
    may recover), one event later at the same instant; nothing goes to task_errors."""
    rt = SimPyRuntime()

    class Foreign:
        def __await__(self):
            yield "foreign"

    async def body():
        await rt.sleep(2)
        try:
            await Foreign()
        except TypeError as error:
            seen = str(error)
        await rt.sleep(1)
        return seen, rt.now()

    seen, now = rt.run(body())
    assert "cannot await 'foreign'" in seen and now == 3
    assert rt.task_errors == []


def test_wait_readable_watches_a_new_socket_that_took_a_closed_ones_descriptor_number() -> None:
    """A LISTEN connection made again may get the number of the one that was closed while a wait
    on it was registered: the loop must watch the new socket (review: it was never registered, and
    waiters woke only at the safety poll), and a wait that timed out must leave nothing behind."""
    import os
    import socket

    from aiqsim.runtime import AsyncioRuntime

    runtime = AsyncioRuntime()

    async def body() -> dict[int, object]:
        old_reader, old_writer = socket.socketpair()
        number = old_reader.fileno()
        first = runtime.wait_readable(number)  # registered, then its socket goes away
        old_reader.close()
        old_writer.close()
        reader, writer = socket.socketpair()
        duplicate = reader.fileno() != number
        if duplicate:  # the OS gave it another number: put the new socket under the old one anyway
            os.dup2(reader.fileno(), number)
        try:
            second = runtime.wait_readable(number)
            writer.send(b"x")
            await runtime.wait_for(second, 5.0)  # before: never woken (DeadlineExceeded)
            assert first.done()  # type: ignore[attr-defined]
            reader.recv(1)
            with pytest.raises(TimeoutError):
                await runtime.wait_for(runtime.wait_readable(number), 0.05)
            return dict(runtime._readers)
        finally:
            if duplicate:
                os.close(number)
            reader.close()
            writer.close()

    assert runtime.run(body()) == {}  # the timed-out wait took its registration with it


def test_the_works_own_timeout_is_freed_without_the_cycle_collector() -> None:
    """Before: wait_for re-raised the work's own TimeoutError from inside ``except _OwnTimeout``: the
    wrapper became the error's __context__ while holding the error, and the raising frame (in the
    error's traceback) named it. Every provider timeout on asyncio (a cut stream is one) was then
    cyclic garbage. A TimeoutError subclass is used so only the ones made here are counted."""
    import asyncio

    from aiqsim.runtime import AsyncioRuntime

    class ReadTimeout(TimeoutError):
        pass

    rt = AsyncioRuntime()

    async def times_out_by_itself() -> None:
        await asyncio.sleep(0)
        raise ReadTimeout("the work's own read timeout")

    async def body() -> None:
        for _ in range(5):
            try:
                await rt.wait_for(times_out_by_itself(), 60.0)
            except ReadTimeout:
                pass

    _, kept = cyclic_garbage(lambda: asyncio.run(body()), ReadTimeout)
    assert kept == []


@pytest.mark.parametrize("ending", ["fails", "times_out"])
def test_a_failed_or_late_work_is_freed_without_the_cycle_collector(ending: str) -> None:
    """Before: on Python 3.11 the frame of ``asyncio.wait_for`` (in the failure's traceback) held the
    task that held the failure: every attempt that failed under an attempt timeout, and every one
    the deadline ended, was cyclic garbage."""
    import asyncio

    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.runtime.protocol import DeadlineExceeded

    class Refused(Exception):
        pass

    rt = AsyncioRuntime()

    async def work() -> None:
        await asyncio.sleep(0 if ending == "fails" else 10)
        raise Refused("the provider said no")

    async def body() -> int:
        ended = 0
        for _ in range(5):
            try:
                await rt.wait_for(work(), 60.0 if ending == "fails" else 0.001)
            except (Refused, DeadlineExceeded):
                ended += 1
        return ended

    ended, kept = cyclic_garbage(lambda: asyncio.run(body()), (Refused, DeadlineExceeded, asyncio.Task))
    assert ended == 5
    assert kept == []
