"""Nothing is lost and nothing runs twice when a service or the broker dies mid-experiment."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import nats

from contracts import subjects
from contracts.metrics import records_of
from tests.e2e.conftest import config, runs
from tests.e2e.helpers import wait_until


def trials_of(stack, experiment: str) -> list[dict]:
    return stack.rest("GET", f"/experiments/{experiment}/trials").json()["trials"]


def done(stack, experiment: str, timeout: float = 60) -> dict:
    return wait_until(
        lambda: (b := stack.rest("GET", f"/experiments/{experiment}").json())["status"] == "DONE" and b,
        timeout,
        f"experiment {experiment} DONE",
    )


def submit(stack, experiment: str, parameters: dict) -> str:
    return stack.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": parameters}).json()["id"]


async def stored_records(url: str, experiment: str) -> Counter:
    """How many metric records the METRICS stream holds per trial of the experiment (a message is
    one record or a keeper's batch); a record stored twice counts twice."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        subject = subjects.metrics(experiment, "*")
        total = sum(((await js.stream_info("METRICS", subjects_filter=subject)).state.subjects or {}).values())
        sub = await js.subscribe(subject, stream="METRICS", ordered_consumer=True)
        records = [r for _ in range(total) for r in records_of((await sub.next_msg(timeout=10)).data)]
        await sub.unsubscribe()
        assert len({(r.trial_id, r.attempt, r.type, r.sequence) for r in records}) == len(records), "a record twice"
        return Counter(r.trial_id for r in records)
    finally:
        await nc.close()


def test_adapter_killed_with_trials_queued_and_running(stack, code_dir, run_log):
    # Given 6 trials of 2 s at concurrency 2: two running, four queued
    experiment = stack.rest("POST", "/experiments", json=config(code_dir, trialConcurrency=2, maxTrialNumber=6)).json()[
        "id"
    ]
    ids = [submit(stack, experiment, {"x": i, "sleep": 2}) for i in range(6)]
    wait_until(lambda: sum(t["status"] == "RUNNING" for t in trials_of(stack, experiment)) == 2, 30, "2 RUNNING")
    # When the adapter is killed -9 and comes back a second later
    stack.kill("adapter")
    time.sleep(1)
    stack.start("adapter")
    # Then every trial ends SUCCEEDED (the running ones adopted), none lost, none run twice
    done(stack, experiment)
    final = {t["id"]: t for t in trials_of(stack, experiment)}
    assert {t["status"] for t in final.values()} == {"SUCCEEDED"}, final
    assert all(t["finalMetric"]["default"] == i for i, t in enumerate(final[i] for i in ids))
    assert sorted(runs(run_log)) == sorted(ids)


def test_gateway_killed_while_trials_report(stack, code_dir):
    experiment = stack.rest("POST", "/experiments", json=config(code_dir, trialConcurrency=4, maxTrialNumber=8)).json()[
        "id"
    ]
    ids = [submit(stack, experiment, {"x": i, "intermediate": 20, "pause": 0.1}) for i in range(8)]
    wait_until(lambda: sum(t["intermediateCount"] > 2 for t in trials_of(stack, experiment)) >= 2, 30, "reporting")
    # When the gateway dies mid-report and is back 1.5 s later
    stack.kill("gateway")
    time.sleep(1.5)
    stack.start("gateway")
    done(stack, experiment, 90)
    # Then every trial has all 21 records, each stored exactly once
    for trial in trials_of(stack, experiment):
        assert trial["status"] == "SUCCEEDED"
        assert trial["intermediateCount"] == 20
        assert trial["finalMetric"] is not None
    assert asyncio.run(stored_records(stack.nats.url, experiment)) == Counter({i: 21 for i in ids})


def test_broker_restart_mid_experiment(stack, code_dir, run_log):
    experiment = stack.rest("POST", "/experiments", json=config(code_dir, trialConcurrency=3, maxTrialNumber=9)).json()[
        "id"
    ]
    ids = [submit(stack, experiment, {"x": i, "intermediate": 5, "pause": 0.2}) for i in range(9)]
    wait_until(lambda: sum(t["status"] == "RUNNING" for t in trials_of(stack, experiment)) >= 2, 30, "RUNNING")
    # When nats-server restarts on the same store
    stack.nats.restart()
    # Then every service reconnects and the experiment completes with every metric
    done(stack, experiment, 90)
    final = trials_of(stack, experiment)
    assert [t["status"] for t in final] == ["SUCCEEDED"] * 9
    assert all(t["intermediateCount"] == 5 for t in final)
    assert sorted(runs(run_log)) == sorted(ids)
    assert asyncio.run(stored_records(stack.nats.url, experiment)) == Counter({i: 6 for i in ids})
