"""One sink from several: ``Scheduler(events=fan_out(CallLog(...), PrometheusMetrics(), ...))``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.scheduler.events import QuotaSample

__all__ = ["EventFanout", "fan_out"]


class EventFanout:
    """Gives every event to each sink in turn, in the order given.

    A :class:`~aiqsim.scheduler.events.QuotaSample` goes only to the sinks that want one (a sink
    with ``wants_quota_samples = False``, like :class:`~aiqsim.scheduler.call_log.CallLog`, is
    skipped), and the scheduler builds none when no sink wants them. A sink that raises stops the
    event there, as a single sink's error would.
    """

    def __init__(self, *sinks: Callable[[Any], None]) -> None:
        for index, sink in enumerate(sinks):
            if not callable(sink):
                raise ConfigurationError(f"fan_out: sink {index} is not callable: {sink!r}")
        self.sinks = sinks
        self._samplers = tuple(s for s in sinks if getattr(s, "wants_quota_samples", True))
        self.wants_quota_samples = bool(self._samplers)

    def __call__(self, event: Any) -> None:
        for sink in self._samplers if type(event) is QuotaSample else self.sinks:
            sink(event)

    def __repr__(self) -> str:
        return f"fan_out({', '.join(map(repr, self.sinks))})"


def fan_out(*sinks: Callable[[Any], None]) -> EventFanout:
    """An event sink that hands every event to each of ``sinks`` (see :class:`EventFanout`)."""
    return EventFanout(*sinks)
