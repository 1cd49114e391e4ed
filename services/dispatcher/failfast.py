"""Fail fast: an experiment whose first trials all fail the same way is stopped, and says why.

A config whose trials cannot run at all (a module missing in the trial's environment, a typo in
``trialCommand``) would otherwise run ``maxTrialNumber`` trials that fail alike and end DONE
with nothing to show. The experiment's ``failFast`` (default
:data:`contracts.experiment.FAIL_FAST`, 3; ``0`` turns it off, as NNI has no such guard) is how
many of its first ended trials must have FAILED with the same last stderr line
(``TrialState.last_error``) for the dispatcher to stop it, with that line as the reason.

Which ends count, in the order the dispatcher applies them:

- SUCCEEDED or EARLY_STOPPED (the trial ran as it should): the guard is off for the experiment;
- FAILED with a last stderr line: counted; a line unlike the first one's turns the guard off;
- anything else (canceled, a failure without a line, e.g. a lost machine): not counted.

The guard fires at most once per experiment: resumed after it, the experiment runs on (its
user has been told). Each end costs O(1): one small record per experiment, no look at its
other trials. After a restart the records are derived from the trials' ends (:meth:`load`, in
any order: an experiment that had ``failFast`` counted ends already is past the guard), so a
dispatcher that stopped between the deciding end and the stop lets that experiment run on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from contracts.state import ExperimentState, ExperimentStatus, TrialState, TrialStatus

log = logging.getLogger(__name__)

#: Ends that show the trials can run: the guard is off for their experiment.
_FINE = frozenset({TrialStatus.SUCCEEDED, TrialStatus.EARLY_STOPPED})


@dataclass
class _Watch:
    """One experiment's first failures: the line they share, how many, the first trial."""

    line: str | None = None
    first: str | None = None
    count: int = 0
    off: bool = False


class FailFast:
    """The guard's state for every experiment the dispatcher runs (the module's docstring).

    ``stop(experiment_id, why)`` stops an experiment as a user's stop does (the dispatcher's
    ``stop_experiment``, which takes the experiment's lock)."""

    def __init__(self, stop: Callable[[str, str], Awaitable[Any]]) -> None:
        self._stop = stop
        self._watches: dict[str, _Watch] = {}
        self._stopping: set[asyncio.Task] = set()

    def ended(self, trial: TrialState, experiment: ExperimentState) -> None:
        """``trial`` (of the RUNNING ``experiment``) ended: stop the experiment when :meth:`decide`
        says so, in a task, once the caller has let go of the experiment's lock (an end is applied
        under it; the trials dispatched with it are sent after it, and the stop cancels them)."""
        why = self.decide(trial, experiment.config.fail_fast_trials)
        if why is None or experiment.status != ExperimentStatus.RUNNING:
            return
        log.warning("experiment %s: %s", experiment.id, why)
        task = asyncio.create_task(self._stop_now(experiment.id, why))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop_now(self, experiment_id: str, why: str) -> None:
        try:
            await self._stop(experiment_id, why)
        except Exception:  # deleted meanwhile, or KV down: it runs on, as without the guard
            log.exception("cannot stop experiment %s (%s)", experiment_id, why)

    def decide(self, trial: TrialState, limit: int) -> str | None:
        """Count ``trial``'s end (it has ended); the reason to stop its experiment when its first
        ``limit`` counted ends all failed with the same line (once), else None."""
        watch = self._count(trial, limit)
        if watch is None or watch.off or watch.count < limit:
            return None
        watch.off = True
        return (
            f"failFast: its first {limit} trials failed the same way: {watch.line} (see the log of trial "
            f"{watch.first}); fix the cause and resume the experiment (failFast: 0 runs every trial however "
            "they fail)"
        )

    def load(self, trial: TrialState, limit: int) -> None:
        """At start: count an end applied before (the guard never fires here; a stop it decided is done)."""
        watch = self._count(trial, limit)
        if watch is not None and watch.count >= limit:
            watch.off = True

    def forget(self, experiment_id: str) -> None:
        """The experiment was deleted."""
        self._watches.pop(experiment_id, None)

    def _count(self, trial: TrialState, limit: int) -> _Watch | None:
        if limit <= 0:
            return None
        watch = self._watches.get(trial.experiment_id)
        if watch is None:
            watch = self._watches[trial.experiment_id] = _Watch()
        if watch.off:
            return watch
        if trial.status in _FINE:
            watch.off = True
        elif trial.status == TrialStatus.FAILED and trial.last_error:
            if watch.line is None:
                watch.line, watch.first = trial.last_error, trial.id
            if trial.last_error != watch.line:
                watch.off = True
            else:
                watch.count += 1
        return watch
