"""Interactive before background, against the M/M/c non-preemptive priority formula.

The production scheduler on the virtual clock, two classes, exponential service: each class's
mean wait in queue must match Cobham's formula (aiqsim.validation.priority), and a scheduler that
ignored the classes (one FIFO queue) must be told apart.
"""

from __future__ import annotations

import math

import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.validation.mmc import expected_wait_in_queue
from aiqsim.validation.priority import priority_check, priority_waits


def test_one_server_gives_cobhams_m_m_1_values() -> None:
    # lambda = 0.3 + 0.4, mu = 1: W0 = rho / mu = 0.7; W1 = W0 / (1 - 0.3), W2 = W0 / ((1 - 0.3)(1 - 0.7))
    interactive, background = priority_waits((0.3, 0.4), 1.0, 1)
    assert interactive == pytest.approx(1.0, rel=1e-12)
    assert background == pytest.approx(0.7 / (0.7 * 0.3), rel=1e-12)


@pytest.mark.parametrize(("rates", "servers"), [((2.0, 4.0), 8), ((0.5, 0.9), 2), ((1.0, 0.5), 3)])
def test_the_classes_average_to_the_plain_erlang_c_wait(rates: tuple[float, float], servers: int) -> None:
    # priorities reorder the queue without creating work: the rate-weighted mean is the FIFO wait
    waits = priority_waits(rates, 1.0, servers)
    mean = sum(rate * wait for rate, wait in zip(rates, waits, strict=True)) / sum(rates)
    assert mean == pytest.approx(expected_wait_in_queue(sum(rates), 1.0, servers), rel=1e-12)
    assert waits[0] < waits[1]


@pytest.mark.parametrize(
    ("rates", "service_rate", "servers"),
    [((1.0, 1.0), 1.0, 2), ((-0.1, 0.5), 1.0, 2), ((0.5, 0.5), 0.0, 2), ((0.5, 0.5), 1.0, 0), ((), 1.0, 1)],
)
def test_inputs_without_a_steady_state_are_refused(
    rates: tuple[float, ...], service_rate: float, servers: int
) -> None:
    with pytest.raises(ConfigurationError):
        priority_waits(rates, service_rate, servers)


def test_the_scheduler_waits_as_the_priority_formula_says_and_not_as_one_fifo_queue() -> None:
    result = priority_check((0.5, 0.9), 1.0, 2, arrivals=6_000, seeds=range(5))
    fifo = expected_wait_in_queue(1.4, 1.0, 2)
    for wait in result.classes:
        assert wait.ci_contains_expected, wait
        assert not wait.ci_low <= fifo <= wait.ci_high, (wait, fifo)  # ignoring the classes is caught
        assert math.isfinite(wait.simulated)
    interactive, background = result.classes
    assert interactive.simulated < 0.5 * background.simulated
