"""Earlier results imported into an experiment, as ``nnictl experiment import`` does (``trialbus experiment
import ID -f results.json|csv``, ``POST /api/v1/experiments/{id}/import``, the ``experiment.import`` operation).

A body is NNI's list of completed trials, ``[{"parameter": {...}, "value": <number or {"default": n, ...}>}, ...]``.
Every row is checked first and the first bad one refused (422, naming the row): nothing is imported unless all
rows are good. Parameters are not checked against the search space: NNI passes them through too, a tuner class may
read its space its own way, and the space can change while the experiment runs (``trialbus update searchspace``);
the built-in tuner skips the rows it cannot model with a warning in the tuner service's log, as it does an adopted
trial outside its space.

Where they are kept: the ``imports`` KV bucket, key = experiment id, the rows of every import in order (appended;
written before the answer, so a tuner that starts later reads them all). The experiment's state carries only their
count (:attr:`~contracts.state.ExperimentState.imported`, in ``GET /api/v1/experiments/{id}``): a change of it is
what tells the tuner service to read the new rows, and the state stays small for everyone who watches it.
Size: at most :data:`MAX_ROWS` rows and :data:`MAX_BYTES` bytes of JSON per experiment (one KV value under NATS's
1 MiB message limit); more is refused with the figures. O(rows) per import, the stored rows read once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from typing import Any

import nats.errors
import orjson
from nats.js.errors import KeyNotFoundError

from contracts import streams
from contracts.state import ExperimentState
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher.queries import find_experiment
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)

#: The most rows an experiment keeps (a few thousand is usual).
MAX_ROWS = 20_000
#: The most bytes of JSON they take: one KV value, within NATS's default 1 MiB message.
MAX_BYTES = 900 * 1024


def check_rows(rows: Any) -> list[dict[str, Any]]:
    """NNI's import rows as the tuners take them: a list of ``{"parameter": object, "value": metric}``, a metric
    being a finite number or an object whose ``default`` is one. O(rows).

    :raises ApiError: 422 naming the first bad row (numbered from 1, as a file's lines are read).
    """
    if not isinstance(rows, list):
        raise ApiError(422, 'the body is a JSON list of {"parameter": {...}, "value": <number>} (nnictl\'s format)')
    if not rows:
        raise ApiError(422, "nothing to import: the list is empty")
    checked = []
    for number, row in enumerate(rows, 1):
        where = f"row {number}"
        if not isinstance(row, Mapping):
            raise ApiError(422, f'{where}: an object {{"parameter": ..., "value": ...}} is expected, got {row!r:.80}')
        if "parameter" not in row or "value" not in row:
            missing = " and ".join(k for k in ("parameter", "value") if k not in row)
            raise ApiError(422, f"{where}: no {missing} (each row has a parameter object and a value)")
        parameter, value = row["parameter"], row["value"]
        if not isinstance(parameter, Mapping) or not parameter:
            raise ApiError(
                422, f"{where}: parameter must be a non-empty object of parameter names, got {parameter!r:.80}"
            )
        default = value.get("default") if isinstance(value, Mapping) else value
        if isinstance(default, bool) or not isinstance(default, int | float) or not math.isfinite(default):
            raise ApiError(
                422,
                f"{where}: value must be a finite number or an object with a numeric default, got {value!r:.80}",
            )
        checked.append({"parameter": dict(parameter), "value": value})
    return checked


class Imports:
    """Imports into experiments (the module's docstring); ``locks``: experiment → its lock."""

    def __init__(self, *, bus: Bus, store: StateStore, locks: Mapping[str, asyncio.Lock]) -> None:
        self._bus = bus
        self._store = store
        self._locks = locks

    async def add(self, experiment_id: str, rows: Any) -> ExperimentState:
        """Append ``rows`` to the experiment's imported results; its state's count then says how many there are."""
        find_experiment(self._store, experiment_id)  # 404 first: a bad body for no experiment is still a 404
        checked = check_rows(rows)
        kv = await self._bus.kv(streams.bucket_name(streams.IMPORTS_BUCKET))
        async with self._locks[experiment_id]:
            state = find_experiment(self._store, experiment_id)
            try:
                before = orjson.loads((await kv.get(experiment_id)).value or b"[]")
            except KeyNotFoundError:
                before = []
            together = before + checked
            data = orjson.dumps(together)
            if len(together) > MAX_ROWS or len(data) > MAX_BYTES:
                raise ApiError(
                    413,
                    f"experiment {experiment_id} would keep {len(together)} imported results ({len(data)} bytes of "
                    f"JSON; {len(before)} imported before): at most {MAX_ROWS} rows and {MAX_BYTES} bytes are kept",
                )
            await kv.put(experiment_id, data)
            state = state.model_copy(update={"imported": len(together)})
            await self._store.put_experiment(state)
        log.info("experiment %s: imported %d earlier results (%d in all)", experiment_id, len(checked), len(together))
        return state

    async def drop(self, experiment_id: str) -> None:
        """A deleted experiment's imported results go with it (the delete is done: a failure is only logged)."""
        try:
            kv = await self._bus.kv(streams.bucket_name(streams.IMPORTS_BUCKET))
            await kv.purge(experiment_id)
        except nats.errors.Error as exc:
            log.warning("experiment %s: its imported results could not be purged: %s", experiment_id, exc)
