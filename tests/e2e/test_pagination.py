"""Paging through an experiment's trials as a user would (issue 23): over REST, the bus API
(the Python client) and the CLI; filtered by status, sorted by the final metric, while trials
keep ending; and the summary's counts and best trials."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, wait_until
from trialbus.client import AsyncClient

pytestmark = pytest.mark.timeout(180)

TRIALBUS = str(Path(sys.executable).parent / "trialbus")


def pages(stack, experiment: str, query: str = "", limit: int = 4) -> list[dict]:
    """Every trial, ``limit`` per page, following ``nextCursor``; checks each page's size."""
    found, cursor = [], None
    while True:
        after = f"&cursor={cursor}" if cursor else ""
        reply = stack.rest("GET", f"/experiments/{experiment}/trials?limit={limit}{query}{after}")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert len(body["trials"]) <= limit and (body["nextCursor"] is None or len(body["trials"]) == limit)
        found += body["trials"]
        if (cursor := body["nextCursor"]) is None:
            return found


def test_paging_through_trials_while_they_end_misses_and_repeats_none(stack, code_dir):
    # Given 18 trials, some running while the user pages through them 4 at a time
    experiment = create(stack, config(code_dir, trialConcurrency=6))
    ids = [submit(stack, experiment, {"x": i % 7, "sleep": 0.3}) for i in range(18)]
    wait_until(
        lambda: stack.rest("GET", f"/experiments/{experiment}").json()["trialCounts"]["RUNNING"], 30, "trials to run"
    )
    seen = [t["id"] for t in pages(stack, experiment)]
    # Then each trial came once, in submission order, though trials ended between the pages
    assert seen == ids
    for trial_id in ids:
        ended(stack, trial_id)
    # And, all ended: by metric (maximize, NNI's default), best first, ties in submission order
    by_metric = pages(stack, experiment, "&sort=metric&status=SUCCEEDED", limit=5)
    values = [t["finalMetric"]["default"] for t in by_metric]
    assert values == sorted(values, reverse=True) and len(by_metric) == 18
    assert [t["id"] for t in by_metric[:3]] == [ids[6], ids[13], ids[5]]
    # and the summary keeps the counts and the best trials
    summary = stack.rest("GET", f"/experiments/{experiment}").json()
    assert summary["trialCounts"]["SUCCEEDED"] == 18 and summary["trialCount"] == 18
    assert summary["bestTrials"][:2] == [{"id": ids[6], "metric": 6}, {"id": ids[13], "metric": 6}]
    assert pages(stack, experiment, "&status=FAILED,RUNNING") == []


def test_minimize_sorts_the_lowest_first_and_bad_paging_is_refused_with_what_to_do(stack, code_dir):
    # Given two experiments of the same three trials, the second's tuner minimizing
    # (no tuner service runs here: the trials are submitted by hand)
    experiment = create(stack, config(code_dir))
    minimized = create(
        stack,
        config(
            code_dir,
            tuner={"name": "Random", "classArgs": {"optimize_mode": "minimize"}},
            searchSpace={"x": {"_type": "choice", "_value": [1, 2, 3]}},
        ),
    )
    for target in (experiment, minimized):
        for trial_id in [submit(stack, target, {"x": x}) for x in (3, 1, 2)]:
            ended(stack, trial_id)
    # Then sorted by metric, each has its best first
    assert [t["finalMetric"]["default"] for t in pages(stack, experiment, "&sort=metric")] == [3, 2, 1]
    assert [t["finalMetric"]["default"] for t in pages(stack, minimized, "&sort=metric")] == [1, 2, 3]
    assert stack.rest("GET", f"/experiments/{minimized}").json()["bestTrials"][0]["metric"] == 1

    for query, why in (
        ("limit=0", "limit must be a whole number from 1 to 5000"),
        ("limit=5001", "limit must be a whole number from 1 to 5000"),
        ("sort=best", "sort must be one of sequence, metric"),
        ("status=DONE", "unknown trial status DONE: the statuses are WAITING, RUNNING"),
        ("cursor=bogus", "is not one this list gave out for sort=sequence"),
    ):
        refused = stack.rest("GET", f"/experiments/{experiment}/trials?{query}")
        assert refused.status_code == 422 and why in refused.json()["error"], (query, refused.text)
    cursor = stack.rest("GET", f"/experiments/{experiment}/trials?limit=1").json()["nextCursor"]
    mixed = stack.rest("GET", f"/experiments/{experiment}/trials?sort=metric&cursor={cursor}")
    assert mixed.status_code == 422 and "start again without a cursor" in mixed.json()["error"]


def test_a_restarted_dispatcher_rebuilds_its_read_model_and_answers_the_same(stack, code_dir):
    # Given an experiment whose trials ended but one, still running
    experiment = create(stack, config(code_dir, trialConcurrency=2))
    ids = [submit(stack, experiment, {"x": x}) for x in (4, 9, 1, 7)]
    for trial_id in ids:
        ended(stack, trial_id)
    blocker = submit(stack, experiment, {"x": 5, "sleep": 60})
    wait_until(lambda: stack.rest("GET", f"/trials/{blocker}").json()["status"] == "RUNNING", 30, "a running trial")
    ids.append(blocker)
    before = {
        query: [t["id"] for t in pages(stack, experiment, query)]
        for query in ("", "&sort=metric", "&status=RUNNING", "&status=SUCCEEDED&sort=metric")
    }
    summary = stack.rest("GET", f"/experiments/{experiment}").json()
    # when the dispatcher is killed and started again (its indexes are in memory only)
    stack.kill("dispatcher")
    stack.start("dispatcher")
    # then, rebuilt from the trials bucket, every page, count and best trial is as it was
    after = {query: [t["id"] for t in pages(stack, experiment, query)] for query in before}
    assert after == before and before["&sort=metric"][:2] == [ids[1], ids[3]]
    again = stack.rest("GET", f"/experiments/{experiment}").json()
    assert (again["trialCounts"], again["bestTrials"]) == (summary["trialCounts"], summary["bestTrials"])
    assert again["trialCounts"]["RUNNING"] == 1 and again["trialCounts"]["SUCCEEDED"] == 4
    assert stack.rest("POST", f"/trials/{blocker}/cancel").status_code == 202


def test_the_client_and_the_cli_page_for_the_user(stack, code_dir):
    experiment = create(stack, config(code_dir))
    ids = [submit(stack, experiment, {"x": x}) for x in (4, 9, 1, 7, 2)]
    for trial_id in ids:
        ended(stack, trial_id)

    async def scenario():
        async with AsyncClient(stack.nats.url) as client:
            every = [t.id async for t in client.iter_trials(experiment, page_size=2)]
            page = await client.trial_page(experiment, limit=2, sort="metric", status="SUCCEEDED")
            rest = await client.trial_page(experiment, limit=2, sort="metric", cursor=page.next_cursor)
            listed = await client.list_trials(experiment, status=["SUCCEEDED"])
            return every, page, rest, listed

    every, page, rest, listed = asyncio.run(scenario())
    assert every == ids and [t.id for t in listed] == ids
    assert [t.final_metric["default"] for t in [*page.trials, *rest.trials]] == [9, 7, 4, 2]
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "200"}
    shown = subprocess.run(
        [TRIALBUS, "trial", "ls", experiment, "--sort", "metric", "--limit", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    rows = [line.split()[0] for line in shown.stdout.splitlines()[1:] if line.strip()]
    assert rows == [ids[1], ids[3]]
    refused = subprocess.run(
        [TRIALBUS, "trial", "ls", experiment, "--status", "DONE"], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "unknown trial status DONE" in refused.stdout + refused.stderr
