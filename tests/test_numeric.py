"""The one test of what counts as a number in an argument (aiqsim.core.numeric)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from aiqsim.core.numeric import is_real, is_whole


@pytest.mark.parametrize(
    "value", [0, 3, 2.5, -1.0, math.inf, math.nan, np.float64(1.5), np.int64(4), Fraction(1, 3)]
)
def test_real_numbers_of_any_kind_are_numbers(value: object) -> None:
    assert is_real(value)


@pytest.mark.parametrize("value", [True, False, "3", None, [1], 1j])
def test_booleans_text_and_others_are_not(value: object) -> None:
    assert not is_real(value)


@pytest.mark.parametrize(
    ("value", "least", "whole"),
    [(3, 1, True), (3.0, 1, True), (np.int64(2), 1, True), (0, 0, True), (0, 1, False), (2.5, 1, False),
     (math.inf, 1, False), (math.nan, 1, False), (True, 1, False), ("3", 1, False), (-2, 0, False)],
)  # fmt: skip
def test_whole_numbers_are_finite_integral_and_at_least_the_bound(
    value: object, least: int, whole: bool
) -> None:
    assert is_whole(value, least) is whole
