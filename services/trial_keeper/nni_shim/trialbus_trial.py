"""Trialbus's additions to the trial API, importable in every trial (stdlib only):

    import trialbus_trial

    ckpt = trialbus_trial.checkpoint_dir()       # a pathlib.Path, kept across the trial's attempts
    if (ckpt / "model.pt").exists():             # a retry: resume where the last attempt stopped
        ...

The same values are in the trial's environment: ``TRIALBUS_CHECKPOINT_DIR`` and
``TRIALBUS_ATTEMPT``. docs/retries.md says where the directory lives on each platform.
"""

from __future__ import annotations

import os
import pathlib

__all__ = ["attempt", "checkpoint_dir"]


def checkpoint_dir() -> pathlib.Path:
    """The trial's checkpoint directory, created if need be: what one attempt saves there,
    the next attempt of the same trial finds. Outside Trialbus: ``./checkpoints``."""
    path = pathlib.Path(os.environ.get("TRIALBUS_CHECKPOINT_DIR") or "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def attempt() -> int:
    """0 for the trial's first attempt, 1 for its first retry, and so on (0 outside Trialbus)."""
    try:
        return int(os.environ.get("TRIALBUS_ATTEMPT") or 0)
    except ValueError:
        return 0
