"""Files of earlier results, read for ``trialbus experiment import ID -f FILE`` (nnictl experiment import).

Two formats, told apart by the file's suffix (``.csv``; anything else is read as JSON):

* **JSON**, nnictl's: a list of ``{"parameter": {...}, "value": <number or {"default": n, ...}>}``; a value may be
  JSON text (``"0.93"``), as ``nnictl experiment export`` (and ``trialbus experiment export``) write it. Other keys of
  a row (``trialJobId``, ``intermediate``) are dropped.
* **CSV**, as ``nnictl experiment export --type csv`` writes it: a header of parameter names, then the metric's
  columns: ``reward`` (a number metric), or ``default`` and the dict metric's other keys after it (every column from
  ``default`` on, but ``trialJobId``, ``status`` and ``intermediate``, which are dropped). The columns before are
  parameters: a cell is read as JSON when it is JSON (``0.5``, ``true``, ``[1, 2]``), else as text, and an empty
  cell leaves its parameter out (a nested choice's unused branch).

A row whose ``status`` (``trialbus experiment export`` adds it) is not SUCCEEDED is no result: it is skipped and
counted, so an export of an earlier experiment imports as it is.

A row without parameters or a metric is an error naming the file's row (a CSV row by its line), and so is a file
that is missing, empty or neither format; nothing is sent then. The dispatcher checks the rows again
(services/dispatcher/imports.py). O(rows).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

__all__ = ["METRIC_COLUMNS", "read_results"]

#: CSV columns that hold the metric, in the order looked for.
METRIC_COLUMNS = ("default", "reward", "value")
#: CSV columns that are neither a parameter nor the metric (the exports write them).
IGNORED_COLUMNS = frozenset({"trialJobId", "status", "intermediate"})
SUCCEEDED = "SUCCEEDED"


def read_results(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``path`` in nnictl's import format, and how many rows were skipped (a ``status`` other than
    SUCCEEDED); ValueError, saying where, for a file that is not one."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read: {exc}") from None
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; nothing to import")
    rows, skipped = _csv(path, text) if path.suffix.lower() == ".csv" else _json(path, text)
    if not rows:
        why = f" ({skipped} rows of trials that did not succeed)" if skipped else ""
        raise ValueError(f"{path}: no results in the file{why}; nothing to import")
    return rows, skipped


def _json(path: Path, text: str) -> tuple[list[dict[str, Any]], int]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc}); a .csv file is read as CSV") from None
    if not isinstance(data, list):
        raise ValueError(f'{path}: a JSON list of {{"parameter": {{...}}, "value": <number>}} is expected')
    rows, skipped = [], 0
    for number, row in enumerate(data, 1):
        if isinstance(row, dict) and row.get("status", SUCCEEDED) != SUCCEEDED:
            skipped += 1
            continue
        if not isinstance(row, dict) or "parameter" not in row or "value" not in row:
            raise ValueError(f'{path}: row {number} has no "parameter" or no "value": {json.dumps(row)[:80]}')
        value = row["value"]
        if isinstance(value, str):  # nnictl's export writes the metric as JSON text
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(f"{path}: row {number}: the value {value!r:.40} is not a number") from None
        rows.append({"parameter": row["parameter"], "value": value})
    return rows, skipped


def _cell(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _csv(path: Path, text: str) -> tuple[list[dict[str, Any]], int]:
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    metric = next((name for name in METRIC_COLUMNS if name in header), None)
    if metric is None:
        raise ValueError(
            f"{path}: the CSV header has no metric column ({', '.join(METRIC_COLUMNS)}); "
            f"its columns are {', '.join(header)}"
        )
    kept = [name for name in header if name not in IGNORED_COLUMNS]
    # A dict metric's keys follow its default (as the exports write them); a number metric is one column.
    start = kept.index(metric)
    names = [name for name in kept[:start] if name not in METRIC_COLUMNS]
    keys = kept[start:] if metric == "default" else [metric]
    if not names:
        raise ValueError(f"{path}: the CSV header names no parameter before {metric}")
    rows, skipped = [], 0
    for record in reader:
        line = reader.line_num
        if None in record:
            raise ValueError(f"{path}: line {line} has more cells than the header names")
        if (record.get("status") or SUCCEEDED).strip() != SUCCEEDED:
            skipped += 1
            continue
        raw = (record.get(metric) or "").strip()
        number = _cell(raw) if raw else None
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"{path}: line {line}: {metric} is {raw!r}, not a number")
        parameter = {name: _cell(record[name].strip()) for name in names if (record.get(name) or "").strip()}
        if not parameter:
            raise ValueError(f"{path}: line {line} has no parameter value")
        value: Any = number
        if len(keys) > 1:
            value = {key: _cell(record[key].strip()) for key in keys if (record.get(key) or "").strip()}
        rows.append({"parameter": parameter, "value": value})
    return rows, skipped
