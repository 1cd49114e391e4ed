"""A trial's attempts (services/dispatcher/attempts.py): an attempt that failed runs again as the
retry policy says, until its budget is spent; a user's retry of a trial that has ended."""

from __future__ import annotations

import pytest

from contracts.state import ExperimentStatus, TrialStatus
from services.common.api import ApiError
from services.dispatcher.core import Dispatcher
from tests.integration.dispatcher.harness import Driver


async def test_an_infrastructure_failure_runs_again_until_the_budget_is_spent(core: Dispatcher) -> None:
    run = await Driver.start(core, retry={"infrastructure": 2, "backoff": 0})
    [trial] = await run.submit()
    for attempt in (0, 1):
        await run.say(trial, TrialStatus.RUNNING)
        await run.say(trial, TrialStatus.FAILED, failure="infrastructure")
        assert (run.status(trial), run.trial(trial).attempt) == (TrialStatus.WAITING, attempt + 1)
        await core.sweep()  # the back-off is over: the next attempt goes out
        assert run.trial(trial).dispatched

    await run.say(trial, TrialStatus.RUNNING)
    await run.say(trial, TrialStatus.FAILED, failure="infrastructure")

    assert (run.status(trial), run.trial(trial).attempt, run.trial(trial).failure) == (
        TrialStatus.FAILED,
        2,
        "infrastructure",
    )
    assert [a.failure for a in run.trial(trial).attempts] == ["infrastructure", "infrastructure"]


async def test_a_retry_waits_for_its_back_off_while_its_slot_goes_to_the_next_trial(core: Dispatcher) -> None:
    run = await Driver.start(core, retry={"infrastructure": 1, "backoff": 300})
    first, second = await run.submit(2)
    await run.say(first, TrialStatus.FAILED, failure="infrastructure")

    await core.sweep()

    assert (run.status(first), run.trial(first).dispatched, run.trial(first).retry_at is not None) == (
        TrialStatus.WAITING,
        False,
        True,
    )
    assert run.trial(second).dispatched


async def test_the_trial_s_own_failure_is_not_retried_by_default(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()
    await run.say(trial, TrialStatus.FAILED, failure="trial", exit_code=2)
    assert (run.status(trial), run.trial(trial).attempt, run.trial(trial).exit_code) == (TrialStatus.FAILED, 0, 2)


async def test_a_user_retries_an_ended_trial_as_its_next_attempt(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()
    with pytest.raises(ApiError) as running:
        await core.retry_trial(trial)
    assert running.value.status == 409  # only an ended trial can be retried
    await run.say(trial, TrialStatus.FAILED, failure="trial")

    retried = await core.retry_trial(trial)

    assert (retried.id, retried.status, retried.attempt, retried.dispatched) == (trial, TrialStatus.WAITING, 1, True)
    await run.say(trial, TrialStatus.SUCCEEDED)
    assert run.status(trial) == TrialStatus.SUCCEEDED and run.counts() == {"SUCCEEDED": 1}


async def test_no_retry_in_a_stopped_experiment(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()
    await run.say(trial, TrialStatus.SUCCEEDED)
    await core.stop_experiment(run.experiment_id)

    with pytest.raises(ApiError) as stopped:
        await core.retry_trial(trial)

    assert stopped.value.status == 409 and run.experiment()["status"] == ExperimentStatus.STOPPED
