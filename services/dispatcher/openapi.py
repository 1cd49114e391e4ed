"""What the dispatcher's REST routes read and answer, for their OpenAPI declarations.

The routes read their bodies themselves (size limit, ``Content-Type`` check, then JSON), so
FastAPI cannot describe the bodies; this module does, from the same models that validate them:
the experiment config is :class:`~contracts.experiment.ExperimentConfig` with each platform's
``trainingService`` (:data:`~contracts.experiment.PLATFORMS`). ``GET /api/openapi.json`` serves
the result, and ``make fuzz`` drives every route from it.
"""

from __future__ import annotations

from typing import Any

from contracts.experiment import PLATFORMS, ExperimentConfig
from contracts.state import TrialStatus
from contracts.units import MAX_SECONDS
from services.common import openapi as doc

#: What ``POST /api/v1/code`` takes: a tar.gz of the code directory.
CODE_TYPES = ("application/gzip", "application/x-gzip", "application/octet-stream")

_DURATION = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS, "description": "seconds"},
        {"type": "string", "description": "an NNI duration: a number and a unit, e.g. 30s, 10m, 1.5h, 2d"},
        {"type": "null"},
    ]
}
_GPU_INDICES = {
    "anyOf": [
        {"type": "array", "items": {"type": "integer", "minimum": 0}},
        {"type": "integer", "minimum": 0},
        {"type": "string", "description": "comma-separated, e.g. '0,2'"},
        {"type": "null"},
    ]
}


def _training_service(schema: dict[str, Any]) -> dict[str, Any]:
    schema = _accepting_nni_forms(schema)
    schema["required"] = sorted({"platform", *schema.get("required", [])})
    return schema


def _accepting_nni_forms(schema: Any) -> Any:
    """The forms NNI accepts besides the models' types: duration strings, ``gpuIndices`` as an int or '0,2'."""
    if isinstance(schema, list):
        return [_accepting_nni_forms(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _accepting_nni_forms(value) for key, value in schema.items()}
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for name in ("maxExperimentDuration", "maxTrialDuration", "preparingTimeout"):
            if name in properties:
                properties[name] = {**_DURATION, "title": properties[name].get("title", name)}
        if "gpuIndices" in properties:
            properties["gpuIndices"] = dict(_GPU_INDICES)
    return schema


def experiment_config() -> dict[str, Any]:
    """The body of ``POST /api/v1/experiments``: an NNI v2 experiment config as JSON."""
    schema = _accepting_nni_forms(doc.model_schema(ExperimentConfig))
    schema["properties"]["trainingService"] = {
        "description": "where trials run: one platform's settings, chosen by `platform`",
        "oneOf": [_training_service(doc.model_schema(model)) for model in PLATFORMS.values()],
    }
    schema["description"] = (
        "An NNI v2 experiment config (nni/experiment/config), as JSON. Keys match ignoring case and underscores, "
        "as NNI's do (trial_command = trialCommand); unknown keys are refused naming them. trialCommand may be left "
        "out for platform frameworkcontroller (each task role has its command). trialCodeDirectory is read on the "
        "dispatcher's host; elsewhere, upload the code (POST /api/v1/code) and pass trialCodeRef."
    )
    return schema


TRIAL_SUBMISSION: dict[str, Any] = {
    "type": "object",
    "properties": {
        "parameters": {"type": "object", "description": 'the trial\'s hyperparameters, e.g. {"lr": 0.01}'},
        "parameterId": {
            "anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}],
            "description": "the tuner's id of these parameters (default: the trial's sequence id); resending the "
            "same parameterId with the same parameters returns the first trial",
        },
    },
    "required": ["parameters"],
    "additionalProperties": False,
}

CODE_REF = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
CREATED_EXPERIMENT = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
CREATED_CODE = {"type": "object", "properties": {"codeRef": CODE_REF}, "required": ["codeRef"]}
_STATUS = {"type": "string", "enum": [status.value for status in TrialStatus]}
SUBMITTED_TRIAL = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "sequenceId": {"type": "integer"}, "status": _STATUS},
    "required": ["id", "sequenceId", "status"],
}
CANCELED_TRIAL = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "status": _STATUS},
    "required": ["id", "status"],
}
DRAINED = {
    "type": "object",
    "required": ["replica", "draining", "preempted"],
    "properties": {
        "replica": {"type": "string"},
        "draining": {"type": "boolean"},
        "preempted": {"type": "integer", "description": "trials it began to stop"},
    },
}
RETRIED_TRIAL = {
    "type": "object",
    "required": ["id", "status", "attempt"],
    "properties": {"id": {"type": "string"}, "status": _STATUS, "attempt": {"type": "integer"}},
}

_NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,31}$"}
_ROLE = {"type": "string", "enum": ["admin", "member", "viewer"]}
USER = {
    "type": "object",
    "required": ["name", "team"],
    "additionalProperties": False,
    "properties": {"name": _NAME, "team": _NAME, "role": {**_ROLE, "default": "member"}},
}
ADDED_USER = {
    "type": "object",
    "required": ["name", "team", "role", "token"],
    "properties": {
        "name": _NAME,
        "team": _NAME,
        "role": _ROLE,
        "token": {"type": "string", "description": "shown this once: only its SHA-256 is kept"},
    },
}

_QUOTA_FIELDS: dict[str, Any] = {
    "gpus": {"type": ["number", "null"], "minimum": 0, "description": "GPUs guaranteed (null: none)"},
    "trials": {"type": ["integer", "null"], "minimum": 0, "description": "trials at once guaranteed"},
}
_QUOTA = {"type": "object", "additionalProperties": False, "properties": _QUOTA_FIELDS}
TEAM = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **_QUOTA_FIELDS,
        "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000, "default": 1},
        "platforms": {
            "type": "object",
            "additionalProperties": _QUOTA,
            "description": "quotas per platform (adapter name), replacing gpus and trials there",
        },
    },
}

#: Every route of ``/api/v1`` may be refused by the authorisation (400 Host, 401 token), a state
#: change also by 403 (Origin, read-only token); 422 is a parameter that does not parse.
READ = (400, 401, 422)
CHANGE = (400, 401, 403, 422)
#: Why ``GET /trials/{id}/log`` answers 503: the log is on the trial's host, which its adapter reads.
NO_ADAPTER = {503: "no replica of the trial's adapter is running to read its log; retry once one is"}

experiment_body = doc.json_body(experiment_config(), "the experiment config")
trial_body = doc.json_body(TRIAL_SUBMISSION, "the trial to submit")
user_body = doc.json_body(USER, "the user to add")
team_body = doc.json_body(TEAM, "the team's quota and weight (fields left out keep their value)")
code_body = doc.binary_body(CODE_TYPES, "a tar.gz of the trial code directory (safe member names only)")
