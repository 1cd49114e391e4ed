"""The whole path as a user drives it: client → dispatcher → adapter → keeper → gateway → client."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from pathlib import Path

from contracts.messages import MetricType
from tests.e2e.conftest import config, runs
from tests.e2e.helpers import await_until, create, ended, submit, wait_until
from tests.e2e.helpers import trial as trial_state
from tests.fixtures.stack import Stack
from trialbus.client import AsyncClient


async def test_fifty_trials_every_metric_exactly_once_and_never_over_concurrency(stack, code_dir, run_log):
    # Given an experiment of 50 trials at concurrency 4, each reporting 20 intermediate + 1 final
    async with AsyncClient(stack.nats.url) as client:
        experiment = await client.create_experiment(config(code_dir, trialConcurrency=4, maxTrialNumber=50))
        records, events = [], []

        async def collect_metrics():
            async for record in client.metrics(experiment):
                records.append(record)

        async def collect_events():
            async for event in client.events(experiment):
                events.append(event)

        readers = [asyncio.create_task(collect_metrics()), asyncio.create_task(collect_events())]
        # When the tuner submits them all and awaits every final metric
        trials = [await client.submit_trial(experiment, {"x": i, "intermediate": 20}) for i in range(50)]
        finals = await asyncio.wait_for(asyncio.gather(*(client.wait_final(t.id) for t in trials)), 120)
        await await_until(lambda: len(records) >= 1050, 30, "1,050 metric records")
        await asyncio.sleep(0.3)  # anything extra (a duplicate) would arrive now
        for task in readers:
            task.cancel()

        # Then every trial succeeded with its own final metric
        assert [f["default"] for f in finals] == list(range(50))
        # And the client saw all 1,050 records exactly once, in order within each trial
        assert len(records) == 1050
        per_trial = defaultdict(list)
        for record in records:
            per_trial[record.trial_id].append((record.type, record.sequence))
        assert set(per_trial) == {t.id for t in trials}
        for sequence in per_trial.values():
            assert sequence == [(MetricType.PERIODICAL, i) for i in range(20)] + [(MetricType.FINAL, 0)]
        # And the event stream never shows more than 4 trials RUNNING at once
        running, most = set(), 0
        for event in events:
            if event.status == "RUNNING":
                running.add(event.trial_id)
            elif event.status != "WAITING":
                running.discard(event.trial_id)
            most = max(most, len(running))
        assert 1 <= most <= 4
        # And each trial ran exactly once
        assert sorted(runs(run_log)) == sorted(t.id for t in trials)

    # And the REST API agrees
    body = wait_until(
        lambda: (b := stack.rest("GET", f"/experiments/{experiment}").json())["status"] == "DONE" and b,
        10,
        "experiment DONE",
    )
    assert body["trialCounts"]["SUCCEEDED"] == 50
    listed = stack.rest("GET", f"/experiments/{experiment}/trials").json()["trials"]
    assert all(t["status"] == "SUCCEEDED" and t["exitCode"] == 0 and t["intermediateCount"] == 20 for t in listed)
    one = trials[7].id
    assert stack.rest("GET", f"/trials/{one}").json()["finalMetric"] == {"default": 7, "seq": 7}
    metrics = stack.rest("GET", f"/trials/{one}/metrics").json()
    assert [m["value"] for m in metrics] == [7 * (i + 1) for i in range(20)] + [{"default": 7, "seq": 7}]

    # And a submit past maxTrialNumber is refused with a clear error
    refused = stack.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": {"x": 1}})
    assert refused.status_code == 409
    assert "maxTrialNumber (50)" in refused.json()["error"]


def test_failing_trial_reports_exit_code_and_stderr(stack, code_dir):
    experiment = stack.rest("POST", "/experiments", json=config(code_dir)).json()["id"]
    trial = stack.rest(
        "POST",
        f"/experiments/{experiment}/trials",
        json={"parameters": {"x": 1, "exit": 3, "stderr": "CUDA out of patience"}},
    ).json()["id"]
    body = wait_until(
        lambda: (b := stack.rest("GET", f"/trials/{trial}").json())["status"] == "FAILED" and b, 30, "trial FAILED"
    )
    assert body["exitCode"] == 3
    assert "3" in body["message"]
    log = stack.rest("GET", f"/trials/{trial}/log")
    assert log.status_code == 200
    assert "CUDA out of patience" in log.text


def test_cancel_running_trial_ends_it_and_its_whole_process_group(stack, code_dir, run_log):
    experiment = stack.rest("POST", "/experiments", json=config(code_dir)).json()["id"]
    trial = stack.rest(
        "POST", f"/experiments/{experiment}/trials", json={"parameters": {"x": 1, "sleep": 300, "child": True}}
    ).json()["id"]
    wait_until(lambda: stack.rest("GET", f"/trials/{trial}").json()["status"] == "RUNNING", 30, "RUNNING")
    _, pid, pgid = wait_until(lambda: run_log.exists() and run_log.read_text().split(), 30, "trial started")
    time.sleep(0.3)  # let the trial start its child
    started = time.monotonic()
    assert stack.rest("POST", f"/trials/{trial}/cancel").status_code == 202
    wait_until(lambda: stack.rest("GET", f"/trials/{trial}").json()["status"] == "USER_CANCELED", 2, "USER_CANCELED")
    assert time.monotonic() - started < 2

    def group_gone() -> bool:
        try:
            os.killpg(int(pgid), 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_gone, 2, f"process group {pgid} gone")
    assert not Path(f"/proc/{pid}").exists()


async def test_a_submit_sent_again_with_its_parameter_id_is_the_same_trial(stack, code_dir):
    # Given a tuner whose submit's answer was lost (its dispatcher died after taking it), so it sends it again
    async with AsyncClient(stack.nats.url) as client:
        experiment = await client.create_experiment(config(code_dir, maxTrialNumber=2))
        first = await client.submit_trial(experiment, {"x": 1}, parameter_id=7)
        again = await client.submit_trial(experiment, {"x": 1}, parameter_id=7)
        # Then it is one trial, and the experiment still has room for its second
        assert again.id == first.id
        other = await client.submit_trial(experiment, {"x": 2}, parameter_id=8)
        assert [t.id for t in await client.list_trials(experiment)] == [first.id, other.id]
        # And a restarted dispatcher knows it too
        stack.kill("dispatcher")
        stack.start("dispatcher")
        assert (await client.submit_trial(experiment, {"x": 2}, parameter_id=8)).id == other.id


def test_a_dispatched_trial_says_so_until_an_adapter_starts_it(stacks, nats_server, tmp_path, code_dir, run_log):
    # Given a stack whose local adapter is not up yet
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"RUN_LOG": str(run_log)})
    stacks.append(stack.start("dispatcher", "gateway"))
    experiment = create(stack, config(code_dir))
    trial_id = submit(stack, experiment, {"x": 1})
    dispatched = "dispatched to local-gpu; waiting for an adapter replica to start it"
    wait_until(lambda: trial_state(stack, trial_id)["message"] == dispatched, 10, "the trial dispatched")
    # When the dispatcher has read back its own WAITING event (published at the submit, with the
    # submit's message), the trial still says where it is, not what it waited for before
    time.sleep(1.5)
    waiting = trial_state(stack, trial_id)
    assert (waiting["status"], waiting["message"]) == ("WAITING", dispatched)
    # Then it runs once the adapter is up
    stack.start("adapter")
    assert ended(stack, trial_id)["status"] == "SUCCEEDED"
