"""random_id: task and job ids are the draws of the scheduler's rng, formatted as they always were."""

from __future__ import annotations

import random

from aiqsim.core.task import random_id


def test_the_same_string_as_the_format_spec_for_the_same_draw() -> None:
    drawn, expected = random.Random(19), random.Random(19)
    for _ in range(5000):
        assert random_id(drawn) == f"{expected.getrandbits(64):016x}"


def test_small_draws_keep_their_leading_zeros() -> None:
    class Fixed(random.Random):
        def getrandbits(self, k: int) -> int:
            return 0xAB

    assert random_id(Fixed()) == "00000000000000ab"
