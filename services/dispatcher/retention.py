"""Deleting an experiment with everything the bus keeps of it (``trialbus experiment delete``).

A STOPPED or DONE experiment whose trials have all ended can be deleted: its trials' and its
own entries in KV (purged, so the web UI and the tuner see them go), its trial events in
EVENTS and its metric records in METRICS (purged by subject), and what the dispatcher holds
of it in memory. Left to their own expiry: the code snapshot (shared by every experiment of the
same code), the remote adapter's checkpoint copies (7 days) and trial directories on the
platforms (each adapter's retention). O(its trials). Part of
:class:`~services.dispatcher.core.Dispatcher` (a mixin).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from contracts import streams, subjects
from contracts.state import ExperimentStatus
from services.dispatcher.errors import ApiError

if TYPE_CHECKING:
    from services.dispatcher.core import Dispatcher

log = logging.getLogger(__name__)


class Retention:
    """Deleting experiments (the module's docstring)."""

    async def delete_experiment(self: Dispatcher, experiment_id: str) -> dict[str, Any]:
        async with self._locks[experiment_id]:
            state = self.experiment(experiment_id)
            if state.status == ExperimentStatus.RUNNING:
                raise ApiError(409, f"experiment {experiment_id} is running: stop it first "
                                    f"(trialbus experiment stop {experiment_id})")  # fmt: skip
            if unfinished := len(self.store.of(experiment_id).unfinished):
                raise ApiError(409, f"experiment {experiment_id} still has {unfinished} trial(s) stopping; "
                                    "delete it once they have ended")  # fmt: skip
            for stream, subject in ((streams.EVENTS.name, subjects.experiment_events(experiment_id)),
                                    (streams.METRICS.name, subjects.metrics(experiment_id, ">"))):  # fmt: skip
                await self.bus.js.purge_stream(stream, subject=subject)
            for trial_id in self.store.trials_of.get(experiment_id, []):
                self.slots.free(self.store.trials[trial_id])
                self._cancel_sent.pop(trial_id, None)
            trials = await self.store.purge(experiment_id)
            self._by_parameter.pop(experiment_id, None)
            self.fail_fast.forget(experiment_id)
            for table in (self.slots.queue, self.slots.later, self.slots.active):
                table.pop(experiment_id, None)
        self._locks.pop(experiment_id, None)
        log.info("experiment %s deleted, with its %d trial(s), their events and metric records", experiment_id, trials)
        return {"id": experiment_id, "deleted": True, "trials": trials}
