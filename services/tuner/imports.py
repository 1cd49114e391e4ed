"""An experiment's imported earlier results (``trialbus experiment import``), as the dispatcher keeps them: the
``imports`` KV bucket, key = experiment id, a JSON list of NNI's ``{"parameter", "value"}`` rows in import order
(services/dispatcher/imports.py). The experiment's state counts them (``imported``); a driver reads them when it
starts and when that count grows (:mod:`services.tuner.driver`). One KV get, O(rows)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from nats.js.errors import KeyNotFoundError

from contracts import streams
from services.common.bus import Bus

__all__ = ["Reader", "reader"]

Reader = Callable[[], Awaitable[list[dict[str, Any]]]]
"""Reads an experiment's imported rows, all of them, in import order."""


def reader(bus: Bus, experiment_id: str) -> Reader:
    """The :data:`Reader` of ``experiment_id``'s imported rows (none: an empty list)."""

    async def read() -> list[dict[str, Any]]:
        kv = await bus.kv(streams.bucket_name(streams.IMPORTS_BUCKET))
        try:
            entry = await kv.get(experiment_id)
        except KeyNotFoundError:
            return []
        rows = orjson.loads(entry.value or b"[]")
        return rows if isinstance(rows, list) else []

    return read
