"""Watching and stopping local-gpu trials: a trial's end, as its keeper leaves it, and cancel.

Each keeper's exit reaches the event loop through a pidfd (:meth:`.table.TrialTable.watch`),
which wakes the service at once; :meth:`Watcher.poll` then reads the outcome from the keeper's
``state.json`` and exit status (:func:`~services.adapters.keeper.outcome_of`), and kills what a
keeper that died first left behind. :meth:`Watcher.cancel` sends SIGTERM to the keeper (it
stops the trial's process group) and SIGKILLs everything once the grace period is over. A
trial adopted before its keeper wrote its pid counts as running for :data:`~.trial.UNBORN_GRACE`
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable

from services.adapters import trialdir
from services.adapters.base import TrialHandle, TrialOutcome
from services.adapters.errors import TransientError
from services.adapters.keeper import outcome_of
from services.adapters.local_gpu import client
from services.adapters.local_gpu.table import TrialTable
from services.adapters.local_gpu.trial import UNBORN_GRACE, Trial

log = logging.getLogger(__name__)


class Watcher:
    """Polls and cancels the trials of a :class:`~.table.TrialTable` (the module's docstring)."""

    def __init__(
        self,
        table: TrialTable,
        kill_grace: float,
        learn: Callable[[str, str], None],
        trial_uid: Callable[[str], int | None] = lambda trial_dir: None,
    ) -> None:
        """``kill_grace``: the seconds from SIGTERM to SIGKILL of a trial that sets none;
        ``learn(template, trial_dir)``: a trial forked from a warm template ended; ``trial_uid(trial_dir)``:
        the uid that trial runs as when it is not ours (a group named in their ``state.json`` is then
        signalled only where its processes are that user's: :func:`~.client.kill_group`)."""
        self.table, self.kill_grace, self.learn, self.trial_uid = table, kill_grace, learn, trial_uid

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        trial = self.table.find(handle)
        if trial.outcome is not None:
            return trial.outcome
        keeper = trial.keeper if trial.keeper is not None else self.table.find_keeper(trial)
        if keeper is None:
            if time.time() - os.path.getmtime(trial.dir) < UNBORN_GRACE:
                return None
            return self._ended(trial)
        if keeper.check() and not (trial.ended_notice and client.read_state(trial.dir).get("done")):
            return None  # running (a kept keeper lives on after its trial: its notice says the trial ended)
        return self._ended(trial)

    def _ended(self, trial: Trial) -> TrialOutcome:
        if trial.kill is not None:
            trial.kill.cancel()
        if trial.template is not None:
            self.learn(trial.template, trial.dir)
        state = client.read_state(trial.dir)
        if state.get("pgid") and "exitCode" not in state:  # the keeper died first: leave no orphans
            client.kill_group(state["pgid"], signal.SIGKILL, self.trial_uid(trial.dir))
        status = trial.keeper.status if trial.keeper else None
        if trial.keeper is not None:
            trial.keeper.close()  # stop watching it (a kept keeper lives on)
        if not state and trial.keeper is not None:
            client.record_early_death(trial.dir, trial.keeper.pid, status)
        status = status if status is not None else state.get("keeperExit")
        ended = state.get("exitCode") is not None
        keeper_out = None if ended else client.tail(trial.dir, trialdir.KEEPER_OUT, 300)
        trial.outcome = outcome_of(state, status, keeper_out)
        return trial.outcome

    async def cancel(self, handle: TrialHandle) -> None:
        """SIGTERM the keeper (it stops the trial's group); SIGKILL everything if it lingers."""
        trial = self.table.find(handle)
        if not trial.running:
            return
        keeper = trial.keeper if trial.keeper is not None else self.table.find_keeper(trial)
        if keeper is None:
            raise TransientError("the trial keeper has not started yet", delay=0.2)
        # First the file, then the signal: a keeper kept for trial after trial stops its trial
        # only when the file is there (a late signal meant for a trial it kept before stops none).
        with contextlib.suppress(OSError):  # (never through a link the trial put there)
            os.close(trialdir.open_in(trial.dir, trialdir.CANCEL, os.O_WRONLY | os.O_CREAT))
        keeper.signal(signal.SIGTERM)
        if trial.kill is None:
            loop = asyncio.get_running_loop()
            trial.kill = loop.call_later(self._grace(trial) + 1.0, self._force_stop, trial)

    def _grace(self, trial: Trial) -> float:
        return self.kill_grace if trial.grace is None else trial.grace

    def _force_stop(self, trial: Trial) -> None:
        if trial.running and trial.keeper is not None and not client.read_state(trial.dir).get("done"):
            grace = self._grace(trial) + 1
            log.warning("trial %s still running %.1fs after cancel: SIGKILL", trial.handle.trial_id, grace)
            if pgid := client.read_state(trial.dir).get("pgid"):
                client.kill_group(pgid, signal.SIGKILL, self.trial_uid(trial.dir))
            trial.keeper.signal(signal.SIGKILL)
