"""Running a task: its attempts inside ``running``.

Each attempt is admitted by the gates, sent, and its failure classified (retryable, fatal, poison);
a retry backs off (honouring Retry-After, which may pause the lane) and asks its lane for quota again.
A success's usage is checked and reconciled with the quota. :class:`AttemptLoop` is one of the parts
:class:`~aiqsim.scheduler.scheduler.Scheduler` is made of.
"""

from __future__ import annotations

import math
from dataclasses import replace
from inspect import isawaitable
from types import CoroutineType
from typing import Any

from aiqsim.core.backoff import retry_delay
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    POISON,
    RETRYABLE,
    BilledStreamCutError,
    FirstTokenTimeoutError,
    PoisonInputError,
    ProviderCancelledError,
    ProviderContractError,
    RateLimitError,
    StreamCutError,
    classify_failure,
    describe_error,
    retry_after_of,
)
from aiqsim.core.task import CANCELLED, FAILED, RUNNING, SUCCEEDED
from aiqsim.core.token_bucket import Reservation
from aiqsim.core.usage import sane_usage, usage_bound
from aiqsim.runtime.protocol import Cancelled, DeadlineExceeded
from aiqsim.scheduler.events import LanePaused, UsageAnomaly, new_attempt_record
from aiqsim.scheduler.lanes import Lane
from aiqsim.scheduler.live import LiveTask
from aiqsim.scheduler.provider import ProviderResponse, StreamChunk, honours_idempotency_keys, new_request
from aiqsim.scheduler.rate_limit_scope import RateLimitScope, pauses_lane
from aiqsim.scheduler.retry import (
    GateRefusal,
    RetryPolicy,
    abandon_at_gate,
    ask_gates,
    gate_wait_s,
    rejection_error,
    tell_gates,
)
from aiqsim.scheduler.store_writes import persist
from aiqsim.scheduler.streams import StreamChannel
from aiqsim.stores.base import StoreWriteError


class AttemptLoop:
    """A task's run: its attempts, their failures and retries, gates and usage, inside ``running``."""

    __slots__ = ()

    async def _run(self, lane: Lane, live: LiveTask, reservation: Reservation | None) -> None:
        live.started = True
        runtime = self.runtime
        policy = self.retry if live.retry is None else live.retry
        if live.cancel_requested or live.lost is not None:
            assert reservation is not None
            lane.quota.cancel(reservation, runtime.now())
            self._quota_returned(lane)
            if live.lost is None:
                self._finish(live, CANCELLED)
            return
        if not self._mark_running(lane, live, reservation):
            return
        if self._commit is not None and not await self._running_durable(lane, live, reservation):
            return
        record = live.record
        key = record.key
        attempts = record.attempts
        tries = 0
        previous_delay: float | None = None
        cause: BaseException | None = None
        admitted = False  # a retry the gates admitted before its backoff, not yet sent
        gates_owed = False  # an attempt was sent and the gates have not yet been told how it ended
        try:
            poison = self.store.poison_error(key)
            if poison is not None:
                assert reservation is not None
                lane.quota.cancel(reservation, runtime.now())
                reservation = None
                self._quota_returned(lane)
                await self._fail_poison(
                    live, attempts, PoisonInputError(f"input recorded as poison ({poison})")
                )
                return
            while True:
                if tries and live.last_attempt:  # its job ended while the last call was out: no more
                    if admitted:
                        self._abandon_early(lane.name, record.id)
                        admitted = False
                    self._finish(live, CANCELLED, attempts=attempts)
                    return
                if self.gates:  # the helper owns the reservation until it hands one back
                    held, reservation = reservation, None
                    reservation = await self._wait_for_gates(lane, live, held, tries > 0)
                elif reservation is None:
                    reservation = await self._await_ticket(lane, live)
                attempts += 1
                tries += 1
                is_retry = tries > 1
                if self.gates:  # (without gates nothing below applies: ``admitted`` is never set)
                    asked = self._late_gates if admitted else self.gates
                    refusal = None
                    if asked:
                        tenant = record.tenant
                        estimate = record.cost_estimate
                        refusal = self._gate_refusal(
                            lane.name, is_retry, record.id, cause, asked, estimate=estimate, tenant=tenant
                        )
                    if refusal is not None and admitted:  # not sent after all: the quota gets its charge back
                        self._abandon_early(lane.name, record.id)
                    admitted = False
                    if refusal is not None:
                        lane.quota.cancel(reservation, runtime.now())
                        reservation = None
                        self._quota_returned(lane)
                        error = rejection_error(refusal)
                        self._emit_attempt(
                            live, attempts, runtime.now(), runtime.now(), error, "rejected", None, None
                        )
                        self._finish(live, FAILED, attempts=attempts, error=describe_error(error))
                        return
                # positional, in ProviderRequest's field order (task_id, idempotency_key, kind, payload,
                # cost_estimate, attempt, priority, tenant; tests/test_slot_init.py): keyword calls are
                # slower. The priority is the live record's: a duplicate may have lifted it since the
                # first try.
                request = new_request(
                    record.id, key, record.kind, record.payload, record.cost_estimate, attempts,
                    live.record.priority, record.tenant,
                )  # fmt: skip
                start = runtime.now()
                cut: BaseException | None = None
                live.in_call = True  # the call is sent: its answer is awaited
                gates_owed = True
                try:
                    channel = live.stream
                    if (
                        channel is not None
                        and channel.open
                        and callable(getattr(lane.provider, "stream", None))
                    ):
                        call = self._stream_attempt(lane, live, request, policy, start, channel)
                        timeout = None  # the stream's deadlines are its own (first token, whole attempt)
                    else:
                        call = lane.provider.call(request)
                        if type(call) not in _AWAITABLE_TYPES and not _is_awaitable(call):
                            raise not_awaitable(lane.name, call)
                        timeout = policy.attempt_timeout_s
                    try:
                        if timeout is None:
                            response = await call
                        else:
                            response = await runtime.wait_for(call, timeout)
                    except Cancelled as cancelled:
                        if runtime.cancelling() or self._crashed:
                            raise  # this task's own cancellation
                        raise unasked_cancellation(lane.name) from cancelled
                    except DeadlineExceeded as late:  # the attempt timeout, not the provider's own
                        raise attempt_timed_out(lane.name, policy.attempt_timeout_s, late) from late
                    if type(response) is not ProviderResponse and not isinstance(response, ProviderResponse):
                        raise broken_contract(lane.name, response)
                except Exception as raised:
                    error = raised  # (not annotated: the compiled build would type it)
                    recovered: ProviderResponse | None = None
                    if isinstance(error, StreamCutError):  # billed: looked up, re-sent only when safe
                        recovered, error = await self._settle_cut(lane, live, error, policy)
                    if recovered is None:
                        live.in_call = False
                        now = runtime.now()
                        lane.quota.release(reservation, now)
                        reservation = None
                        self._quota_returned(lane)
                        failure = classify_failure(error, tries, poison_after=policy.poison_after)
                        retry_after = retry_after_of(error)
                        pause, too_long = policy.retry_after_wait(retry_after)
                        if pause is not None and isinstance(error, RateLimitError):
                            self._pause_for_rate_limit(lane, error, record.id, now, pause, policy)
                        gates_owed = False
                        if self.gates:
                            tell_gates(
                                self.gates, lane.name, is_retry, failure, error, now, task_id=record.id
                            )
                        if too_long:
                            self._emit_attempt(
                                live, attempts, start, now, error, "retry_after_too_long", retry_after, None
                            )
                            message = (
                                f"{describe_error(error)} (Retry-After {retry_after:g} s is longer than "
                                f"max_retry_after_s={policy.max_retry_after_s:g})"
                            )
                            self._finish(live, FAILED, attempts=attempts, error=message)
                            return
                        if failure is RETRYABLE and tries < policy.max_attempts:
                            try:
                                delay = retry_delay(
                                    policy.backoff,
                                    tries - 1,
                                    self.rng,
                                    previous=previous_delay,
                                    retry_after_s=retry_after if policy.honour_retry_after else None,
                                )
                            except ConfigurationError as bad_delay:  # a custom strategy's NaN, inf...
                                # the call that failed is reported as every attempt is; no retry follows
                                self._emit_attempt(
                                    live, attempts, start, now, error, "fatal", retry_after, None
                                )
                                self._finish(live, FAILED, attempts=attempts, error=describe_error(bad_delay))
                                return
                            if self._early_gates:
                                # A retry quota is asked when the retry is decided, before the backoff:
                                # refused (AWS: no retry quota), the task fails now, with no delay. The
                                # other gates are asked just before the retry is sent (see split_gates).
                                refusal = self._gate_refusal(
                                    lane.name, True, record.id, error, self._early_gates
                                )
                                if refusal is not None:
                                    self._emit_attempt(
                                        live, attempts, start, now, error, "retry", retry_after, None
                                    )
                                    rejected = rejection_error(refusal)
                                    attempts += 1
                                    self._emit_attempt(
                                        live, attempts, now, now, rejected, "rejected", None, None
                                    )
                                    self._finish(
                                        live, FAILED, attempts=attempts, error=describe_error(rejected)
                                    )
                                    return
                                admitted = True
                            self._emit_attempt(live, attempts, start, now, error, "retry", retry_after, delay)
                            previous_delay = delay
                            cause = error
                            if live.route is not None:  # a routed task's retry may move (routes.py)
                                lane = await self._reroute(lane, live)
                            if getattr(lane.quota, "paused_until", -math.inf) < now + delay:
                                await runtime.sleep(delay)
                            # else the lane stays paused at least until this retry is due: it waits for
                            # the lane in the retry line (granted no earlier than the pause's end), so
                            # that it goes before queued work when the lane reopens on either runtime
                            # (sleeping instead, on asyncio it raced the lane's own wake-up at that instant)
                            continue
                        decision = "exhausted" if failure is RETRYABLE else failure.value
                        self._emit_attempt(live, attempts, start, now, error, decision, retry_after, None)
                        if failure is POISON:
                            await self._fail_poison(live, attempts, error)
                            return
                        self._finish(live, FAILED, attempts=attempts, error=describe_error(error))
                        return
                    response = recovered  # the cut answer, as the provider kept it
                    cut = error
                live.in_call = False
                now = runtime.now()
                usage = self._charged_usage(lane, live, attempts, response.usage, now)
                quota = lane.quota
                quota.reconcile(reservation, usage, now)
                quota.release(reservation, now)
                reservation = None
                self._quota_returned(lane)
                gates_owed = False
                if self._routes is not None:  # the service time the lowest_latency policy reads
                    self._routes.observe(lane.name, now - start, live.route)
                if self.gates:
                    tell_gates(
                        self.gates, lane.name, is_retry, None, None, now, task_id=record.id, usage=usage
                    )
                if self.events is not None:  # checked here too: no call at all without a sink
                    self._emit_attempt(
                        live, attempts, start, now, cut, "done" if cut is None else "lookup", None, None,
                        usage, response=response,
                    )  # fmt: skip
                lane.rate_limits.record_success(now, policy.adaptive_rule)
                self._finish(live, SUCCEEDED, attempts=attempts, result=response.result)
                return
        except Cancelled:
            if live.in_call:
                for gate in self.gates:
                    abandon_at_gate(gate, lane.name, tries > 1, True, runtime.now(), task_id=record.id)
            elif admitted:  # a retry charged before its backoff and never sent: give the charge back
                self._abandon_early(lane.name, record.id)
            if reservation is not None:
                if live.in_call:  # the call was sent: the provider counts it
                    lane.quota.release(reservation, runtime.now())
                else:  # cancelled in a gate wait: nothing was sent, give it all back
                    lane.quota.cancel(reservation, runtime.now())
                    attempts -= 1
                self._quota_returned(lane)
            if self._crashed:
                raise
            self._finish(live, CANCELLED, attempts=attempts)
        except BaseException as error:
            # Not a provider failure (those are classified above): a gate or an event sink broke, or
            # a provider raised a BaseException that is no Exception. The task must not keep its
            # slot or stay running for ever. KeyboardInterrupt and SystemExit stop the process: the
            # task stays ``running`` in the store, for recover() to reconcile, as after a crash.
            if isinstance(error, GeneratorExit):
                raise  # the coroutine is being closed: no bookkeeping is possible
            if gates_owed:  # e.g. a sink broke between the answer and the gates: a breaker's
                # probe would otherwise hold it half-open for ever
                for gate in reversed(self.gates):
                    abandon_at_gate(gate, lane.name, tries > 1, True, runtime.now(), task_id=record.id)
            if admitted:
                self._abandon_early(lane.name, record.id)
            if reservation is not None:
                lane.quota.release(reservation, runtime.now())
                self._quota_returned(lane)
            if (
                live.record.status.is_terminal
                or self._crashed
                or isinstance(error, KeyboardInterrupt | SystemExit)
            ):
                raise
            self._finish(live, FAILED, attempts=attempts, error=describe_error(error))
        finally:
            live.in_call = False
            # The last failure's traceback holds this frame, which would hold the failure: a cycle
            # only the collector frees, once per retried task (GC time). ``error`` and ``cut`` name
            # the last failure past its ``except`` block (a cut stream is settled outside it).
            cause = error = cut = None  # noqa: F841 (dropping the names is the point)
            if live.stream is not None:  # a cut stream's failure, kept for its reader, frees its frames
                live.stream.drop_cut_tracebacks()

    async def _stream_attempt(
        self,
        lane: Lane,
        live: LiveTask,
        request: Any,
        policy: RetryPolicy,
        start: float,
        channel: StreamChannel,
    ) -> ProviderResponse:
        """One attempt through ``lane.provider.stream(request)``, its chunks pushed into ``channel``.

        Before the first chunk it is an attempt like any other: a failure is raised as the provider
        raised it, and ``first_token_timeout_s`` (or ``attempt_timeout_s``, whichever ends first)
        abandons it. After it, the server has billed the work: any failure, and the whole-attempt
        deadline, end it as :class:`~aiqsim.core.failures.StreamCutError`. Returns the stream's
        closing :class:`ProviderResponse` with ``first_token_s`` measured here (scheduler seconds
        from ``start``)."""
        runtime = self.runtime
        name = lane.name
        items = lane.provider.stream(request)  # type: ignore[attr-defined]
        if not callable(getattr(items, "__anext__", None)):
            raise ProviderContractError(
                f"provider {name!r}: stream() returned {type(items).__name__}, not an async iterator "
                "of StreamChunk items ending with a ProviderResponse (SupportsStreaming)"
            )
        total = policy.attempt_timeout_s
        first_limit = policy.first_token_timeout_s
        if first_limit is None or (total is not None and total < first_limit):
            first_limit = total
        try:
            try:
                first = await (
                    _next_item(items)
                    if first_limit is None
                    else runtime.wait_for(_next_item(items), first_limit)
                )
            except DeadlineExceeded as late:
                if first_limit == policy.first_token_timeout_s:
                    raise FirstTokenTimeoutError(
                        f"provider {name!r}: no first chunk within first_token_timeout_s={first_limit:g}; "
                        "the attempt was abandoned before anything reached the caller (the provider may "
                        "bill it)"
                    ) from late
                raise attempt_timed_out(name, total, late) from late
            if first is _END:
                raise ProviderContractError(
                    f"provider {name!r}: stream() ended without its ProviderResponse (the last item "
                    "must be one)"
                )
            if isinstance(first, ProviderResponse):  # an answer with no chunk at all
                return first
            if not isinstance(first, StreamChunk):
                raise stream_contract(name, first)
            first_at = runtime.now()
            first_token_s = first_at - start
            channel.push(first)
            try:
                if total is None:
                    response = await self._drain(name, items, channel)
                else:
                    remaining = max(0.0, start + total - first_at)
                    response = await runtime.wait_for(self._drain(name, items, channel), remaining)
            except Cancelled:
                raise
            except StreamCutError as cut:
                cut.first_token_s = first_token_s  # type: ignore[attr-defined]
                raise
            # (the cuts below are built in the raise: a local naming one would be held by this frame,
            # which the cut's traceback holds: a cycle)
            except DeadlineExceeded as late:
                raise _stream_cut(
                    f"provider {name!r}: attempt_timeout_s={total:g} passed after {channel.delivered} "
                    "chunk(s) of the stream; the stream was cut (the server billed it)",
                    first_token_s,
                ) from late
            except Exception as broke:  # a provider that raised something else after its first chunk
                raise _stream_cut(
                    f"provider {name!r}: the stream broke after {channel.delivered} chunk(s): "
                    f"{describe_error(broke)} (the server billed it)",
                    first_token_s,
                ) from broke
            channel.complete()
            return replace(response, first_token_s=first_token_s)
        finally:
            closer = getattr(items, "aclose", None)
            if closer is not None:
                try:
                    await closer()
                except Exception:  # the attempt's own outcome stands
                    pass

    async def _drain(self, name: str, items: Any, channel: StreamChannel) -> ProviderResponse:
        """Push the stream's remaining chunks into ``channel``; return its closing response."""
        while True:
            item = await _next_item(items)
            if isinstance(item, StreamChunk):
                channel.push(item)
            elif isinstance(item, ProviderResponse):
                return item
            elif item is _END:
                raise StreamCutError(f"provider {name!r}: the stream ended without its ProviderResponse")
            else:
                raise stream_contract(name, item)

    async def _settle_cut(
        self, lane: Lane, live: LiveTask, cut: StreamCutError, policy: RetryPolicy
    ) -> tuple[ProviderResponse | None, BaseException]:
        """What becomes of a task whose streamed answer was cut once begun (billed): after its first
        chunk, or before it when the provider says the answer had begun (a StreamCutError).

        ``(response, cut)`` when the provider's ``lookup`` has the answer it kept (the task succeeds
        with it, billed once); ``(None, cut)`` when the provider honours idempotency keys (a re-send
        is not billed again: the cut is retried like a timeout); else ``(None, BilledStreamCutError)``
        (fatal: the answer was billed and cut, and is not sent again)."""
        channel = live.stream
        if channel is not None and channel.started:  # (else a re-send may still stream to the reader)
            channel.interrupt(cut)
        provider = lane.provider
        name = lane.name
        lookup = getattr(provider, "lookup", None)
        looked = f"provider {name!r} offers no lookup"
        if callable(lookup):
            try:
                pending = lookup(live.record.key)
                timeout = policy.attempt_timeout_s
                found = await (pending if timeout is None else self.runtime.wait_for(pending, timeout))
            except Cancelled:
                raise
            except Exception as error:
                looked = f"its lookup failed ({describe_error(error)})"
            else:
                if isinstance(found, ProviderResponse):
                    first_token_s = getattr(cut, "first_token_s", None)
                    return replace(found, first_token_s=first_token_s), cut
                looked = "its lookup found no stored answer"
        if honours_idempotency_keys(provider):
            return None, cut
        received = "" if cut.received_units is None else f", {cut.received_units:g} units received"
        billed = BilledStreamCutError(
            f"provider {name!r}: the streamed answer was billed and cut after it began "
            f"({cut}{received}); "
            f"{looked} and the provider does not honour idempotency keys, so it was not sent again "
            "(a second bill); retry the task by hand (retry_failed) if a second bill is acceptable"
        )
        billed.first_token_s = getattr(cut, "first_token_s", None)  # type: ignore[attr-defined]
        return None, billed

    async def _reroute(self, lane: Lane, live: LiveTask) -> Lane:
        """The lane the next attempt of routed task ``live`` goes to, after a retryable failure on
        ``lane``: chosen again by its route's policy among the other deployments when the route has
        ``retry_elsewhere``, else ``lane``. A move is written to the store (the record's
        ``provider``) and made durable before the call is sent, so a restart's recovery asks the
        deployment that was called; a move that could not be persisted is not made."""
        routes = self._routes
        assert routes is not None and live.route is not None
        if not routes.routes[live.route].retry_elsewhere:
            return lane
        runtime = self.runtime
        chosen = routes.choose(live.route, self._lanes, runtime.now(), self.rng, exclude=lane.name)
        if chosen is lane:
            return lane
        old = live.record
        record = old.evolve(provider=chosen.name, updated_at=runtime.now())
        try:
            self._write(record, old)
        except StoreWriteError:
            return lane  # the store still names this deployment: the retry stays on it
        live.record = record
        if self._commit is not None:
            lost = await self._commit.durable()
            if lost is not None:
                live.record = old
                return lane
        return chosen

    def _mark_running(self, lane: Lane, live: LiveTask, reservation: Reservation | None) -> bool:
        """Write ``queued -> running``; no call is sent before it is durable (with a group commit,
        :meth:`_running_durable` waits for that). False when the task must not run
        (:meth:`_not_started`).

        Not a coroutine: with a store that commits every write there is nothing to wait for, and
        a coroutine per task to await was measurable.
        """
        assert reservation is not None
        try:
            self._move(live, RUNNING)
        except (StoreWriteError, Cancelled) as error:
            return self._not_started(lane, live, reservation, error)
        except Exception as error:  # the event sink broke on ``running``: nothing was sent
            self._give_back(lane, reservation)
            self._finish(live, FAILED, error=describe_error(error))
            return False
        return True

    async def _running_durable(self, lane: Lane, live: LiveTask, reservation: Reservation) -> bool:
        """Wait until the group commit has made ``running`` durable; False when the task must not
        run (:meth:`_not_started`)."""
        assert self._commit is not None
        try:
            lost = await self._commit.durable()
            if lost is not None:
                raise lost
        except (StoreWriteError, Cancelled) as error:
            return self._not_started(lane, live, reservation, error)
        return True

    def _not_started(
        self, lane: Lane, live: LiveTask, reservation: Reservation, error: StoreWriteError | Cancelled
    ) -> bool:
        """``running`` could not be made durable: the quota is given back and the task is lost (the
        write or its commit failed) or cancelled (while it waited for the commit). Returns False;
        re-raises a cancellation when the scheduler crashed."""
        self._give_back(lane, reservation)
        if isinstance(error, StoreWriteError):
            self._lose(live, error)
            return False
        if self._crashed:
            raise error
        self._finish(live, CANCELLED)
        return False

    def _give_back(self, lane: Lane, reservation: Reservation) -> None:
        """Give back an unused reservation (nothing was sent) and wake the lane's dispatcher if work waits."""
        lane.quota.cancel(reservation, self.runtime.now())
        self._quota_returned(lane)

    def _charged_usage(self, lane: Lane, live: LiveTask, attempt: int, reported: Any, now: float) -> float:
        """The usage to reconcile for a successful call; a hostile or buggy report is clamped and
        recorded (rule: :func:`aiqsim.core.usage.sane_usage`), never allowed to fail the call."""
        record = live.record
        bound = None if reported is None else usage_bound(lane.quota)  # nothing to bound without a report
        verdict = sane_usage(reported, record.cost_estimate, bound)
        if verdict.anomaly is not None:
            self.anomalies["usage"] += 1
            if self.events is not None:
                self.events(
                    UsageAnomaly(
                        time=now,
                        task_id=record.id,
                        key=record.key,
                        provider=record.provider,
                        attempt=attempt,
                        reported=repr(reported),
                        charged=verdict.usage,
                        reason=verdict.anomaly,
                    )
                )
        return verdict.usage

    def _pause_for_rate_limit(
        self,
        lane: Lane,
        error: BaseException,
        task_id: str,
        now: float,
        pause: float,
        policy: RetryPolicy,
    ) -> None:
        """Pause the whole lane for a 429's Retry-After when the rate-limit scope of ``policy`` (the
        task's own, else the scheduler's) says so.

        The task that saw the 429 waits it out in any case (its retry delay is floored by it).
        """
        scope = policy.rate_limit_scope
        quota_spent = error.quota_spent if isinstance(error, RateLimitError) else None
        looks_spent = lane.rate_limits.record_rate_limit(task_id, now, policy.adaptive_rule)
        if not pauses_lane(scope, quota_spent, looks_spent):
            return
        lane.quota.pause_until(now + pause)
        if self.events is not None:
            if scope is RateLimitScope.LANE:
                reason = "scope=lane"
            else:
                reason = "quota_spent" if quota_spent else "repeated_429s"
            self.events(LanePaused(now, lane.name, lane.quota.paused_until, task_id, reason))

    async def _fail_poison(self, live: LiveTask, attempts: int, error: BaseException) -> None:
        record = live.record
        now = self.runtime.now()
        try:
            persist(
                f"poison record of key {record.key!r} (task {record.id!r})",
                self.store.record_poison,
                record.key,
                describe_error(error),
                now,
            )
        except StoreWriteError as write_error:
            self._lose(live, write_error)
            return
        self._staged(record.id)
        if self.poison_fallback is not None:
            try:
                result = await self.poison_fallback(record)
            except Exception as fallback_error:
                message = f"{describe_error(error)}; fallback failed: {describe_error(fallback_error)}"
                self._finish(live, FAILED, attempts=attempts, error=message)
                return
            self._finish(live, SUCCEEDED, attempts=attempts, result=result)
            return
        self._finish(live, FAILED, attempts=attempts, error=describe_error(error))

    async def _wait_for_gates(
        self, lane: Lane, live: LiveTask, reservation: Reservation | None, is_retry: bool
    ) -> Reservation:
        """Quota for the next attempt, held once no gate asks to wait (``reservation``: what the task
        holds already). A gate's wait is waited out holding no quota: tasks that held theirs through
        it took tokens at the bucket's pace, then all went at once when the gate opened, past the
        bucket and through a lane pause, holding concurrency slots meanwhile."""
        runtime = self.runtime
        try:
            while True:
                wait = self._gate_wait(lane.name, is_retry)
                if wait > 0:
                    if reservation is not None:
                        lane.quota.cancel(reservation, runtime.now())
                        reservation = None
                        self._quota_returned(lane)
                    if is_retry:
                        await runtime.sleep(wait)
                    else:  # a first attempt held back waits as a queued task does: the depth limit counts it
                        task_id = live.record.id
                        self._gate_held.add(task_id)
                        try:
                            await runtime.sleep(wait)
                        finally:
                            self._gate_held.discard(task_id)
                elif reservation is None:
                    reservation = await self._await_ticket(lane, live)  # then ask the gates again
                else:
                    return reservation
        except BaseException:
            if reservation is not None:  # cancelled (or a gate broke) holding it: nothing was sent
                lane.quota.cancel(reservation, runtime.now())
                self._quota_returned(lane)
            raise

    def _gate_wait(self, provider: str, is_retry: bool) -> float:
        """The longest wait any gate asks for before the next attempt (0: none)."""
        if not self.gates:
            return 0.0
        now = self.runtime.now()
        return max((gate_wait_s(gate, provider, is_retry, now) for gate in self.gates), default=0.0)

    def _gate_refusal(
        self,
        provider: str,
        is_retry: bool,
        task_id: str,
        cause: BaseException | None,
        gates: tuple[Any, ...] | None = None,
        *,
        estimate: float | None = None,
        tenant: str | None = None,
    ) -> GateRefusal | None:
        """The first refusal of this attempt by ``gates`` (all by default), or None (:func:`ask_gates`);
        ``estimate`` and ``tenant`` reach the gates that price attempts (a spend budget)."""
        gates = self.gates if gates is None else gates
        if not gates:
            return None
        now = self.runtime.now()
        return ask_gates(
            gates,
            provider,
            is_retry,
            now,
            self.rng,
            task_id=task_id,
            cause=cause,
            estimate=estimate,
            tenant=tenant,
        )

    def _abandon_early(self, provider: str, task_id: str) -> None:
        """Tell the gates that charged a retry before its backoff that it will not be sent."""
        now = self.runtime.now()
        for gate in reversed(self._early_gates):
            abandon_at_gate(gate, provider, True, False, now, task_id=task_id)

    def _emit_attempt(
        self,
        live: LiveTask,
        attempt: int,
        start: float,
        end: float,
        error: BaseException | None,
        decision: str,
        retry_after: float | None,
        delay: float | None,
        usage: float | None = None,
        response: ProviderResponse | None = None,
    ) -> None:
        # positional, in AttemptRecord's field order: this runs once per provider call
        if self.events is not None:
            record = live.record
            seen = response if response is not None else error
            self.events(
                new_attempt_record(
                    record.id,
                    record.key,
                    record.provider,
                    attempt,
                    start,
                    end,
                    "ok" if error is None else type(error).__name__,
                    decision,
                    record.cost_estimate,
                    usage,
                    retry_after,
                    delay,
                    getattr(response, "output_units", None),
                    getattr(seen, "ratelimit", None),
                    getattr(seen, "first_token_s", None),
                    None if response is None else tokens_per_s(response, end - start),
                )
            )


def tokens_per_s(response: ProviderResponse, duration: float) -> float | None:
    """A streamed answer's generation rate: its ``output_units`` over the time from its first token to
    the attempt's end; ``None`` when it was not streamed, said no output units, or took no time."""
    first = response.first_token_s
    units = response.output_units
    if first is None or units is None:
        return None
    generating = duration - first
    return units / generating if generating > 0 else None


def _stream_cut(message: str, first_token_s: float) -> StreamCutError:
    """A :class:`StreamCutError` for a stream that had begun ``first_token_s`` after its start."""
    cut = StreamCutError(message)
    cut.first_token_s = first_token_s  # type: ignore[attr-defined]
    return cut


_END = object()
"""What :func:`_next_item` returns for an exhausted stream."""


async def _next_item(items: Any) -> Any:
    """The stream's next item, or :data:`_END`: a coroutine, which both runtimes' ``wait_for`` take."""
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return _END


def stream_contract(provider: str, item: object) -> ProviderContractError:
    """The error for a stream that yielded ``item``, neither a StreamChunk nor a ProviderResponse."""
    return ProviderContractError(
        f"provider {provider!r}: stream() yielded {type(item).__name__}; expected StreamChunk items and, "
        "last, a ProviderResponse (aiqsim.scheduler.provider.SupportsStreaming)"
    )


def unasked_cancellation(provider: str) -> ProviderCancelledError:
    """The error for a ``call()`` that raised a cancellation the scheduler did not ask for."""
    return ProviderCancelledError(
        f"provider {provider!r} raised a cancellation from call() that nobody requested (a bug in its "
        "adapter or a library under it); the task fails instead of passing for cancelled, and the call "
        "may have been billed"
    )


def broken_contract(provider: str, answer: object) -> ProviderContractError:
    """The error for a ``call()`` that returned ``answer``, which is not a ``ProviderResponse``."""
    return ProviderContractError(
        f"provider {provider!r} returned {type(answer).__name__} from call(), not a ProviderResponse "
        "(aiqsim.scheduler.provider): a bug in its adapter; the call may have been billed"
    )


_AWAITABLE_TYPES: set[type] = {CoroutineType}
"""Types whose every instance can be awaited, as :func:`_is_awaitable` found them: the check runs on
every attempt, and ``inspect.isawaitable`` is five Python-level calls for any awaitable that is not
a native coroutine."""

MAX_AWAITABLE_TYPES = 64
"""Types remembered at most: a program that makes classes as it goes (``unittest.mock`` makes one per
mock) must not grow the set, nor keep those classes alive, for ever."""


def _is_awaitable(answer: object) -> bool:
    """``inspect.isawaitable(answer)``, remembering the type when that answers for every instance
    of it: a class that defines ``__await__`` itself and that the object does not disguise (a proxy's
    ``__class__`` may name another; a generator is awaitable only when its code is marked
    ``@types.coroutine``; a class merely registered as ``Awaitable`` cannot be awaited at all)."""
    if not isawaitable(answer):
        return False
    kind = type(answer)
    if (
        len(_AWAITABLE_TYPES) < MAX_AWAITABLE_TYPES
        and answer.__class__ is kind
        and getattr(kind, "__await__", None) is not None
    ):
        _AWAITABLE_TYPES.add(kind)
    return True


def not_awaitable(provider: str, answer: object) -> ProviderContractError:
    """The error for a ``call()`` that returned ``answer``, which cannot be awaited: a provider's
    ``call`` must be a coroutine function (``async def``). A plain function has already run, so the
    work may have been done and billed."""
    return ProviderContractError(
        f"provider {provider!r}: call() returned {type(answer).__name__}, not an awaitable; define "
        "call with 'async def' (aiqsim.scheduler.provider.Provider). It ran, so the call may have "
        "been billed"
    )


def attempt_timed_out(provider: str, timeout_s: float | None, deadline: DeadlineExceeded) -> TimeoutError:
    """The error of an attempt the retry policy's ``attempt_timeout_s`` cut short: a ``TimeoutError``
    (retryable, and counted as such by gates and the call log) that names the provider and the
    setting, where the runtime's own error said only how long it waited."""
    return TimeoutError(
        f"provider {provider!r}: {deadline} (the attempt timeout, attempt_timeout_s={timeout_s:g}); "
        "the call was abandoned, and the provider may still have done and billed it"
    )
