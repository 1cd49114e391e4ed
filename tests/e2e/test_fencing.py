"""One copy of an attempt (issue 22): a request redelivered to another replica is never
launched there (the attempt's claim, services/adapters/claims.py), and a copy that got past
the claims is stopped by the dispatcher. Two local adapter replicas, a real nats-server."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import config, write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until

pytestmark = pytest.mark.timeout(120)


#: Runs until the file ``release`` exists (60 s at most), then reports 1 and succeeds; each run notes its directory.
WAITS = textwrap.dedent(
    """
    import os, time
    import nni, trialbus_trial

    params = nni.get_next_parameter()
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"{nni.get_trial_id()} {trialbus_trial.attempt()} 0 {os.environ['NNI_SYS_DIR']}\\n")
    deadline = time.monotonic() + 60  # a failed test leaves no trial behind for long
    while not os.path.exists(params["release"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    nni.report_final_result(1)
    """
)


def waiting_trial(stack, tmp_path: Path) -> tuple[str, str, Path, str]:
    """A trial RUNNING until ``release`` exists: its experiment, id, release file and replica."""
    (tmp_path / "waits").mkdir()
    code = write_code(tmp_path / "waits", WAITS)
    experiment = create(stack, config(code, trialConcurrency=1))
    release = tmp_path / "release"
    trial_id = submit(stack, experiment, {"release": str(release)})
    owner = wait_until(lambda: (t := trial(stack, trial_id))["status"] == "RUNNING" and t, 30, "RUNNING")["replica"]
    return experiment, trial_id, release, owner


def test_a_request_redelivered_to_another_replica_never_runs_a_second_copy(stack, tmp_path, run_log):
    # Given two local adapter replicas, and a trial running on one of them
    stack.start("adapter@b")
    experiment, trial_id, release, owner = waiting_trial(stack, tmp_path)
    other, frozen = ("b", "adapter") if owner == "test-host" else ("test-host", "adapter@b")
    # When its request is delivered again, to the other replica (the owner frozen, as one that missed its ack)
    second = stack.root / "data" / "local-gpu" / other / "trials" / experiment / f"{trial_id}-0"
    other_log = "adapter@b" if other == "b" else "adapter"
    os.kill(stack.procs[frozen].pid, signal.SIGSTOP)
    try:
        time.sleep(1.5)  # its pending pull requests (0.5 s each) expire: the other replica gets the request
        asyncio.run(_redeliver(stack, experiment, trial_id))
        refused = lambda: "not launching a second copy" in stack.log(other_log)  # noqa: E731
        wait_until(refused, 30, "the other replica to find the attempt claimed")
    finally:
        os.kill(stack.procs[frozen].pid, signal.SIGCONT)
    # Then the other replica never started a copy: the owner's claim on the attempt stopped it
    assert f"attempt 0 runs on replica {owner}" in stack.log(other_log)
    assert not second.exists()
    assert "stopping replica" not in stack.log("dispatcher")
    release.touch()
    done = ended(stack, trial_id)
    assert (done["status"], done["attempt"], done["replica"], done["attempts"]) == ("SUCCEEDED", 0, owner, []), done


def test_a_copy_that_got_past_the_claims_is_stopped_by_the_dispatcher(stack, tmp_path, run_log):
    """The backstop: a replica that took over the claim of one it wrongly thought gone runs a
    second copy; the dispatcher sees its RUNNING and stops that copy, only that one."""
    experiment, trial_id, release, owner = waiting_trial(stack, tmp_path)

    stop = asyncio.run(_second_copy_runs(stack, experiment, trial_id, replica="elsewhere"))

    assert (stop.trial_id, stop.attempt, stop.replica, stop.status) == (trial_id, 0, "elsewhere", "SYS_CANCELED")
    assert "a second copy of attempt 0" in stop.message
    release.touch()
    done = ended(stack, trial_id)
    assert (done["status"], done["replica"], done["attempts"]) == ("SUCCEEDED", owner, []), done


async def _second_copy_runs(stack, experiment: str, trial_id: str, replica: str):
    """Publish the RUNNING a second copy on ``replica`` would; the cancel the dispatcher sends it."""
    import nats

    from contracts import CancelRequest, TrialEvent, TrialStatus, subjects
    from contracts.base import utcnow

    nc = await nats.connect(stack.nats.url)
    try:
        cancels = await nc.subscribe(subjects.control("local-gpu", "cancel"))
        event = TrialEvent(
            experiment_id=experiment,
            trial_id=trial_id,
            attempt=0,
            status=TrialStatus.RUNNING,
            platform="local-gpu",
            replica=replica,
            time=utcnow(),
        )
        headers = {"Nats-Msg-Id": subjects.running_event_id(trial_id, 0, replica)}
        subject = subjects.events(experiment, trial_id, "local-gpu")
        await nc.jetstream().publish(subject, event.encode(), headers=headers)
        async with asyncio.timeout(20):
            while True:
                stop = CancelRequest.decode((await cancels.next_msg(timeout=20)).data)
                if stop.replica == replica:
                    return stop
    finally:
        await nc.close()


async def _redeliver(stack, experiment: str, trial_id: str) -> None:
    """Put the trial's request on the dispatch stream again, as a redelivery would hand it out."""
    import nats

    from contracts import ExperimentState, TrialState, subjects
    from services.dispatcher.requests import trial_request

    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        state = ExperimentState.decode((await (await js.key_value("experiments")).get(experiment)).value)
        held = TrialState.decode((await (await js.key_value("trials")).get(trial_id)).value)
        request = trial_request(state, held, stack.secret)
        await js.publish(
            subjects.dispatch("local-gpu"), request.encode(), headers={"Nats-Msg-Id": f"{trial_id}:0:again"}
        )
    finally:
        await nc.close()
