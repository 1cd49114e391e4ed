"""Submitting trials (services/dispatcher/submissions.py): a submit sent again is the same trial,
sequence ids count every submit, and what the experiment refuses is refused with its reason."""

from __future__ import annotations

import pytest

from contracts.state import TrialStatus
from services.common.api import ApiError
from services.dispatcher.core import Dispatcher
from tests.integration.dispatcher.harness import Driver, dispatcher


async def test_a_submit_sent_again_is_the_same_trial(core: Dispatcher) -> None:
    run = await Driver.start(core)
    first = await core.submit_trial(run.experiment_id, {"lr": 0.1}, parameter_id=7)

    again = await core.submit_trial(run.experiment_id, {"lr": 0.1}, parameter_id=7)
    other = await core.submit_trial(run.experiment_id, {"lr": 0.2}, parameter_id=7)  # not the same submit

    assert again.id == first.id and other.id != first.id
    assert (first.sequence_id, other.sequence_id, run.counts()) == (0, 1, {"WAITING": 2})


async def test_a_submit_sent_again_after_a_restart_is_the_same_trial(core: Dispatcher) -> None:
    run = await Driver.start(core)
    first = await core.submit_trial(run.experiment_id, {"lr": 0.1}, parameter_id="p1")

    restarted = await dispatcher(core.bus)  # a new dispatcher, from what KV holds
    again = await restarted.submit_trial(run.experiment_id, {"lr": 0.1}, parameter_id="p1")

    assert again.id == first.id and len(restarted.store.trials_of[run.experiment_id]) == 1


@pytest.mark.parametrize(("parameters", "parameter_id"), [([1, 2], None), ({"lr": 1}, True), ({"lr": 1}, 1.5)])
async def test_malformed_submits_are_refused(core: Dispatcher, parameters, parameter_id) -> None:
    run = await Driver.start(core)
    with pytest.raises(ApiError) as refused:
        await core.submit_trial(run.experiment_id, parameters, parameter_id)
    assert refused.value.status == 422 and run.counts() == {}


async def test_a_submit_to_an_unknown_experiment_is_a_404(core: Dispatcher) -> None:
    with pytest.raises(ApiError) as unknown:
        await core.submit_trial("nosuchexp", {"lr": 1})
    assert unknown.value.status == 404


async def test_submits_beyond_the_free_slots_wait_in_order(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=2)
    trials = await run.submit(4)

    dispatched = [run.trial(t).dispatched for t in trials]

    assert dispatched == [True, True, False, False]
    assert all(run.status(t) == TrialStatus.WAITING for t in trials)
    page = core.list_trials(run.experiment_id, limit=3)
    assert [t["id"] for t in page["trials"]] == trials[:3] and page["nextCursor"]
