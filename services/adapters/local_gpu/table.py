"""The local-gpu trials this adapter knows: tracked in memory, adopted from their directories.

Nothing about a trial lives only in memory: its directory holds the keeper's pid and
``state.json``, and the GPUs it holds (:data:`~.trial.GPUS_FILE`). :meth:`TrialTable.adopt`
rebuilds the picture from every directory not yet ``reported``, watching the keepers that
still run, so the trials run on while the adapter restarts; a directory whose launch never
started a keeper is left for its request, which comes again. :meth:`TrialTable.release` marks
a trial ``reported`` once the service has published its end, so it is not adopted again.

Each keeper's exit reaches the event loop through a pidfd (:meth:`TrialTable.watch`), and a
kept keeper's notice (:mod:`.ends`) through :meth:`TrialTable.ended_notice`; both call
``on_exit(handle)`` (the adapter's ``notify``), which polls the trial at once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime

from contracts import subjects
from services.adapters import trialdir
from services.adapters.base import TrialHandle
from services.adapters.errors import PermanentError
from services.adapters.gpu.scheduler import Holding
from services.adapters.local_gpu import client
from services.adapters.local_gpu.trial import GPUS_FILE, Trial, dead_keeper

log = logging.getLogger(__name__)


class TrialTable:
    """The trials of this replica, by ``(trial_id, attempt)``, from launch until released."""

    def __init__(
        self,
        trials_dir: str,
        max_trials: int,
        on_exit: Callable[[TrialHandle], None],
        trial_uid: Callable[[str], int | None] = lambda trial_dir: None,
    ) -> None:
        """``trials_dir``: ``<work_dir>/trials``; ``on_exit``: asks for a poll of the trial now;
        ``trial_uid(trial_dir)``: the user that trial runs as when not ours (a keeper pid read from
        its ``state.json`` must be that user's process to be adopted)."""
        self.trials_dir, self.max_trials, self.on_exit = trials_dir, max_trials, on_exit
        self.trial_uid = trial_uid
        self.trials: dict[tuple[str, int], Trial] = {}

    def get(self, key: tuple[str, int]) -> Trial | None:
        return self.trials.get(key)

    def track(
        self,
        experiment_id: str,
        trial_id: str,
        attempt: int,
        trial_dir: str,
        keeper: client.Keeper | None,
        started: datetime,
    ) -> Trial:
        """Remember a trial and watch its keeper."""
        handle = TrialHandle(experiment_id, trial_id, attempt, ref=trial_dir, start_time=started)
        trial = self.trials[(trial_id, attempt)] = Trial(handle, trial_dir, keeper)
        self.watch(trial)
        return trial

    def watch(self, trial: Trial) -> None:
        if trial.keeper is not None and trial.keeper.alive:
            trial.keeper.watch(lambda: self.on_exit(trial.handle))

    def find_keeper(self, trial: Trial) -> client.Keeper | None:
        """For a trial adopted before its keeper wrote ``state.json``: its keeper, once its pid is known
        (None: not yet)."""
        if pid := client.read_state(trial.dir).get("keeperPid"):
            trial.keeper = client.Keeper.adopt(pid, self.trial_uid(trial.dir)) or dead_keeper(pid)
            self.watch(trial)
        return trial.keeper

    def find(self, handle: TrialHandle) -> Trial:
        """The trial of a handle, from memory or, for one this instance never saw, from its directory."""
        trial = self.trials.get((handle.trial_id, handle.attempt))
        if trial is None:
            if not os.path.isdir(handle.ref):
                raise PermanentError(f"trial directory {handle.ref} is gone")
            trial = self.adopt_dir(handle.ref, handle.trial_id, handle.attempt, handle.experiment_id)
        return trial

    def adopt(self) -> list[TrialHandle]:
        """Every trial an earlier run launched and never released."""
        handles = []
        for experiment_id, trial_id, attempt, trial_dir in trialdir.unreported(self.trials_dir):
            if not client.keeper_born(trial_dir):  # died mid-launch: its request comes again
                log.info("%s: its launch never started a keeper; it starts when its request comes again", trial_dir)
                continue
            handles.append(self.adopt_dir(trial_dir, trial_id, attempt, experiment_id).handle)
        return handles

    def adopt_dir(self, trial_dir: str, trial_id: str, attempt: int, experiment_id: str) -> Trial:
        """A trial directory left by an earlier launch: watch its keeper if it still runs."""
        if (trial := self.trials.get((trial_id, attempt))) is not None:
            return trial
        state = client.read_state(trial_dir)
        pid = state.get("keeperPid")
        keeper = (client.Keeper.adopt(pid, self.trial_uid(trial_dir)) or dead_keeper(pid)) if pid else None
        started = state.get("startTime") or os.path.getmtime(trial_dir)
        trial = self.track(experiment_id, trial_id, attempt, trial_dir, keeper, datetime.fromtimestamp(started, UTC))
        data = trialdir.read_in(trial_dir, GPUS_FILE)  # (never through a link the trial put there)
        try:  # the GPUs it was given stay held while it runs
            if data is not None:
                held = json.loads(data)
                trial.gpus, trial.per_gpu = tuple(held["indices"]), int(held["perGpu"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable %s in %s (%s): its GPUs count as free", GPUS_FILE, trial_dir, exc)
        return trial

    def release(self, handle: TrialHandle) -> None:
        """The trial's end is published: forget it and mark its directory ``reported``."""
        trial = self.trials.pop((handle.trial_id, handle.attempt), None)
        trialdir.mark_reported(trial.dir if trial else handle.ref)
        if trial is not None and trial.keeper is not None:
            trial.keeper.close()

    def ended_notice(self, trial_dir: str) -> None:
        """A kept keeper's notice (:mod:`.ends`): poll the trial of ``<…>/<trial>-<attempt>`` now. O(1)."""
        key = trialdir.parse_name(os.path.basename(trial_dir))
        trial = self.trials.get(key) if key is not None else None
        if trial is not None and trial.dir == trial_dir:
            trial.ended_notice = True
            self.on_exit(trial.handle)

    def running(self) -> int:
        return sum(1 for trial in self.trials.values() if trial.running)

    def running_ids(self) -> set[tuple[str, str]]:
        """``(experiment, trial)`` of every running trial (their checkpoints stay)."""
        return {(t.handle.experiment_id, t.handle.trial_id) for t in self.trials.values() if t.running}

    def full(self) -> bool:
        """Whether ``max_trials`` trials run here. O(1) while fewer trials are tracked (running or
        ended, not yet released), O(tracked) otherwise: 250 µs at 1,000, twice per launch."""
        return len(self.trials) >= self.max_trials and self.running() >= self.max_trials

    def holdings(self) -> list[Holding]:
        """The GPUs our running trials hold (for the :class:`~services.adapters.gpu.scheduler.GpuScheduler`)."""
        return [
            Holding(subjects.dispatch_id(t.handle.trial_id, t.handle.attempt), t.gpus, t.per_gpu, self._session(t))
            for t in self.trials.values()
            if t.gpus and t.running
        ]

    def _session(self, trial: Trial) -> int | None:
        if trial.sid is None:
            trial.sid = client.read_state(trial.dir).get("pgid")
        return trial.sid

    def close(self) -> None:
        """Stop watching; the trials run on."""
        for trial in self.trials.values():
            if trial.kill is not None:
                trial.kill.cancel()
            if trial.keeper is not None:
                trial.keeper.close()
