"""What stays of a finished local-gpu trial, and for how long.

A trial's directory outlives its end by ``trial_retention`` seconds: its logs are served
from there (``log_tail``), also for past attempts found by ``past`` and after a restart.
Then a loop removes it (:func:`remove_expired`), and with it the checkpoint directories
(``<checkpoint_root>/<experiment>/<trial>/``, shared by the replicas of a host) unchanged as
long, but those of trials still running (:func:`remove_stale`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from services.adapters import trialdir
from services.adapters.base import TrialHandle
from services.adapters.local_gpu import client
from services.adapters.local_gpu.trial import SAFE_ID
from services.adapters.remote import agent_checkpoints
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class Retention:
    """Finished trials' directories and stale checkpoints, and the removal loop (the module's docstring)."""

    def __init__(
        self, trials_dir: str, checkpoint_root: str, retention: float, running: Callable[[], set[tuple[str, str]]]
    ) -> None:
        """``retention``: seconds (0 keeps everything); ``running()``: ``(experiment, trial)`` of
        the trials running here, whose checkpoints stay."""
        self.trials_dir, self.checkpoint_root, self.retention = trials_dir, checkpoint_root, retention
        self.running = running
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        """An attempt (the newest by default) of a trial whose directory is still here (kept
        ``trial_retention``)."""
        if not (SAFE_ID.match(experiment_id) and SAFE_ID.match(trial_id)):
            return None
        found = trialdir.newest(f"{self.trials_dir}/{experiment_id}", trial_id, attempt)
        return TrialHandle(experiment_id, trial_id, found[0], ref=found[1]) if found else None

    async def _loop(self) -> None:
        """Remove reported trials' directories ``trial_retention`` seconds after their end."""
        retention = self.retention
        if not retention:
            return
        while True:
            try:
                removed = await asyncio.to_thread(remove_expired, self.trials_dir, retention)
                if removed:
                    log.info(
                        "removed %d finished trial director%s older than %.0fs",
                        removed,
                        "y" if removed == 1 else "ies",
                        retention,
                    )
                running = self.running()
                stale = await asyncio.to_thread(remove_stale, self.checkpoint_root, retention, running)
                if stale:
                    log.info(
                        "removed %d checkpoint director%s unchanged for %.0fs",
                        stale,
                        "y" if stale == 1 else "ies",
                        retention,
                    )
            except Exception:
                log.exception("cannot clean up old trial directories")
            await asyncio.sleep(min(3600.0, max(1.0, retention / 4)))


def log_tail(trial_dir: str, max_bytes: int) -> str:
    """The last ``max_bytes`` of the trial's stdout, stderr and ``trial.log``, labelled."""
    parts = []
    for name in ("stdout", "stderr", "trial.log"):
        text = client.tail(trial_dir, name, max_bytes)
        if text is not None:
            parts.append(f"==> {name} <==\n{text}")
    return "\n".join(parts)


def remove_expired(trials_dir: str, retention: float) -> int:
    """Delete trial directories reported more than ``retention`` seconds ago; the count."""
    return trialdir.remove_expired(trials_dir, time.time() - retention)[0]


def remove_stale(root: str, retention: float, running: set[tuple[str, str]]) -> int:
    """Delete checkpoint directories (``<root>/<experiment>/<trial>``) unchanged for ``retention``
    seconds, but those of ``running`` trials; the count. The remote agents' rule, from the same
    stdlib module they ship (``agent_checkpoints.remove_stale``). O(checkpoint directories)."""
    return agent_checkpoints.remove_stale(root, time.time() - retention, running)
