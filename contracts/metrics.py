"""Metric records on the bus: one message per record (``trial.metric``, :class:`MetricRecord`) or,
from the gateway, one message per keeper batch (``trial.metrics``, :class:`MetricBatch`).

A batch is what one keeper POSTed for one trial and attempt: it crosses the gateway, NATS and
every reader as one message, so the per-message cost of the bus (the limit at ~15,000
records/s when each record was its own message) is paid once per batch. Readers never handle
the two forms apart: :func:`records_of` turns either into records.

Exactly once per record. A batch's ``Nats-Msg-Id`` (:func:`batch_id`) names its records, so a
batch resent as it was is dropped by JetStream as a record was. A keeper that resends after a
failure may group its records differently (a spooled batch joined by newer records): then the
records of the overlap are in two messages, and readers that must see each record once drop
the repeats by record id (:func:`~contracts.subjects.metric_id`; :class:`Seen` keeps the highest
sequence per trial, attempt and type, since a keeper sends each channel in order). What the
dispatcher folds from records (the highest sequence, the final value) is the same either way.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

import orjson
from pydantic import Field, TypeAdapter

from contracts.base import FROM_BUS, Contract, ContractError
from contracts.messages import MetricRecord, MetricType

BATCH_KIND = "trial.metrics"


class BatchedRecord(Contract):
    """One record of a :class:`MetricBatch`: what differs from record to record."""

    parameter_id: int | str | None = None
    type: MetricType
    #: 0, 1, 2… for PERIODICAL; always 0 for FINAL (NNI's numbering).
    sequence: int = Field(ge=0)
    #: The value as the NNI SDK encoded it (json_tricks text): what NNI tuners receive.
    value: str


class MetricBatch(Contract):
    """``metrics.<experiment>.<trial>``: the records one keeper sent in one request, in order.
    Dedupe id: :func:`batch_id`."""

    kind: Literal["trial.metrics"] = "trial.metrics"
    v: Literal[1] = 1
    experiment_id: str
    trial_id: str
    #: The attempt that reported them (each attempt of a trial numbers its records from 0 again).
    attempt: int = Field(default=0, ge=0)
    #: When the gateway accepted them.
    timestamp: datetime
    records: list[BatchedRecord] = Field(min_length=1)


_RECORDS = TypeAdapter(list[MetricRecord])


def records_of(data: bytes, only: MetricType | None = None) -> list[MetricRecord]:
    """The records in one METRICS message, whichever its form, each validated as a
    ``MetricRecord`` (~3 µs a record: 3× less than through :class:`MetricBatch` and a record
    built from each); raises ContractError. ``only``: just the records of that type (the
    others are left unvalidated: a reader that waits for FINALs)."""
    if b'"trial.metrics"' not in data[:40]:  # the kind comes first (encode keeps field order)
        record = MetricRecord.decode(data)
        return [record] if only is None or record.type is only else []
    try:
        raw = raw_records_of(data)
        if only is not None:
            raw = [r for r in raw if r.get("type") == only.value]
        return _RECORDS.validate_python([{**r, "kind": "trial.metric", "v": 1} for r in raw], context=FROM_BUS)
    except (ValueError, KeyError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise ContractError(f"invalid MetricBatch: {exc}") from exc


def raw_records_of(data: bytes) -> list[dict[str, Any]]:
    """The records in one METRICS message as plain dicts with ``MetricRecord``'s wire keys
    (``trialId``, ``attempt``, ``type``, ``sequence``, ``value``…), without model validation:
    for readers that look at a few fields of every record (the dispatcher). Raises ValueError."""
    message = orjson.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a metric message is a JSON object")
    if message.get("kind") == "trial.metric":
        return [message]
    if message.get("kind") != BATCH_KIND or not isinstance(message.get("records"), list):
        raise ValueError(f"not a metric record or batch: kind {message.get('kind')!r}")
    shared = {
        "experimentId": message["experimentId"],
        "trialId": message["trialId"],
        "attempt": message.get("attempt", 0),
        "timestamp": message.get("timestamp"),
    }
    return [{**shared, **record} for record in message["records"]]


def batch_id(trial: str, attempt: int, records: Iterable[tuple[str, int]]) -> str:
    """``Nats-Msg-Id`` of a batch of ``(type, sequence)`` records, in order: the same records
    give the same id (a resent batch is dropped), different ones a different id. The records
    are named by their first and last and a digest of all (a batch holds up to thousands)."""
    keys = [f"{t[0]}{s}" for t, s in records]
    if not keys:
        raise ContractError("a metric batch holds at least one record")
    digest = zlib.crc32(",".join(keys).encode()) if len(keys) > 2 else 0  # the same in every process
    return f"{trial}:{attempt}:{keys[0]}-{keys[-1]}:{len(keys)}:{digest:08x}"


class Seen:
    """Which records a reader has had, to take each once (see the module docstring): the highest
    sequence per trial, attempt and type. O(1) per record; memory per trial and attempt."""

    def __init__(self) -> None:
        self._last: dict[str, dict[tuple[int, str], int]] = {}  # trial → (attempt, type) → sequence

    def first_time(self, record: MetricRecord) -> bool:
        trial = self._last.get(record.trial_id)
        if trial is None:
            trial = self._last[record.trial_id] = {}
        key = (record.attempt, record.type.value)
        if record.sequence <= trial.get(key, -1):
            return False
        trial[key] = record.sequence
        return True
