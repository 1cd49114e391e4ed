"""Deleting an experiment with everything the bus keeps of it (``trialbus experiment delete``).

A STOPPED or DONE experiment whose trials have all ended can be deleted: its trials' and its
own entries in KV (purged, so the web UI and the tuner see them go), its trial events in
EVENTS and its metric records in METRICS (purged by subject), and what the dispatcher holds
of it in memory. Left to their own expiry: the code snapshot (shared by every experiment of the
same code), the remote adapter's checkpoint copies (7 days) and trial directories on the
platforms (each adapter's retention). O(its trials). What the other parts hold of it is
forgotten through ``forget(experiment_id, trials)`` once it is purged, under the experiment's lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from contracts import streams, subjects
from contracts.state import ExperimentStatus, TrialState
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher.queries import find_experiment
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)


class Retention:
    """Deleting experiments (the module's docstring); ``locks``: experiment → its lock (dropped with it)."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: StateStore,
        locks: dict[str, asyncio.Lock],
        forget: Callable[[str, list[TrialState]], None],
    ) -> None:
        self._bus = bus
        self._store = store
        self._locks = locks
        self._forget = forget

    async def delete(self, experiment_id: str) -> dict[str, Any]:
        async with self._locks[experiment_id]:
            state = find_experiment(self._store, experiment_id)
            if state.status == ExperimentStatus.RUNNING:
                raise ApiError(
                    409,
                    f"experiment {experiment_id} is running: stop it first (trialbus experiment stop {experiment_id})",
                )
            if unfinished := len(self._store.of(experiment_id).unfinished):
                raise ApiError(
                    409,
                    f"experiment {experiment_id} still has {unfinished} trial(s) stopping; "
                    "delete it once they have ended",
                )
            for stream, subject in (
                (streams.EVENTS, subjects.experiment_events(experiment_id)),
                (streams.METRICS, subjects.metrics(experiment_id, ">")),
                (streams.LOGS, subjects.logs(experiment_id)),
            ):
                await self._bus.js.purge_stream(streams.stream_name(stream), subject=subject)
            ended = self._store.trials_for(experiment_id)  # all ended: nothing holds a slot
            trials = await self._store.purge(experiment_id)
            self._forget(experiment_id, ended)
        self._locks.pop(experiment_id, None)
        log.info("experiment %s deleted, with its %d trial(s), their events and metric records", experiment_id, trials)
        return {"id": experiment_id, "deleted": True, "trials": trials}
