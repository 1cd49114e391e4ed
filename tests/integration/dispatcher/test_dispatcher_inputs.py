"""The adapters' events and the keepers' metric records as the dispatcher applies them
(services/dispatcher/inputs.py): only the trial's own adapter, only its current attempt,
only the replica that started it, each input once."""

from __future__ import annotations

from contracts import subjects
from contracts.state import TrialStatus
from services.dispatcher.core import Dispatcher
from services.dispatcher.folds import MetricFold
from tests.integration.dispatcher.harness import ADAPTER, Driver


async def test_a_trial_runs_and_ends_as_its_adapter_says_and_frees_its_slot(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=1)
    first, second = await run.submit(2)

    await run.say(first, TrialStatus.RUNNING)
    assert (run.status(first), run.status(second), run.trial(second).dispatched) == (
        TrialStatus.RUNNING,
        TrialStatus.WAITING,
        False,
    )
    await run.say(first, TrialStatus.SUCCEEDED, exit_code=0)

    assert (run.status(first), run.trial(first).exit_code) == (TrialStatus.SUCCEEDED, 0)
    assert run.trial(second).dispatched  # it took the slot
    assert run.counts() == {"SUCCEEDED": 1, "WAITING": 1}


async def test_an_end_said_twice_is_one_end(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=2)
    [trial] = await run.submit()
    await run.say(trial, TrialStatus.FAILED, failure="trial")
    ended = run.trial(trial)

    await run.say(trial, TrialStatus.FAILED, failure="trial")
    await run.say(trial, TrialStatus.RUNNING)

    assert run.trial(trial) == ended and run.counts() == {"FAILED": 1}


async def test_a_late_end_of_an_older_attempt_leaves_the_running_attempt_alone(core: Dispatcher) -> None:
    run = await Driver.start(core, retry={"infrastructure": 1, "backoff": 0})
    [trial] = await run.submit()
    await run.say(trial, TrialStatus.RUNNING)
    await run.say(trial, TrialStatus.FAILED, failure="infrastructure")  # retried: attempt 1
    await core.sweep()  # its back-off (none) is over: it goes out again
    await run.say(trial, TrialStatus.RUNNING)
    assert (run.status(trial), run.trial(trial).attempt) == (TrialStatus.RUNNING, 1)

    await run.say(trial, TrialStatus.SUCCEEDED, attempt=0)

    assert (run.status(trial), run.trial(trial).attempt) == (TrialStatus.RUNNING, 1)


async def test_an_event_from_another_adapter_is_refused(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()

    await run.say(trial, TrialStatus.SUCCEEDED, source="remote")

    assert run.status(trial) == TrialStatus.WAITING


async def test_a_second_copy_of_an_attempt_is_stopped_and_its_end_ignored(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()
    stops = await core.bus.nc.subscribe(subjects.control(ADAPTER, "cancel"))
    await run.say(trial, TrialStatus.RUNNING, replica="host-a")

    await run.say(trial, TrialStatus.RUNNING, replica="host-b")  # its request was redelivered to host-b
    await run.say(trial, TrialStatus.FAILED, replica="host-b", failure="trial")

    assert (run.status(trial), run.trial(trial).replica) == (TrialStatus.RUNNING, "host-a")
    stop = await stops.next_msg(timeout=2)
    assert b'"replica":"host-b"' in stop.data and b"a second copy" in stop.data


async def test_metric_records_of_the_current_attempt_set_the_final_metric(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()
    await run.say(trial, TrialStatus.RUNNING)

    await core.on_metrics([MetricFold(run.experiment_id, trial, attempt=0, periodical=3, final="0.75")])
    await core.on_metrics([MetricFold(run.experiment_id, trial, attempt=7, periodical=9, final="0.1")])  # not its

    assert (run.trial(trial).final_metric, run.trial(trial).intermediate_count) == (0.75, 3)
    assert run.experiment()["bestTrials"] == [{"id": trial, "metric": 0.75}]
