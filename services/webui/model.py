"""The web UI's picture of experiments and trials: what the dispatcher keeps in KV, indexed.

Pure (no I/O), so it is tested without a bus. :mod:`services.webui.feed` applies every KV
entry with :meth:`Model.put_experiment` / :meth:`Model.put_trial`; the hub takes what
changed since its last push with :meth:`Model.take_changes`, once per batch interval, and
sends browsers the views built here. Only views leave this module, and views never hold a
secret: the config comes from :meth:`ExperimentState.view` (``public_json``, secrets
masked) and trials from :meth:`TrialState.view`.

The best metric follows NNI: the best FINAL "default" value (a number, or a dict's
``"default"``), lowest under ``optimize_mode: minimize`` in the tuner's (or advisor's)
``classArgs``, highest otherwise (maximize is NNI's default).

Sized for 100,000 trials in an experiment: what a page asks for costs O(log n + rows asked),
never O(n) — a window of the table at any offset (:meth:`Model.window`, sorted and filtered
by :mod:`services.common.trial_index`), the counts and best (O(log n)), and the overview chart
(:mod:`services.webui.finals`, O(points · log n)). :meth:`Model.rows` without ``trial_ids`` is
O(n): for small experiments and tests, never called by a request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode, urlsplit

from contracts.base import utcnow
from contracts.experiment import ExperimentConfig, OpenpaiConfig
from contracts.state import ExperimentState, TrialState, TrialStatus, default_metric
from services.common.trial_index import Order, TrialIndex
from services.webui.durations import Durations
from services.webui.finals import Finals

MINIMIZE = "minimize"
#: How many first failures an experiment's overview shows (distinct last stderr lines).
FAILURES = 3


def platform_link(config: ExperimentConfig, trial: TrialState) -> str | None:
    """Where the trial can be looked at on its platform; None where there is no web page.

    OpenPAI names a trial's job ``trialbus_<experiment>_<trial>`` (``_<attempt>`` after the
    first attempt); its web portal shows a job at ``/job-detail.html``.
    """
    service = config.service_for(trial.platform)
    if not isinstance(service, OpenpaiConfig) or urlsplit(service.host).scheme not in ("http", "https"):
        return None  # no page; and never a javascript: link
    job = f"trialbus_{trial.experiment_id}_{trial.id}" + (f"_{trial.attempt}" if trial.attempt else "")
    return f"{service.host}/job-detail.html?" + urlencode({"username": service.username, "jobName": job})


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return max(0.0, ((end or utcnow()) - start).total_seconds())


@dataclass
class Changes:
    """What changed since the last :meth:`Model.take_changes`."""

    #: The list of experiments changed (one added, removed, renamed or changed status).
    experiments_list: bool = False
    #: Experiments whose own state changed.
    experiments: set[str] = field(default_factory=set)
    #: Experiment id → ids of its trials that changed (added, updated or removed).
    trials: dict[str, set[str]] = field(default_factory=dict)

    def touched(self) -> set[str]:
        """Every experiment with something new to show."""
        return self.experiments | set(self.trials)


class Model:
    """Experiments and their trials, as the KV buckets hold them now."""

    def __init__(self) -> None:
        self.experiments: dict[str, ExperimentState] = {}
        #: experiment id → trial id → trial (a trial may arrive before its experiment)
        self.trials_of: dict[str, dict[str, TrialState]] = {}
        #: trial id → its experiment id
        self.experiment_of: dict[str, str] = {}
        #: experiment id → its trials indexed: counts and the best trial in O(log n), not O(n)
        self.indexes = TrialIndex()
        #: experiment id → its final default metrics by trial number (the overview chart)
        self.finals: dict[str, Finals] = {}
        #: experiment id → its ended trials' durations, sorted (the durations chart)
        self.durations: dict[str, Durations] = {}
        #: experiment id → its first failed trials, one per last stderr line (at most :data:`FAILURES`)
        self.failures: dict[str, list[str]] = {}
        self._changes = Changes()
        #: told of each experiment deleted: what else the web UI keeps of it (its curves) goes too
        self.on_deleted: list[Callable[[str], None]] = []

    # -- applying KV entries ----------------------------------------------------------------

    def put_experiment(self, state: ExperimentState) -> None:
        self.experiments[state.id] = state
        minimize = state.config.optimize_mode == MINIMIZE
        index = self.indexes.experiments.get(state.id)
        if index is not None and index.minimize != minimize:  # its trials came first: ranked the other way
            del self.indexes.experiments[state.id]
            for trial in self.trials_of.get(state.id, {}).values():
                self._index(trial)
        self._changes.experiments.add(state.id)
        self._changes.experiments_list = True

    def delete_experiment(self, experiment_id: str) -> None:
        self.indexes.experiments.pop(experiment_id, None)
        self.finals.pop(experiment_id, None)
        self.durations.pop(experiment_id, None)
        self.failures.pop(experiment_id, None)
        if self.experiments.pop(experiment_id, None) is not None:
            self._changes.experiments.add(experiment_id)
            self._changes.experiments_list = True
        for forget in self.on_deleted:
            forget(experiment_id)

    def put_trial(self, trial: TrialState) -> None:
        self.trials_of.setdefault(trial.experiment_id, {})[trial.id] = trial
        self.experiment_of[trial.id] = trial.experiment_id
        self._index(trial)
        self.finals.setdefault(trial.experiment_id, Finals()).set(trial.sequence_id, default_metric(trial.final_metric))
        self.durations.setdefault(trial.experiment_id, Durations()).set(trial)
        if trial.status == TrialStatus.FAILED and trial.last_error:
            self._note_failure(trial)
        self._changes.trials.setdefault(trial.experiment_id, set()).add(trial.id)

    def _note_failure(self, trial: TrialState) -> None:
        """Keep the experiment's first failures, one per line: O(:data:`FAILURES`) per failed trial."""
        first = self.failures.setdefault(trial.experiment_id, [])
        trials = self.trials_of[trial.experiment_id]
        if len(first) < FAILURES and all(
            t != trial.id and trials[t].last_error != trial.last_error for t in first if t in trials
        ):
            first.append(trial.id)
            self._changes.experiments.add(trial.experiment_id)  # its overview shows them

    def _index(self, trial: TrialState) -> None:
        state = self.experiments.get(trial.experiment_id)
        minimize = state is not None and state.config.optimize_mode == MINIMIZE
        self.indexes.of(trial.experiment_id, minimize).put(trial)

    def delete_trial(self, trial_id: str) -> None:
        experiment_id = self.experiment_of.pop(trial_id, None)
        if experiment_id is not None:
            gone = self.trials_of.get(experiment_id, {}).pop(trial_id, None)
            if gone is not None and (finals := self.finals.get(experiment_id)) is not None:
                finals.set(gone.sequence_id, None)
            if (durations := self.durations.get(experiment_id)) is not None:
                durations.remove(trial_id)
            if (index := self.indexes.experiments.get(experiment_id)) is not None:
                index.remove(trial_id)
            self._changes.trials.setdefault(experiment_id, set()).add(trial_id)

    def take_changes(self) -> Changes:
        changes, self._changes = self._changes, Changes()
        return changes

    # -- reading -----------------------------------------------------------------------------

    def trial(self, trial_id: str) -> TrialState | None:
        experiment_id = self.experiment_of.get(trial_id)
        return None if experiment_id is None else self.trials_of[experiment_id].get(trial_id)

    def trials(self, experiment_id: str) -> list[TrialState]:
        """The experiment's trials in sequence order (NNI's "Trial No.")."""
        return sorted(self.trials_of.get(experiment_id, {}).values(), key=lambda t: t.sequence_id)

    def newest(self) -> str | None:
        """The id of the experiment started last; None while there is none."""
        if not self.experiments:
            return None
        return max(self.experiments.values(), key=lambda e: (e.start_time, e.id)).id

    def counts(self, experiment_id: str) -> dict[str, int]:
        """Trials by status, every status present (0 where none): O(statuses)."""
        index = self.indexes.experiments.get(experiment_id)
        return index.counts() if index is not None else {status.value: 0 for status in TrialStatus}

    def best(self, experiment_id: str) -> TrialState | None:
        """The trial with the best FINAL default metric; ties go to the earlier trial: O(log n)."""
        index = self.indexes.experiments.get(experiment_id)
        found = index.best(1) if index is not None else []
        return self.trials_of[experiment_id][found[0][0]] if found else None

    # -- views (what browsers get; never a secret) -------------------------------------------

    def overview(self, experiment_id: str) -> dict[str, Any] | None:
        """The experiment's view (masked config, counts) with its best metric and duration."""
        state = self.experiments.get(experiment_id)
        if state is None:
            return None
        body = state.view(self.counts(experiment_id))
        config = state.config
        best = self.best(experiment_id)
        body.update(
            name=config.experiment_name,
            platform=config.platform,
            optimizeMode=config.optimize_mode,
            trialConcurrency=config.trial_concurrency,
            maxTrialNumber=config.max_trial_number,
            duration=max(0.0, state.run_time(utcnow()).total_seconds()),  # time stopped left out (NNI)
            best=None
            if best is None
            else {
                "value": default_metric(best.final_metric),
                "trialId": best.id,
                "sequenceId": best.sequence_id,
            },
            failures=self._failures(experiment_id),
        )
        return body

    def _failures(self, experiment_id: str) -> list[dict[str, Any]]:
        """The first failures, each with its last stderr line (the trial's own text: the page shows it as
        text, never markup) and the command that prints its log."""
        trials = self.trials_of.get(experiment_id, {})
        failed = [trials[t] for t in self.failures.get(experiment_id, []) if t in trials]
        return [
            {
                "trialId": t.id,
                "sequenceId": t.sequence_id,
                "exitCode": t.exit_code,
                "lastError": t.last_error,
                "log": f"trialbus log trial {t.id}",
            }
            for t in failed
            if t.status == TrialStatus.FAILED
        ]

    def row(self, trial: TrialState) -> dict[str, Any]:
        """A trial's view with what the table and detail panel show beside it."""
        body = trial.view()
        state = self.experiments.get(trial.experiment_id)
        body.update(
            replica=trial.replica,
            default=default_metric(trial.final_metric),
            link=platform_link(state.config, trial) if state else None,
        )
        return body

    def rows(self, experiment_id: str, trial_ids: set[str] | None = None) -> list[dict[str, Any]]:
        """Rows of the experiment's trials (only of ``trial_ids`` when given, those still there)."""
        trials = self.trials_of.get(experiment_id, {})
        if trial_ids is None:
            return [self.row(t) for t in self.trials(experiment_id)]
        return [self.row(trials[t]) for t in trial_ids if t in trials]

    def window(
        self,
        experiment_id: str,
        order: Order,
        descending: bool,
        statuses: list[TrialStatus] | None,
        offset: int,
        limit: int,
    ) -> dict[str, Any]:
        """The rows at positions ``offset`` to ``offset + limit`` of the table sorted and filtered so,
        and how many rows the filter holds: O(log n + limit) (see :meth:`ExperimentTrials.window`)."""
        index = self.indexes.experiments.get(experiment_id)
        if index is None:
            return {"total": 0, "offset": offset, "trials": []}
        trials = self.trials_of[experiment_id]
        ids = index.window(order, statuses, offset, limit, descending)
        return {"total": index.total(statuses), "offset": offset, "trials": [self.row(trials[t]) for t in ids]}

    def chart(self, experiment_id: str, points: int) -> dict[str, Any]:
        """The overview chart: at most ``points`` final metrics by trial number, and the best so
        far (:mod:`services.webui.finals`): O(points · log n)."""
        state = self.experiments.get(experiment_id)
        minimize = state is not None and state.config.optimize_mode == MINIMIZE
        finals = self.finals.get(experiment_id)
        return finals.chart(points, minimize) if finals else {"points": [], "best": [], "count": 0}

    def summaries(self) -> list[dict[str, Any]]:
        """Every experiment in a line (for the page's experiment picker), newest first."""
        newest = sorted(self.experiments.values(), key=lambda e: (e.start_time, e.id), reverse=True)
        return [
            {
                "id": e.id,
                "name": e.config.experiment_name,
                "status": e.status.value,
                "startTime": e.start_time.isoformat(),
                "platform": e.config.platform,
            }
            for e in newest
        ]
