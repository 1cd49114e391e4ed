"""Two teams share four GPUs, as teams would: quotas with borrowing, the second team's share reached
by reclaiming borrowed GPUs, preempted trials resuming from their checkpoints with one final result
each, priorities within a team, and why a trial waits (docs/teams.md).

A real stack (dispatcher, gateway, local-gpu adapter as processes on a real nats-server) on a host
with four fake GPUs (the ``nvidia-smi`` stand-in); people use their own tokens over REST, the admin
the CLI. The trials are real processes that save a checkpoint when SIGTERM comes.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tests.e2e.helpers import wait_until
from tests.fixtures.gpus import fake_gpu, stack_env
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from trialbus.cli import app

TRIAL = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import nni

    params = nni.get_next_parameter()
    saved = os.path.join(os.environ["TRIALBUS_CHECKPOINT_DIR"], "step")
    step = int(open(saved).read()) if os.path.exists(saved) else 0
    resumed_from, started, stopping = step, time.time(), []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))

    def record(how):
        with open(os.environ["RUN_LOG"], "a") as log:
            log.write(json.dumps({
                "trial": os.environ["NNI_TRIAL_JOB_ID"], "attempt": int(os.environ["TRIALBUS_ATTEMPT"]),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "resumedFrom": resumed_from, "step": step,
                "start": started, "end": time.time(), "how": how,
            }) + "\\n")

    while step < params["steps"]:
        time.sleep(0.1)
        step += 1
        with open(saved + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(saved + ".tmp", saved)
        if stopping:
            record("preempted")
            sys.exit(0)
    record("done")
    nni.report_final_result({"default": params["x"], "resumedFrom": resumed_from})
    """
)
TERMINAL = {"SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"}


class Team:
    def __init__(self, stack: Stack, token: str, code: Path) -> None:
        self.stack, self.token, self.code = stack, token, code

    def rest(self, method: str, path: str, **kwargs) -> httpx.Response:
        return self.stack.rest(method, path, headers={"Authorization": f"Bearer {self.token}"}, **kwargs)

    def experiment(self, concurrency: int, **overrides) -> str:
        body = {
            "experimentName": "sharing",
            "trialCommand": f"{sys.executable} trial.py",
            "trialCodeDirectory": str(self.code),
            "trialConcurrency": concurrency,
            "trialGpuNumber": 1,
            "trialGracePeriod": 10,
            "trainingService": {"platform": "local", "useActiveGpu": True},
            **overrides,
        }
        made = self.rest("POST", "/experiments", json=body)
        assert made.status_code == 201, made.text
        return made.json()["id"]

    def submit(self, experiment: str, **parameters) -> str:
        made = self.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": parameters})
        assert made.status_code == 201, made.text
        return made.json()["id"]


def trial(stack: Stack, trial_id: str) -> dict:
    return stack.rest("GET", f"/trials/{trial_id}").json()


def stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def runs(stack: Stack) -> list[dict]:
    log = Path(stack.extra_env["RUN_LOG"])
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharing")
    nats = NatsServer(root / "jetstream").start()
    env = stack_env(root, [fake_gpu(i) for i in range(4)], TRIALBUS_STATUS_INTERVAL="1")
    stack = Stack(root=root, nats=nats, extra_env=env)
    code = root / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    try:
        stack.start()
        wait_until(
            lambda: any(len(p["gpus"]) == 4 for p in stack.rest("GET", "/platforms").json()), 30, "4 GPUs published"
        )
        tokens = {}
        for name, team, role in (("ana", "vision", "member"), ("bo", "nlp", "member"), ("vic", "vision", "viewer")):
            added = stack.rest("POST", "/users", json={"name": name, "team": team, "role": role})
            assert added.status_code == 201, added.text
            tokens[name] = added.json()["token"]
        yield stack, {name: Team(stack, token, code) for name, token in tokens.items()}
    finally:
        stack.stop()
        nats.stop()


def cli(stack: Stack, *args: str) -> str:
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["--nats-url", stack.nats.url, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_second_team_reaches_its_share_by_reclaiming_borrowed_gpus(shared):
    stack, people = shared
    ana, bo = people["ana"], people["bo"]
    # Given quotas of 2 GPUs for vision and nlp (set by the admin, one over REST, one with the CLI)
    assert stack.rest("PUT", "/teams/vision", json={"gpus": 2}).status_code == 200
    assert "team nlp: 2 GPUs" in cli(stack, "team", "set", "nlp", "--gpus", "2")
    # And team vision running four long GPU trials on the four GPUs (borrowing nlp's idle two)
    mine = ana.experiment(concurrency=4)
    long = [ana.submit(mine, x=i, steps=120) for i in range(4)]
    wait_until(lambda: all(trial(stack, t)["status"] == "RUNNING" for t in long), 40, "vision's 4 trials running")
    vision = next(t for t in stack.rest("GET", "/teams").json() if t["name"] == "vision")
    assert vision["use"]["local-gpu"] | {"capacity": None} == {
        "gpus": 4,
        "trials": 4,
        "quota": {"gpus": 2, "trials": None},
        "borrowedGpus": 2,
        "borrowedTrials": None,
        "waitingExperiments": 0,
        "capacity": None,
    }
    # When team nlp submits two trials
    arrived = time.time()
    theirs = bo.experiment(concurrency=2)
    short = [bo.submit(theirs, x=10 + i, steps=100) for i in range(2)]
    # Then two of vision's trials are preempted, and nlp's two run
    wait_until(lambda: all(trial(stack, t)["status"] == "RUNNING" for t in short), 60, "nlp's trials running")
    fair = time.time() - arrived
    starts = [stamp(trial(stack, t)["startTime"]) for t in short]
    victims = [t for t in long if trial(stack, t)["attempt"] == 1]
    assert len(victims) == 2, [trial(stack, t) for t in long]
    # And the preempted ones wait (their retry's back-off over), saying why: their team is at its
    # quota, nlp has the rest
    waiting = wait_until(
        lambda: [m for t in victims if "team vision at its GPU quota 2/2" in (m := trial(stack, t)["message"] or "")],
        20,
        "the preempted trials to say why they wait",
    )
    assert waiting[0].startswith("waiting for 1 free GPU (0 of 4 GPUs of local-gpu free)"), waiting
    queue = cli(stack, "queue")
    assert mine in queue and "vision" in queue, queue

    # When everything has ended
    ended = {t: wait_until(lambda t=t: (s := trial(stack, t))["status"] in TERMINAL and s, 90, t) for t in long + short}
    # Then every trial succeeded with one final result, the preempted ones from their checkpoint
    assert {t["status"] for t in ended.values()} == {"SUCCEEDED"}, ended
    for t in victims:
        record = ended[t]
        assert record["attempt"] == 1 and [a["status"] for a in record["attempts"]] == ["PREEMPTED"], record
        assert "reclaimed by team nlp" in record["attempts"][0]["message"]
        assert record["failure"] is None
        assert record["finalMetric"]["resumedFrom"] > 0, record  # the second attempt began where the first saved
        finals = [m for m in stack.rest("GET", f"/trials/{t}/metrics").json() if m["type"] == "FINAL"]
        assert len(finals) == 1, finals
    done = {r["trial"]: r for r in runs(stack) if r["how"] == "done"}
    assert all(done[t]["resumedFrom"] == 0 for t in long if t not in victims)
    for t in victims:
        saved = [r for r in runs(stack) if r["trial"] == t and r["how"] == "preempted"]
        assert len(saved) == 1 and done[t]["resumedFrom"] == saved[0]["step"], (saved, done[t])
    submitted = [stamp(trial(stack, t)["submitTime"]) for t in short]
    freed = [stamp(ended[t]["attempts"][0]["endTime"]) for t in victims]
    print(
        f"\nsecond team's arrival -> its fair share (2 of 4 GPUs running): {fair:.2f}s; "
        f"preemption (decided as its trials arrive -> running): {max(starts) - min(submitted):.2f}s, "
        f"of which the preempted trials' stop -> the owner's trials running: {max(starts) - max(freed):.2f}s"
    )


def test_a_higher_priority_experiment_runs_first_and_preempts_its_team_s_lower_one(shared):
    stack, people = shared
    ana = people["ana"]
    stack.rest("PUT", "/teams/vision", json={"gpus": 4})
    low = ana.experiment(concurrency=4)
    background = [ana.submit(low, x=i, steps=100) for i in range(4)]
    wait_until(lambda: all(trial(stack, t)["status"] == "RUNNING" for t in background), 40, "4 running")
    urgent = ana.experiment(concurrency=1, priority=10)
    first = ana.submit(urgent, x=99, steps=5)
    done = wait_until(lambda: (s := trial(stack, first))["status"] in TERMINAL and s, 60, "the urgent trial")
    assert done["status"] == "SUCCEEDED"
    preempted = [trial(stack, t) for t in background if trial(stack, t)["attempt"] == 1]
    assert len(preempted) == 1, [trial(stack, t) for t in background]
    assert preempted[0]["attempts"][0]["message"].endswith("has a higher priority (10 > 0)")
    for t in background:
        stack.rest("POST", f"/trials/{t}/cancel")


def test_people_may_only_act_as_their_role_and_team_allow(shared):
    stack, people = shared
    assert stack.rest("PUT", "/teams/nlp", json={"gpus": 2}).status_code == 200
    made = people["vic"].rest(
        "POST",
        "/experiments",
        json={"trialCommand": "true", "trialConcurrency": 1, "trainingService": {"platform": "local"}},
    )
    assert made.status_code == 403, made.text
    mine = people["ana"].experiment(concurrency=1)
    theirs = people["ana"].submit(mine, x=1, steps=300)
    refused = people["bo"].rest("POST", f"/trials/{theirs}/cancel")
    assert refused.status_code == 403 and "belongs to team vision" in refused.json()["error"], refused.text
    refused = people["bo"].rest("PUT", "/teams/nlp", json={"gpus": 4})
    assert refused.status_code == 403 and "only an admin" in refused.json()["error"], refused.text
    bad = stack.rest("PUT", "/teams/nlp", json={"gpus": -1})
    assert bad.status_code == 422 and "gpus" in bad.json()["error"], bad.text
    bad = stack.rest("PUT", "/teams/nlp", json={"cpus": 1})
    assert bad.status_code == 422 and "unknown field(s) cpus" in bad.json()["error"], bad.text
    assert next(t for t in stack.rest("GET", "/teams").json() if t["name"] == "nlp")["quota"]["gpus"] == 2
    assert people["ana"].rest("POST", f"/trials/{theirs}/cancel").status_code == 202
