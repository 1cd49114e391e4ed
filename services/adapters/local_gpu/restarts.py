"""Local-gpu trials across an adapter restart: adoption from the trial directories.

Nothing about a trial lives only in memory: its directory holds the keeper's pid and
``state.json``, and the GPUs it holds (:data:`~.trial.GPUS_FILE`). ``adopt`` rebuilds the
picture from every directory not yet ``reported``, watching the keepers that still run, so
the trials run on while the adapter restarts; a directory whose launch never started a
keeper is left for its request, which comes again. ``release`` marks a trial ``reported``
once the service has published its end, so it is not adopted again.

A mixin of :class:`~services.adapters.local_gpu.adapter.LocalGpuAdapter`, which holds the
state it uses.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from services.adapters.base import TrialHandle
from services.adapters.local_gpu import client
from services.adapters.local_gpu.trial import GPUS_FILE, Trial, dead_keeper

if TYPE_CHECKING:
    from services.adapters.local_gpu.adapter import LocalGpuAdapter

log = logging.getLogger(__name__)


class Restarts:
    """The adoption part of the local-gpu adapter (the module's docstring)."""

    async def adopt(self: LocalGpuAdapter) -> list[TrialHandle]:
        handles = []
        for experiment in sorted(os.scandir(f"{self.work_dir}/trials"), key=lambda e: e.name):
            for entry in os.scandir(experiment.path) if experiment.is_dir() else ():
                trial_id, _, attempt = entry.name.rpartition("-")
                if not (entry.is_dir() and trial_id and attempt.isdigit()) or client.is_reported(entry.path):
                    continue
                if not client.keeper_born(entry.path):  # died mid-launch: its request comes again
                    log.info("%s: its launch never started a keeper; it starts when its request comes again",
                             entry.path)  # fmt: skip
                    continue
                handles.append(self._adopt(entry.path, trial_id, int(attempt), experiment.name).handle)
        return handles

    def _adopt(self: LocalGpuAdapter, trial_dir: str, trial_id: str, attempt: int, experiment_id: str) -> Trial:
        """A trial directory left by an earlier launch: watch its keeper if it still runs."""
        if (trial := self.trials.get((trial_id, attempt))) is not None:
            return trial
        state = client.read_state(trial_dir)
        pid = state.get("keeperPid")
        keeper = (client.Keeper.adopt(pid) or dead_keeper(pid)) if pid else None
        started = state.get("startTime") or os.path.getmtime(trial_dir)
        trial = self._track(experiment_id, trial_id, attempt, trial_dir, keeper, datetime.fromtimestamp(started, UTC))
        try:  # the GPUs it was given stay held while it runs
            with open(f"{trial_dir}/{GPUS_FILE}", "rb") as f:
                held = json.loads(f.read())
            trial.gpus, trial.per_gpu = tuple(held["indices"]), int(held["perGpu"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable %s in %s (%s): its GPUs count as free", GPUS_FILE, trial_dir, exc)
        return trial

    async def release(self: LocalGpuAdapter, handle: TrialHandle) -> None:
        trial = self.trials.pop((handle.trial_id, handle.attempt), None)
        client.mark_reported(trial.dir if trial else handle.ref)
        if trial is not None and trial.keeper is not None:
            trial.keeper.close()
