"""The dispatcher's API as a client sees it: where it is by default, its error, the shapes of its answers.

:class:`~trialbus.client.AsyncClient` and :class:`~trialbus.client.Client` answer with these (and
``trialbus.client`` exports them all, as before).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, Field, ValidationError

from contracts import ExperimentState, MetricType, TrialState, TrialStatus
from contracts.base import Contract
from trialbus.local import DEFAULT_NATS_URL as DEFAULT_NATS_URL  # `trialbus up`'s, defined where the CLI reads it

M = TypeVar("M", bound=BaseModel)


class TrialbusError(Exception):
    """The dispatcher refused a request, or could not be reached. ``status`` is HTTP-like."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SubmittedTrial(NamedTuple):
    id: str
    sequence_id: int
    status: TrialStatus


class TrialMetric(Contract):
    """One metric of a trial as ``trial.metrics`` answers it; ``value`` already decoded."""

    #: The attempt that reported it (0 unless the trial was retried).
    attempt: int = 0
    type: MetricType
    sequence: int
    value: Any
    timestamp: datetime


class ExperimentView(ExperimentState):
    """An experiment as the API shows it: its state, config secrets masked, trial counts."""

    #: Trials submitted so far.
    trial_count: int = 0
    #: Number of trials by status, e.g. ``{"RUNNING": 4, "SUCCEEDED": 12}``.
    trial_counts: dict[str, int] = Field(default_factory=dict)
    #: Up to 5 trials with the best final metric, best first: ``[{"id": ..., "metric": 0.97}]``.
    best_trials: list[dict[str, Any]] = Field(default_factory=list)


class ExperimentUpdate(NamedTuple):
    """What a change of a running experiment did (``update_experiment``)."""

    experiment: ExperimentView
    #: What changed, camelCase: ``{"trialConcurrency": (2, 4)}``; a value given as it was is left out.
    changes: dict[str, tuple[Any, Any]]


class TrialPage(NamedTuple):
    """One page of an experiment's trials; pass ``next_cursor`` back for the next (None: the last)."""

    trials: list[TrialState]
    next_cursor: str | None


def parse(model: type[M], data: Any) -> M:
    """An answer of the dispatcher as ``model``; one it cannot be is a 502."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise TrialbusError(502, f"unexpected answer from the dispatcher for {model.__name__}: {exc}") from None
