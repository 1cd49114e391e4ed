"""The sweep (services/dispatcher/sweep.py): what depends on time. A trial past
``maxTrialDuration`` is stopped early; trials still queued when ``maxExperimentDuration`` is
reached never start; a dispatch whose publish failed goes out again."""

from __future__ import annotations

import asyncio

from contracts.state import ExperimentStatus, TrialStatus
from services.dispatcher.core import Dispatcher
from tests.integration.dispatcher.harness import Driver


async def test_a_trial_past_max_trial_duration_is_stopped_early(core: Dispatcher) -> None:
    run = await Driver.start(core, maxTrialDuration=0.05)
    [trial] = await run.submit()
    await run.say(trial, TrialStatus.RUNNING)
    await core.sweep()
    assert run.trial(trial).cancel_status is None  # not yet
    await asyncio.sleep(0.1)

    await core.sweep()

    stopping = run.trial(trial)
    assert stopping.cancel_status == TrialStatus.EARLY_STOPPED and "maxTrialDuration" in stopping.message
    await run.say(trial, TrialStatus.EARLY_STOPPED)  # its owner stopped it
    assert run.status(trial) == TrialStatus.EARLY_STOPPED


async def test_queued_trials_never_start_once_max_experiment_duration_is_reached(core: Dispatcher) -> None:
    run = await Driver.start(core, concurrency=1, maxExperimentDuration=0.2)
    running, queued = await run.submit(2)
    await run.say(running, TrialStatus.RUNNING)
    await asyncio.sleep(0.25)

    await core.sweep()

    assert run.status(queued) == TrialStatus.SYS_CANCELED and "maxExperimentDuration" in run.trial(queued).message
    await run.say(running, TrialStatus.SUCCEEDED)
    assert run.experiment()["status"] == ExperimentStatus.DONE


async def test_a_dispatch_not_known_to_be_on_the_stream_is_sent_again(core: Dispatcher) -> None:
    run = await Driver.start(core)
    [trial] = await run.submit()
    core.slots.unsent.add(trial)  # as after a publish that failed
    core.slots.seq.pop(trial)

    await core.sweep()

    assert trial not in core.slots.unsent and trial in core.slots.seq  # on the stream: it can be withdrawn
    await core.cancel_trial(trial)
    assert run.status(trial) == TrialStatus.USER_CANCELED
