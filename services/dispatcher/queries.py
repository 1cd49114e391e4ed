"""The dispatcher's reads: experiments, trials (a page at a time), a trial's metrics and log.

Answered from the store's cache and its indexes (:mod:`services.common.trial_index`), never by walking an
experiment's trials: an experiment's summary is O(statuses + log n), a page of its trials
O((limit + statuses) · log n), one trial O(1). The writes are the other parts of
:class:`~services.dispatcher.core.Dispatcher`, which find what they change with :func:`find_experiment`
and :func:`find_trial` (a 404 for an unknown id).
"""

from __future__ import annotations

from typing import Any

from contracts.state import ExperimentState, TrialState, TrialStatus
from services.common.api import ApiError
from services.common.bus import Bus
from services.common.trial_index import ORDERS, BadCursor
from services.dispatcher import history
from services.dispatcher.store import StateStore

#: Trials in a page of ``GET /experiments/{id}/trials``: by default, and at most.
PAGE_DEFAULT, PAGE_MAX = 500, 5000
#: Best trials in an experiment's summary.
BEST_SHOWN = 5


def find_experiment(store: StateStore, experiment_id: str) -> ExperimentState:
    """The experiment, or a 404."""
    state = store.experiments.get(experiment_id)
    if state is None:
        raise ApiError(404, f"experiment {experiment_id!r} not found")
    return state


def find_trial(store: StateStore, trial_id: str) -> TrialState:
    """The trial, or a 404."""
    trial = store.trials.get(trial_id)
    if trial is None:
        raise ApiError(404, f"trial {trial_id!r} not found")
    return trial


class Queries:
    """The reads of the dispatcher (the module's docstring); ``timeout``: seconds to wait for an adapter's log."""

    def __init__(self, bus: Bus, store: StateStore, timeout: float) -> None:
        self._bus = bus
        self._store = store
        self._timeout = timeout

    def experiment(self, experiment_id: str) -> ExperimentState:
        return find_experiment(self._store, experiment_id)

    def experiment_view(self, state: ExperimentState) -> dict[str, Any]:
        """The experiment's summary: O(statuses + log n) from the indexes, whatever its size."""
        trials = self._store.of(state.id)
        body = state.view(trials.counts())
        body["bestTrials"] = [{"id": trial_id, "metric": value} for trial_id, value in trials.best(BEST_SHOWN)]
        return body

    def list_experiments(self) -> list[dict[str, Any]]:
        newest = sorted(self._store.experiments.values(), key=lambda e: e.start_time, reverse=True)
        return [self.experiment_view(e) for e in newest]

    def trial(self, trial_id: str) -> TrialState:
        return find_trial(self._store, trial_id)

    def list_trials(
        self,
        experiment_id: str,
        limit: int = PAGE_DEFAULT,
        cursor: str | None = None,
        status: str | None = None,
        sort: str = "sequence",
    ) -> dict[str, Any]:
        """A page of the experiment's trials (:mod:`services.common.trial_index`): ``status`` a comma-separated filter,
        ``sort`` ``sequence`` (submission order) or ``metric`` (best final metric first)."""
        self.experiment(experiment_id)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE_MAX:
            raise ApiError(422, f"limit must be a whole number from 1 to {PAGE_MAX}")
        if sort not in ORDERS:
            raise ApiError(422, f"sort must be one of {', '.join(ORDERS)}, not {sort!r}")
        statuses = None
        if status:
            names = [name.strip().upper() for name in str(status).split(",") if name.strip()]
            unknown = [name for name in names if name not in TrialStatus.__members__]
            if unknown:
                raise ApiError(
                    422,
                    f"unknown trial status {', '.join(unknown)}: the statuses are {', '.join(TrialStatus.__members__)}",
                )
            statuses = [TrialStatus(name) for name in names]
        try:
            page = self._store.of(experiment_id).page(sort, statuses, cursor, limit)
        except BadCursor as exc:
            raise ApiError(422, str(exc)) from None
        return {"trials": [self._store.trials[t].view() for t in page.trial_ids], "nextCursor": page.cursor}

    async def trial_metrics(self, trial_id: str) -> list[dict[str, Any]]:
        return await history.trial_metrics(self._bus, self.trial(trial_id))

    async def trial_log(self, trial_id: str, max_bytes: int = 64 * 1024, attempt: int | None = None) -> str:
        """The tail of the trial's stdout and stderr: its current attempt's, or ``attempt``'s."""
        trial = self.trial(trial_id)
        if attempt is not None and not 0 <= attempt <= trial.attempt:
            raise ApiError(404, f"trial {trial_id} has no attempt {attempt}: its attempts are 0 to {trial.attempt}")
        if attempt == trial.attempt:
            attempt = None
        if attempt is None and not trial.dispatched and trial.status == TrialStatus.WAITING:
            raise ApiError(409, f"trial {trial_id} has not started yet; it has no log")
        text = await history.trial_log(self._bus, trial, max_bytes, self._timeout, attempt)
        if text is None:
            which = f"attempt {attempt} of trial {trial_id}" if attempt is not None else f"trial {trial_id}"
            raise ApiError(
                503, f"no {trial.platform} adapter replica holds the log of {which} right now; is it running?"
            )
        return text
