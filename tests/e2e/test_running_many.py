"""Many trials running at once on the local adapter (issue 23; ``bench/running.py`` measures 1,000).

200 Python trials that report an intermediate result and sleep, at concurrency 200, on a stack
whose services start with a soft limit of 128 open files (the adapter holds a pidfd per running
keeper, and raises its own limit as far as the hard one allows): all run, all report, and all
end when the experiment is stopped, leaving no keeper or trial process behind.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.running import SLEEPER, alive, soft_nofile, stop_leftovers
from tests.e2e.helpers import wait_until
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(120)

COUNT = 200


@pytest.fixture
def trials_dir(tmp_path):
    """The local adapter's trial directories; whatever a failed test left running there is killed."""
    path = tmp_path / "data" / "local-gpu" / "test-host" / "trials"
    yield path
    stop_leftovers(path)


def test_two_hundred_trials_run_at_once_and_all_end_when_the_experiment_stops(
    tmp_path, nats_server, stacks, trials_dir
):
    # Given a stack whose local adapter runs 200 trials at once, started with a small descriptor limit
    stack = Stack(root=tmp_path, nats=nats_server, service_env={"adapter": {"TRIALBUS_MAX_TRIALS": str(COUNT)}})
    stacks.append(stack)
    with soft_nofile(128):
        stack.start()
    code = tmp_path / "code"
    code.mkdir()
    (code / "sleeper.py").write_text(SLEEPER)
    config = {
        "experimentName": "many",
        "trialCommand": f"{sys.executable} sleeper.py 120",
        "trialCodeDirectory": str(code),
        "trialConcurrency": COUNT,
        "maxTrialNumber": COUNT,
        "trainingService": {"platform": "local"},
    }
    experiment = stack.rest("POST", "/experiments", json=config).json()["id"]

    # When 200 trials are submitted
    def submit(i: int) -> str:
        return stack.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": {"i": i}}).json()["id"]

    with ThreadPoolExecutor(8) as pool:
        trials = list(pool.map(submit, range(COUNT)))

    # Then all of them run at once, and each reports its intermediate results
    def counts() -> dict[str, int]:
        return stack.rest("GET", f"/experiments/{experiment}").json()["trialCounts"]

    wait_until(lambda: counts()["RUNNING"] == COUNT, 60, "all 200 trials RUNNING")
    with ThreadPoolExecutor(8) as pool:
        wait_until(
            lambda: all(pool.map(lambda t: len(stack.rest("GET", f"/trials/{t}/metrics").json()) == 2, trials)),
            30,
            "two intermediate results from every trial",
        )
    assert "raised the soft limit of open files from 128" in stack.log("adapter")
    states = [json.loads(path.read_text()) for path in (trials_dir / experiment).glob("*/.trialbus/state.json")]
    pids = [pid for state in states for pid in (state["keeperPid"], state["trialPid"])]
    assert len(pids) == 2 * COUNT and all(map(alive, pids))

    # When the experiment is stopped
    begin = time.monotonic()
    httpx.delete(f"{stack.api}/experiments/{experiment}", headers=stack.auth, timeout=60).raise_for_status()

    # Then every trial ends canceled, and no keeper or trial process is left
    wait_until(lambda: counts()["USER_CANCELED"] == COUNT, 60, "all 200 trials USER_CANCELED")
    wait_until(lambda: not any(map(alive, pids)), 10, "no keeper or trial process left")
    assert time.monotonic() - begin < 60
    assert not [line for line in stack.log("adapter").splitlines() if " ERROR " in line or "Traceback" in line]
