"""The one record the observability sinks take besides the scheduler's events: a provider's bill.

Only a provider knows whether it billed a call (a timed-out attempt may have been executed and
charged; a 429 was not): the client's events cannot say. The lab's simulated providers keep that
record in their ledger, and :func:`aiqsim.sim.simulate` hands every bill to its ``sinks`` as a
:class:`CallBilled`; a production adapter whose provider reports its charges can send the same
record to the same sink. ``aiqsim serve`` exposes its own bills on ``/metrics`` under the same names.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CallBilled"]


class CallBilled(NamedTuple):
    """A provider billed one execution of ``key``: ``cost`` money, ``duplicate`` when the key had
    already been billed (work paid for twice, the lab's ``duplicate_billed_calls``).

    ``time`` is when the provider finished with the call, on the scheduler's clock."""

    time: float
    provider: str
    task_id: str
    key: str
    attempt: int
    cost: float
    duplicate: bool
