"""Changing a running experiment (``nnictl update``): its ``trialConcurrency``, ``maxTrialNumber``,
``maxExperimentDuration`` and ``searchSpace``, acted on at once. A part of the dispatcher's core.

- **Validated first, all or nothing.** The change is read by :class:`ExperimentChange`, whose fields
  carry the config's own rules (:class:`~contracts.experiment.ExperimentConfig`: positive numbers,
  NNI's duration units); a bad value or an unknown key is a 422 naming it, and nothing changes.
- **Stored in the experiment's config** (KV ``experiments``) before it is answered, so a restarted
  dispatcher keeps it, and the tuner service, which watches that bucket, hears of it at once: a new
  search space goes to the experiment's tuner (``update_search_space``), a new concurrency sizes
  its proposals.
- **Acted on at once.** More concurrency dispatches the queued trials into the new slots now; less
  lets the running ones finish and dispatches none beyond it. ``maxTrialNumber`` is what
  submissions are checked against, ``maxExperimentDuration`` what the sweep checks every second
  (the deadline follows from it: start + the new duration + the time stood stopped).
- A RUNNING or STOPPED experiment may change (a STOPPED one's new limits hold when it resumes: raise
  ``maxTrialNumber`` to resume one that ran out); one that ended is a 409.

O(1) per change plus the trials it dispatches (at most the new free slots).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError, field_validator

from contracts.changes import change_line
from contracts.experiment import format_validation_error
from contracts.nni import NniModel
from contracts.state import ExperimentState, ExperimentStatus
from contracts.units import parse_seconds
from services.common import openapi as doc
from services.common.api import ApiError
from services.dispatcher.ends import Ends
from services.dispatcher.queries import find_experiment
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)

#: What may change, as the API spells it.
FIELDS = ("trialConcurrency", "maxTrialNumber", "maxExperimentDuration", "searchSpace")
#: The statuses whose experiments may change.
CHANGEABLE = (ExperimentStatus.RUNNING, ExperimentStatus.STOPPED)


#: The body, as the OpenAPI schema documents it (``PATCH /experiments/{id}``).
BODY = doc.json_body(
    {
        "type": "object",
        "properties": {
            "trialConcurrency": {"type": "integer", "exclusiveMinimum": 0, "description": "trials at once"},
            "maxTrialNumber": {
                "type": "integer",
                "exclusiveMinimum": 0,
                "description": "trials in all (not below those submitted already)",
            },
            "maxExperimentDuration": {
                "anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string", "examples": ["30m", "2h"]}],
                "description": "seconds, or NNI's units (s, m, h, d)",
            },
            "searchSpace": {"type": "object", "description": "NNI's search space; the tuner proposes from it next"},
        },
        "additionalProperties": False,
        "minProperties": 1,
    },
    "what to change (fields left out keep their value)",
)


class ExperimentChange(NniModel):
    """The fields of :class:`~contracts.experiment.ExperimentConfig` that may change while it runs,
    with the same rules; a field left out does not change."""

    trial_concurrency: int | None = Field(default=None, gt=0)
    max_trial_number: int | None = Field(default=None, gt=0)
    #: Seconds; NNI unit strings like ``2h`` are accepted, as in the config.
    max_experiment_duration: float | None = Field(default=None, gt=0)
    search_space: dict[str, Any] | None = None

    _durations = field_validator("max_experiment_duration", mode="before")(
        lambda v: None if v is None else parse_seconds(v)
    )

    @field_validator("search_space")
    @classmethod
    def _space(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """The shape NNI's search spaces have; what the tuner makes of it is the tuner's to check
        (``trialbus update searchspace`` checks it before sending, as ``experiment run`` does)."""
        if value is None:
            return None
        if not value:
            raise ValueError("the search space is empty: give at least one parameter")
        for name, spec in value.items():  # O(parameters)
            if not isinstance(spec, dict) or "_type" not in spec:
                raise ValueError(
                    f'parameter {name!r} needs a "_type" (and a "_value"), e.g. '
                    '{"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}}'
                )
        return value


def parse_change(data: Any) -> dict[str, Any]:
    """The config fields ``data`` changes (snake_case → value), or a 422 that says what is wrong."""
    if not isinstance(data, dict):
        raise ApiError(422, f"the change must be a JSON object with any of {', '.join(FIELDS)}")
    try:
        change = ExperimentChange.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, format_validation_error(exc, "change") + f" (may change: {', '.join(FIELDS)})") from None
    given = {name: getattr(change, name) for name in ExperimentChange.model_fields if name in change.model_fields_set}
    if not given:
        raise ApiError(422, f"nothing to change: give any of {', '.join(FIELDS)}")
    if empty := [ExperimentChange.model_fields[name].alias or name for name, value in given.items() if value is None]:
        raise ApiError(422, f"{', '.join(sorted(empty))} cannot be null: give the new value")
    return given


class Updates:
    """Applies changes to experiments (the module's docstring); ``locks``: experiment → its lock."""

    def __init__(self, *, store: StateStore, slots: Slots, ends: Ends, locks: Mapping[str, asyncio.Lock]) -> None:
        self._store = store
        self._slots = slots
        self._ends = ends
        self._locks = locks

    async def update(self, experiment_id: str, data: Any) -> tuple[ExperimentState, dict[str, tuple[Any, Any]]]:
        """Apply ``data`` (camelCase, as :data:`FIELDS`); the experiment as it is now and what
        changed, ``{"trialConcurrency": (2, 4)}`` (a value given as it was is not a change)."""
        given = parse_change(data)
        async with self._locks[experiment_id]:
            state = find_experiment(self._store, experiment_id)
            if state.status not in CHANGEABLE:
                raise ApiError(
                    409,
                    f"experiment {experiment_id} is {state.status.value}: it has ended, so there is nothing to "
                    "change; create a new experiment (trialbus experiment create) to run more trials",
                )
            submitted = len(self._store.trials_of[experiment_id])
            if (limit := given.get("max_trial_number")) is not None and limit < submitted:
                raise ApiError(
                    422,
                    f"maxTrialNumber {limit} is below the {submitted} trials experiment {experiment_id} "
                    f"has submitted already: give {submitted} or more",
                )
            config = state.config
            changed = {
                name: (getattr(config, name), value) for name, value in given.items() if getattr(config, name) != value
            }
            if changed:
                update = {name: new for name, (_, new) in changed.items()}
                state = state.model_copy(update={"config": config.model_copy(update=update)})
                await self._store.put_experiment(state)
                log.info("experiment %s changed: %s", experiment_id, describe(changed))
            if state.status == ExperimentStatus.RUNNING:
                await self._slots.dispatch_ready(experiment_id)  # more slots: filled now
                await self._ends.finish_if_done(experiment_id)  # a limit now reached with nothing left running
                state = find_experiment(self._store, experiment_id)
        return state, {_camel(name): values for name, values in changed.items()}


def answer(view: dict[str, Any], changed: Mapping[str, tuple[Any, Any]]) -> dict[str, Any]:
    """What the APIs answer: the experiment's view and what changed, ``{"trialConcurrency": {"from": 2, "to": 4}}``."""
    return {"experiment": view, "changes": {name: {"from": old, "to": new} for name, (old, new) in changed.items()}}


def _camel(name: str) -> str:
    return ExperimentChange.model_fields[name].alias or name


def describe(changed: Mapping[str, tuple[Any, Any]]) -> str:
    """``trialConcurrency 2 → 4, searchSpace x: uniform [0, 1] → uniform [2, 3]``: a change in a line (the log,
    the audit trail; :mod:`contracts.changes`)."""
    parts = []
    for name, (old, new) in changed.items():
        label = _camel(name) if name in ExperimentChange.model_fields else name
        parts.append(change_line(label, old, new))
    return ", ".join(parts) or "nothing changed"
