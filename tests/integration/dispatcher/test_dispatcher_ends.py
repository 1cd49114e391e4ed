"""How trials end and experiments with them (services/dispatcher/ends.py, experiments.py): a
cancel before dispatch ends the trial at once, one after asks its owner; a stopped experiment
cancels what is unfinished; an experiment is DONE once it takes no more trials and all ended."""

from __future__ import annotations

import asyncio

import pytest

from contracts import subjects
from contracts.state import ExperimentStatus, TrialStatus
from services.common.api import ApiError
from services.dispatcher.core import Dispatcher
from tests.integration.dispatcher.harness import ADAPTER, Driver


async def test_a_trial_canceled_before_it_is_dispatched_ends_at_once(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=1)
    first, second = await run.submit(2)

    canceled = await core.cancel_trial(second)

    assert canceled.status == TrialStatus.USER_CANCELED and run.status(second) == TrialStatus.USER_CANCELED
    with pytest.raises(ApiError) as again:
        await core.cancel_trial(second)
    assert again.value.status == 409
    assert run.status(first) == TrialStatus.WAITING and run.trial(first).dispatched


async def test_a_trial_canceled_while_its_request_is_unclaimed_ends_and_its_slot_is_taken(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=1)
    first, second = await run.submit(2)

    await core.cancel_trial(first)  # no replica took its request yet: withdrawn from the stream

    assert run.status(first) == TrialStatus.USER_CANCELED and run.trial(second).dispatched


async def test_a_running_trial_is_canceled_by_its_owner(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()
    await run.say(trial, TrialStatus.RUNNING)
    asked = await core.bus.nc.subscribe(subjects.control(ADAPTER, "cancel"))

    canceled = await core.cancel_trial(trial)

    assert (canceled.status, canceled.cancel_status) == (TrialStatus.RUNNING, TrialStatus.USER_CANCELED)
    assert trial.encode() in (await asked.next_msg(timeout=2)).data
    await run.say(trial, TrialStatus.USER_CANCELED)  # the owner stopped it
    assert run.status(trial) == TrialStatus.USER_CANCELED


async def test_a_stopped_experiment_cancels_its_unfinished_trials_and_takes_no_more(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=1)
    running, waiting = await run.submit(2)
    await run.say(running, TrialStatus.RUNNING)
    asked = await core.bus.nc.subscribe(subjects.control(ADAPTER, "cancel"))

    stopped = await core.stop_experiment(run.experiment_id, "enough")

    assert (stopped.status, stopped.message) == (ExperimentStatus.STOPPED, "enough")
    assert run.status(waiting) == TrialStatus.USER_CANCELED
    assert run.trial(running).cancel_status == TrialStatus.USER_CANCELED
    await asked.next_msg(timeout=2)  # its owner is asked in the background
    with pytest.raises(ApiError) as refused:
        await run.submit()
    assert refused.value.status == 409
    await run.say(running, TrialStatus.USER_CANCELED)
    assert run.counts() == {"USER_CANCELED": 2}


async def test_a_closed_experiment_is_done_once_its_trials_have_ended(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=2)
    first, second = await run.submit(2)

    await core.close_experiment(run.experiment_id)
    await run.say(first, TrialStatus.SUCCEEDED)
    assert run.experiment()["status"] == ExperimentStatus.RUNNING  # one trial still runs
    await run.say(second, TrialStatus.FAILED, failure="trial")

    assert run.experiment()["status"] == ExperimentStatus.DONE


async def test_max_trial_number_refuses_more_trials_and_ends_the_experiment(core: Dispatcher) -> None:
    run = await Driver.start(core, maxTrialNumber=1)
    [trial] = await run.submit()
    with pytest.raises(ApiError) as refused:
        await run.submit()
    assert refused.value.status == 409 and "maxTrialNumber" in refused.value.message

    await run.say(trial, TrialStatus.SUCCEEDED)

    assert run.experiment()["status"] == ExperimentStatus.DONE


async def test_a_stopped_experiment_resumes_and_runs_its_queued_trials(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=1)
    await core.stop_experiment(run.experiment_id)

    resumed = await core.resume_experiment(run.experiment_id)
    [trial] = await run.submit()

    assert resumed.status == ExperimentStatus.RUNNING and run.trial(trial).dispatched


async def test_first_trials_failing_alike_stop_the_experiment_with_their_error(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=2, failFast=2)
    missing = "ModuleNotFoundError: No module named 'sklearn'"
    for trial in await run.submit(2):
        await run.say(trial, TrialStatus.FAILED, failure="trial", exit_code=1, last_error=missing)

    for _ in range(100):  # the guard stops it as a user's stop does, in the background
        if run.experiment()["status"] == ExperimentStatus.STOPPED:
            break
        await asyncio.sleep(0.02)
    assert run.experiment()["status"] == ExperimentStatus.STOPPED and missing in run.experiment()["message"]
