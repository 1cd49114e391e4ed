"""When the dispatcher writes a trial's state to the ``trials`` bucket: its end at once (the tuner
service and the web UI act on it), a RUNNING or a metric after ``TRIALBUS_STATE_WRITE_DELAY``
(with whatever else changed the trial meanwhile), while its own API answers at once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats

from contracts import TrialState
from tests.e2e.conftest import config, write_code
from tests.e2e.helpers import create, submit, trial, wait_until
from tests.fixtures.stack import Stack

#: Runs until its ``release`` file exists, then reports ``x`` as its final result.
TRIAL = """
import os, time
import nni

params = nni.get_next_parameter()
while not os.path.exists(params["release"]):
    time.sleep(0.02)
nni.report_final_result(params["x"])
"""
DELAY = 4.0  # seconds: long enough that a write it holds back is seen not to have happened yet


async def latest(stack: Stack, trial_id: str) -> TrialState:
    """The trial's state in the ``trials`` bucket."""
    nc = await nats.connect(stack.nats.url)
    try:
        return TrialState.decode((await (await nc.jetstream().key_value("trials")).get(trial_id)).value)
    finally:
        await nc.close()


async def history(stack: Stack, trial_id: str) -> list[TrialState]:
    """Every state of the trial the ``trials`` bucket holds, oldest first (it keeps them all here)."""
    nc = await nats.connect(stack.nats.url)
    try:
        kv = await nc.jetstream().key_value("trials")
        try:
            entries = await kv.history(trial_id)
        except nats.js.errors.NoKeysError:
            return []
        return [TrialState.decode(entry.value) for entry in entries if entry.value]
    finally:
        await nc.close()


def delayed_stack(stacks, nats_server, tmp_path: Path) -> Stack:
    """A stack whose dispatcher holds non-final writes back ``DELAY`` seconds, and ``trial.py`` in ``code``."""
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_STATE_WRITE_DELAY": str(DELAY)})
    stacks.append(stack)
    stack.start()
    write_code(tmp_path, TRIAL)
    return stack


def test_a_running_trial_is_written_after_the_delay_and_its_end_at_once(stacks, nats_server, tmp_path: Path):
    stack, code, release = delayed_stack(stacks, nats_server, tmp_path), tmp_path / "code", tmp_path / "release"
    experiment = create(stack, config(code, trialConcurrency=1))

    # Given a trial that runs: the dispatcher's API says so at once,
    trial_id = submit(stack, experiment, {"x": 7, "release": str(release)})
    wait_until(lambda: trial(stack, trial_id)["status"] == "RUNNING", 30, "the trial to run")
    running_seen = time.monotonic()
    # while the bucket still holds its state from before
    assert asyncio.run(latest(stack, trial_id)).status.value == "WAITING"
    # and gets the RUNNING once the delay is over
    wait_until(
        lambda: asyncio.run(latest(stack, trial_id)).status.value == "RUNNING", DELAY + 10, "the bucket to say RUNNING"
    )
    assert time.monotonic() - running_seen > DELAY / 2

    # When the trial ends,
    release.touch()
    ended_at = time.monotonic()
    # Then the bucket has its end at once (not a delay later), with its final metric
    last = wait_until(
        lambda: (t := asyncio.run(latest(stack, trial_id))).status.terminal and t, 30, "the bucket to have the end"
    )
    assert time.monotonic() - ended_at < DELAY / 2, "the end waited for the group commit"
    assert last.status.value == "SUCCEEDED" and last.final_metric == 7
    assert last.start_time is not None and last.end_time is not None


def test_a_short_trial_is_written_once_from_its_dispatch_to_its_end(stacks, nats_server, tmp_path: Path):
    stack, code, release = delayed_stack(stacks, nats_server, tmp_path), tmp_path / "code", tmp_path / "release"
    release.touch()  # it ends as soon as it reported
    experiment = create(stack, config(code, trialConcurrency=1))

    # When a trial runs and ends within the delay
    trial_id = submit(stack, experiment, {"x": 3, "release": str(release)})
    wait_until(lambda: trial(stack, trial_id)["status"] == "SUCCEEDED", 30, "the trial to end")
    # Then the bucket went from its dispatch straight to its end: its start and final metric are
    # in that one write, and no RUNNING was written on its own
    states = wait_until(
        lambda: (h := asyncio.run(history(stack, trial_id))) and h[-1].status.terminal and h,
        10,
        "the bucket to have the end",
    )
    assert [s.status.value for s in states] == ["WAITING", "SUCCEEDED"], [s.status.value for s in states]
    assert states[-1].start_time is not None and states[-1].final_metric == 3
