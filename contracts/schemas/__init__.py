"""JSON Schemas of every wire contract, generated from the models and committed.

Regenerate with ``make schemas`` (``python -m contracts.schemas``); ``tests/unit/test_schemas.py``
fails when a committed schema differs from its model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from contracts.asks import Answer, Ask
from contracts.experiment import ExperimentConfig
from contracts.messages import (
    CancelReply,
    CancelRequest,
    DrainReply,
    DrainRequest,
    LogReply,
    LogRequest,
    MetricRecord,
    PlatformStatus,
    TrialEvent,
    TrialRequest,
)
from contracts.metrics import MetricBatch
from contracts.state import ExperimentState, TrialState

HERE = Path(__file__).parent

#: file name → model; the file names are part of the public contract.
MODELS: dict[str, type[BaseModel]] = {
    "experiment-config": ExperimentConfig,
    "experiment-state": ExperimentState,
    "trial-state": TrialState,
    "trial-request": TrialRequest,
    "trial-event": TrialEvent,
    "metric-record": MetricRecord,
    "metric-batch": MetricBatch,
    "cancel-request": CancelRequest,
    "cancel-reply": CancelReply,
    "log-request": LogRequest,
    "log-reply": LogReply,
    "drain-request": DrainRequest,
    "drain-reply": DrainReply,
    "platform-status": PlatformStatus,
    "trial-ask": Ask,
    "trial-answer": Answer,
}


def render(model: type[BaseModel]) -> str:
    schema = _closed(model.model_json_schema(by_alias=True, mode="serialization"))
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def _closed(node: Any) -> Any:
    """Writers must not add fields (readers tolerate them): every object is closed.

    Applied to every object so the output is the same whether or not the models were
    imported in strict mode.
    """
    if isinstance(node, dict):
        node = {key: _closed(value) for key, value in node.items()}
        if "properties" in node:
            node["additionalProperties"] = False
    elif isinstance(node, list):
        node = [_closed(value) for value in node]
    return node


def write_all() -> list[Path]:
    written = []
    for name, model in MODELS.items():
        path = HERE / f"{name}.schema.json"
        path.write_text(render(model))
        written.append(path)
    return written
