"""Deleting an experiment (services/dispatcher/retention.py): only once it is stopped or done and
its trials have ended; then nothing of it is left, in memory or in KV."""

from __future__ import annotations

import pytest

from contracts.state import TrialStatus
from services.common.api import ApiError
from services.dispatcher.core import Dispatcher
from tests.integration.dispatcher.harness import Driver, dispatcher


async def test_an_experiment_is_deleted_only_once_stopped_with_its_trials_ended(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=1)
    running, _ = await run.submit(2)
    await run.say(running, TrialStatus.RUNNING)
    with pytest.raises(ApiError) as live:
        await core.delete_experiment(run.experiment_id)
    assert live.value.status == 409  # running: stop it first
    await core.stop_experiment(run.experiment_id)
    with pytest.raises(ApiError) as stopping:
        await core.delete_experiment(run.experiment_id)
    assert stopping.value.status == 409 and "1 trial(s) stopping" in stopping.value.message
    await run.say(running, TrialStatus.USER_CANCELED)

    deleted = await core.delete_experiment(run.experiment_id)

    assert deleted == {"id": run.experiment_id, "deleted": True, "trials": 2}
    assert run.experiment_id not in [e["id"] for e in core.list_experiments()]
    with pytest.raises(ApiError) as gone:
        core.trial(running)
    assert gone.value.status == 404
    restarted = await dispatcher(core.bus)  # KV holds nothing of it either
    assert run.experiment_id not in restarted.store.experiments and running not in restarted.store.trials
