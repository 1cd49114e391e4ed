"""Adapters scaled out: three local-gpu replicas (as ``docker compose up --scale local-gpu=3``
runs them, each its own process and replica name) share one experiment's trials."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import config, runs, write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(240)
REPLICAS = ("adapter@a", "adapter@b", "adapter@c")


def ran_on(tmp_path: Path, experiment: str) -> dict[str, set[str]]:
    """Replica → the trials whose directory it made (its own work dir)."""
    found = {}
    for replica in "abc":
        folder = tmp_path / "data" / "local-gpu" / replica / "trials" / experiment
        found[replica] = {p.name.rpartition("-")[0] for p in folder.iterdir()} if folder.is_dir() else set()
    return found


def test_three_replicas_share_the_trials_and_a_killed_one_s_queue_moves_on(tmp_path, nats_server, request):
    run_log = tmp_path / "runs.log"
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"RUN_LOG": str(run_log), "TRIALBUS_MAX_TRIALS": "2"})
    try:
        stack.start("dispatcher", "gateway", *REPLICAS)
        experiment = create(stack, config(write_code(tmp_path), trialConcurrency=6))
        ids = [submit(stack, experiment, {"x": i, "sleep": 1.5}) for i in range(24)]
        # each replica holds two (its TRIALBUS_MAX_TRIALS) before a dies: the share asserted below is then
        # not a race with the kill (a was once killed holding one, on a loaded host)
        wait_until(
            lambda: all(len(v) >= 2 for v in ran_on(tmp_path, experiment).values()),
            60,
            "every replica running two trials",
        )
        stack.kill("adapter@a")  # kill -9, mid-run: its running trials go on; its queue goes to the others
        killed_at = set(ran_on(tmp_path, experiment)["a"])
        later = [t for t in ids if trial(stack, t)["status"] == "WAITING"]
        assert later, "work was still queued when the replica died"
        for trial_id in later:
            assert ended(stack, trial_id, timeout=120)["status"] == "SUCCEEDED"
        assert not ran_on(tmp_path, experiment)["a"] - killed_at, "nothing more started on the dead replica"
        stack.start("adapter@a")  # back after the crash: it reports the trials it had running
        finals = [ended(stack, t, timeout=60) for t in ids]
        assert [t["status"] for t in finals] == ["SUCCEEDED"] * 24, [t["message"] for t in finals]
        assert sorted(t["finalMetric"]["default"] for t in finals) == list(range(24))
        started = Counter(runs(run_log))
        assert set(started) == set(ids) and set(started.values()) == {1}, "every trial ran once, none twice"
        shares = ran_on(tmp_path, experiment)
        assert sum(map(len, shares.values())) == 24 and all(len(s) >= 2 for s in shares.values()), shares
    finally:
        stack.stop()
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(stack.logs(), file=sys.stderr)
