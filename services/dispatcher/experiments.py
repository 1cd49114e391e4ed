"""An experiment's life as its users drive it: created from an NNI v2 config, stopped (its
unfinished trials canceled), closed by its tuner (DONE once its trials have ended), resumed.

Every change runs under the experiment's lock and is written to KV before it is answered.
O(1) per call, except a stop: O(unfinished trials), whose owners are asked in the background.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from contracts import sealing
from contracts.base import utcnow
from contracts.experiment import ExperimentConfig, format_validation_error, secret_paths
from contracts.people import Caller
from contracts.state import ExperimentState, ExperimentStatus, TrialStatus
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher import history, snapshots
from services.dispatcher.ends import Ends
from services.dispatcher.ids import EXPERIMENT_ALPHABET, new_id
from services.dispatcher.queries import find_experiment
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)


class Experiments:
    """Creating, stopping, closing and resuming experiments (the module's docstring); ``locks``: experiment →
    its lock; ``check_timeout``: seconds to wait for the platform's adapter to check a new experiment."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: StateStore,
        slots: Slots,
        ends: Ends,
        locks: Mapping[str, asyncio.Lock],
        check_timeout: float,
    ) -> None:
        self._bus = bus
        self._store = store
        self._slots = slots
        self._ends = ends
        self._locks = locks
        self._check_timeout = check_timeout

    async def create(self, data: Any, owner: Caller | None = None) -> ExperimentState:
        """A new RUNNING experiment of ``owner`` (and their team); None: made by the stack itself."""
        if not isinstance(data, dict):
            raise ApiError(400, "the experiment config must be a JSON object (NNI v2 experiment config)")
        try:
            config = ExperimentConfig.model_validate(data)
        except ValidationError as exc:
            raise ApiError(422, format_validation_error(exc)) from None
        if not sealing.installed() and (held := secret_paths(config)):  # never stored in clear
            raise ApiError(422, f"{sealing.NO_KEY} (this experiment's config holds {', '.join(held)})")
        await history.check_platform(self._bus, config, self._check_timeout)
        code_ref = await snapshots.code_ref_for(self._bus, config)
        if code_ref != config.trial_code_ref:
            config = config.model_copy(update={"trial_code_ref": code_ref})
        experiment_id = new_id(self._store.experiments, 8, EXPERIMENT_ALPHABET)
        state = ExperimentState(
            id=experiment_id,
            config=config,
            code_ref=code_ref,
            start_time=utcnow(),
            owner=owner.name if owner else None,
            team=owner.team if owner else None,
        )
        await self._store.put_experiment(state)
        log.info("experiment %s created (%s, concurrency %d)", experiment_id, config.platform, config.trial_concurrency)
        return state

    async def stop(self, experiment_id: str, message: str | None = None) -> ExperimentState:
        async with self._locks[experiment_id]:
            state = find_experiment(self._store, experiment_id)
            if state.status == ExperimentStatus.RUNNING:
                update = {"status": ExperimentStatus.STOPPED, "end_time": utcnow(), "message": message}
                state = state.model_copy(update=update)
                await self._store.put_experiment(state)
                log.info("experiment %s stopped%s", experiment_id, f": {message}" if message else " by the user")
            reason = f"the experiment was stopped: {message}" if message else "the experiment was stopped"
            await self._ends.cancel_all(self._store.unfinished(experiment_id), TrialStatus.USER_CANCELED, reason)
            return state

    async def close(self, experiment_id: str) -> ExperimentState:
        """The tuner has nothing more to propose: refuse new trials, and be DONE once the submitted ones end."""
        async with self._locks[experiment_id]:
            state = find_experiment(self._store, experiment_id)
            if state.status == ExperimentStatus.RUNNING and not state.no_more_trials:
                state = state.model_copy(update={"no_more_trials": True})
                await self._store.put_experiment(state)
                log.info("experiment %s: the tuner has no more trials", experiment_id)
            await self._ends.finish_if_done(experiment_id)
            return find_experiment(self._store, experiment_id)

    async def resume(self, experiment_id: str) -> ExperimentState:
        """NNI's resume: a STOPPED experiment is RUNNING again and takes trials; the tuner service,
        which drives the RUNNING experiments that have a tuner, claims it and adopts its trials.

        ``maxExperimentDuration`` counts the time the experiment ran, not the time it stood
        stopped, as NNI's ``execDuration`` does (:meth:`ExperimentState.run_time`: the time
        stopped is added up in ``stopped_seconds``).
        ``maxTrialNumber`` counts every trial submitted before, the canceled ones too (NNI's
        ``currSubmittedTrialNum``). A RUNNING experiment is answered as it is (a resume sent
        twice is one resume); one with nothing left to run is refused (409) with the reason:
        DONE, its tuner out of trials, or a limit reached.
        """
        async with self._locks[experiment_id]:
            state = find_experiment(self._store, experiment_id)
            if state.status == ExperimentStatus.RUNNING:
                return state
            now, trials, duration = utcnow(), state.config.max_trial_number, state.config.max_experiment_duration
            why = None
            if state.no_more_trials:
                why = "its tuner had no more trials to propose"
            elif trials is not None and len(self._store.trials_of[experiment_id]) >= trials:
                why = f"it has run maxTrialNumber ({trials}) trials"
            elif duration is not None and state.run_time(now) >= timedelta(seconds=duration):
                why = f"it has run for its maxExperimentDuration ({duration:g}s)"
            elif state.status == ExperimentStatus.DONE:
                why = "it has ended"
            if why is not None:
                raise ApiError(
                    409,
                    f"experiment {experiment_id} is {state.status.value}: {why}, so a resume would run "
                    "nothing; create a new experiment to run more trials",
                )
            stopped_for = now - state.end_time if state.end_time else timedelta(0)
            update = {
                "status": ExperimentStatus.RUNNING,
                "end_time": None,
                "message": None,
                "stopped_seconds": state.stopped_seconds + stopped_for.total_seconds(),
            }
            state = state.model_copy(update=update)
            await self._store.put_experiment(state)
            log.info("experiment %s resumed after %.0fs stopped", experiment_id, stopped_for.total_seconds())
            await self._slots.dispatch_ready(experiment_id)
            return state
