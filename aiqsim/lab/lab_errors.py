"""Errors of the calibrate and tune steps, in a module of their own so ``aiqsim.errors`` can list them
without importing pandas or Optuna."""

from __future__ import annotations

from aiqsim.core.errors import ConfigurationError

__all__ = ["CalibrationError", "TuneError"]


class CalibrationError(ConfigurationError):
    """A call log that cannot be calibrated from (missing files or columns, no calls); says which."""


class TuneError(ConfigurationError, RuntimeError):
    """A tuning run in which no trial could be run: every setting tried was refused or failed (the
    first failure is in the message). Usually a search space whose corners combine into settings the
    scenario rejects (a retry cap below the base)."""
