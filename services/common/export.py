"""An experiment's trials as ``nnictl experiment export`` writes them, in JSON or CSV: for
``trialbus experiment export`` (through :mod:`trialbus.export`) and the web UI's download.

NNI's export (``nnictl_utils.export_trials_data`` over the manager's ``/export-data``):

- **JSON**: a list of ``{"parameter": {…}, "value": "<the final result, as JSON text>", "trialJobId": "…"}``
  (``value`` is text, as NNI stores it: ``"0.93"``, ``"{\\"default\\": 0.93, \\"loss\\": 0.2}"``), with
  ``"intermediate": ["<JSON text>", …]`` under ``--intermediate``;
- **CSV**: a row per trial: a column per parameter, then the final result's keys when it is a dict
  (else one column ``reward``), ``trialJobId``, and ``intermediate`` (``[0.5,0.7]``) when asked.

Trialbus writes the same keys and columns and adds each trial's ``status``. NNI lists only the
trials that reported a final result; Trialbus lists every trial, in sequence order, one without a
final result with ``"value": null`` (empty cells in CSV): keep ``status == "SUCCEEDED"`` for NNI's set.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

from contracts import TrialState

#: The columns after the parameters and the final result's, in this order.
TAIL = ("trialJobId", "status", "intermediate")


def records(trials: Sequence[TrialState], intermediate: Mapping[str, list[Any]] | None = None) -> list[dict[str, Any]]:
    """One NNI export record per trial, by sequence id; ``intermediate`` (trial → its intermediate
    results, decoded, in order) adds NNI's ``intermediate`` key."""
    found = []
    for trial in sorted(trials, key=lambda t: t.sequence_id):
        record: dict[str, Any] = {
            "parameter": trial.parameters,
            "value": None if trial.final_metric is None else json.dumps(trial.final_metric),
            "trialJobId": trial.id,
            "status": trial.status.value,
        }
        if intermediate is not None:
            record["intermediate"] = [json.dumps(value) for value in intermediate.get(trial.id, [])]
        found.append(record)
    return found


def as_json(exported: list[dict[str, Any]]) -> str:
    return json.dumps(exported) + "\n"


def as_csv(exported: list[dict[str, Any]]) -> str:
    """NNI's rows: ``{**parameters, **final result (or reward), trialJobId}``, plus ``status``."""
    rows, parameters, results = [], {}, {}
    for record in exported:
        row = {name: _cell(value) for name, value in record["parameter"].items()}
        parameters.update(dict.fromkeys(row))
        value = None if record["value"] is None else json.loads(record["value"])
        result = {k: _cell(v) for k, v in value.items()} if isinstance(value, dict) else {"reward": _cell(value)}
        if value is not None:
            row.update(result)
            results.update(dict.fromkeys(result))
        row.update(trialJobId=record["trialJobId"], status=record["status"])
        if "intermediate" in record:
            row["intermediate"] = "[" + ",".join(record["intermediate"]) + "]"
        rows.append(row)
    tail = [name for name in TAIL if any(name in row for row in rows)] or list(TAIL[:2])
    columns = [*parameters, *(name for name in results if name not in parameters), *tail]
    out = io.StringIO()
    writer = csv.DictWriter(out, columns)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _cell(value: Any) -> Any:
    """What a CSV cell shows: numbers and text as they are, lists and objects as JSON."""
    return json.dumps(value) if isinstance(value, list | dict) else value
