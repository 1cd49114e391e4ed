"""Current state of experiments and trials, as the dispatcher keeps it in JetStream KV.

State is derived from the event and metric streams (docs/architecture.md, principle 3); the
REST API answers with :meth:`TrialState.view` and :meth:`ExperimentState.view`.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from contracts.base import Contract
from contracts.experiment import ExperimentConfig
from contracts.retries import Attempt, Failure


def default_metric(value: Any) -> float | None:
    """NNI's "default" metric of a reported value: the number itself, or a dict's ``default``.

    None when there is no finite number (no final yet, NaN, a dict without ``default``).
    """
    if isinstance(value, dict):
        value = value.get("default")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class TrialStatus(StrEnum):
    """NNI's trial statuses (``ts/nni_manager/common/trainingService.ts``)."""

    WAITING = "WAITING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    USER_CANCELED = "USER_CANCELED"
    SYS_CANCELED = "SYS_CANCELED"
    EARLY_STOPPED = "EARLY_STOPPED"

    @property
    def terminal(self) -> bool:
        return self not in (TrialStatus.WAITING, TrialStatus.RUNNING)


class ExperimentStatus(StrEnum):
    """RUNNING takes trials; DONE has reached its limits and every trial ended; STOPPED by a user."""

    RUNNING = "RUNNING"
    DONE = "DONE"
    STOPPED = "STOPPED"


class TrialState(Contract):
    """One trial as the dispatcher knows it (KV bucket ``trials``, key = trial id)."""

    kind: Literal["trial.state"] = "trial.state"
    v: Literal[1] = 1
    id: str
    experiment_id: str
    #: NNI's "Trial No.": 0, 1, 2… per experiment, in submission order.
    sequence_id: int
    #: 0 for the first run; each retry gets the next number (``retry:``, docs/retries.md), and so
    #: does a hybrid experiment's trial taken back from a platform that went down before starting it.
    attempt: int = 0
    #: The attempts that are over, oldest first: how each ended and why (bounded by the retry policy).
    attempts: list[Attempt] = Field(default_factory=list)
    #: Why the current attempt failed, once it has (its failure class).
    failure: Failure | None = None
    #: A retry waiting for its back-off: when it may take a slot again.
    retry_at: datetime | None = None
    status: TrialStatus = TrialStatus.WAITING
    #: The hyper-parameters the trial receives from ``nni.get_next_parameter()``.
    parameters: dict[str, Any] = Field(default_factory=dict)
    #: NNI's ``parameter_id`` (an int, or a string for BOHB/Hyperband).
    parameter_id: int | str | None = None
    #: The adapter that runs it; in a hybrid experiment chosen at dispatch ("" until then).
    platform: str
    submit_time: datetime
    start_time: datetime | None = None
    end_time: datetime | None = None
    exit_code: int | None = None
    #: The FINAL value decoded to plain JSON, exactly as reported.
    final_metric: Any = None
    intermediate_count: int = 0
    #: A sentence for people: why the trial waits, failed or was stopped.
    message: str | None = None
    #: True once the request is on ``dispatch.<platform>`` (the trial holds a slot).
    dispatched: bool = False
    #: Set when a cancel was asked for: the status the trial ends with.
    cancel_status: TrialStatus | None = None
    #: The adapter replica that owns the trial (from its RUNNING event).
    replica: str | None = None
    #: Its FAILED end's last stderr line, where the platform can read it (``TrialEvent.last_error``).
    last_error: str | None = None
    #: Its experiment's owner and team when it was submitted (contracts/people.py).
    owner: str | None = None
    team: str | None = None

    def view(self) -> dict[str, Any]:
        """The REST shape of ``GET /api/v1/trials/{id}``."""
        return self.model_dump(
            mode="json",
            by_alias=True,
            include={
                "id",
                "experiment_id",
                "sequence_id",
                "status",
                "parameters",
                "parameter_id",
                "submit_time",
                "start_time",
                "end_time",
                "exit_code",
                "final_metric",
                "intermediate_count",
                "platform",
                "replica",
                "message",
                "attempt",
                "attempts",
                "failure",
                "retry_at",
                "last_error",
                "owner",
                "team",
            },
        )


class ExperimentState(Contract):
    """One experiment (KV bucket ``experiments``, key = experiment id)."""

    kind: Literal["experiment.state"] = "experiment.state"
    v: Literal[1] = 1
    id: str
    status: ExperimentStatus = ExperimentStatus.RUNNING
    config: ExperimentConfig
    #: ``sha256:<hex>`` of the code snapshot in the ``code`` object store, if any.
    code_ref: str | None = None
    start_time: datetime
    end_time: datetime | None = None
    message: str | None = None
    #: The tuner has nothing more to propose (NNI's NO_MORE_TRIAL): DONE once the trials submitted end.
    no_more_trials: bool = False
    #: Seconds it stood STOPPED before being resumed (NNI's resume): not counted as run time.
    stopped_seconds: float = 0.0
    #: Who created it, and their team (contracts/people.py); None for an experiment made
    #: before teams, which only an admin may change.
    owner: str | None = None
    team: str | None = None
    #: Earlier results imported (``trialbus experiment import``): how many rows the ``imports`` bucket holds for
    #: it. A change of it tells the tuner service to read them (services/dispatcher/imports.py).
    imported: int = 0

    def run_time(self, now: datetime) -> timedelta:
        """How long it has run (to its end, or ``now``), the time it stood stopped left out: what
        ``maxExperimentDuration`` limits, as NNI's ``execDuration``."""
        return (self.end_time or now) - self.start_time - timedelta(seconds=self.stopped_seconds)

    def view(self, trial_counts: dict[str, int]) -> dict[str, Any]:
        """The REST shape of ``GET /api/v1/experiments/{id}`` (secrets masked)."""
        body = self.model_dump(
            mode="json",
            by_alias=True,
            include={
                "id",
                "status",
                "code_ref",
                "start_time",
                "end_time",
                "message",
                "no_more_trials",
                "stopped_seconds",
                "owner",
                "team",
                "imported",
            },
        )
        body["config"] = self.config.public_json()
        body["trialCount"] = sum(trial_counts.values())
        body["trialCounts"] = trial_counts
        return body
