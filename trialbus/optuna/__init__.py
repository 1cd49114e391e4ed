"""Optuna studies whose trials run on Trialbus: :func:`optimize` (docs/optuna.md)."""

from __future__ import annotations

from trialbus.optuna.optimize import TrialFailed, optimize

__all__ = ["TrialFailed", "optimize"]
