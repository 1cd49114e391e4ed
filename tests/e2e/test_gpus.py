"""GPU trials end to end: the real stack as processes, a fake ``nvidia-smi`` on PATH.

What a user sees through REST (and ``trialbus platform list``), and what the real trial
processes saw (``CUDA_VISIBLE_DEVICES``, when they ran), for NNI's local GPU rules:
foreign processes, ``maxTrialNumberPerGpu``, ``useActiveGpu``, trials that can never fit,
trials that wait, and GPUs an adopted trial keeps across an adapter restart.

One stack serves most tests (``host``); each test sets the fake GPUs it needs and waits
until the adapter's published status shows them. Retention needs its own settings, so
its test starts its own stack.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.e2e.helpers import wait_until
from tests.fixtures.gpus import STATE_VAR, fake_gpu, set_fake_gpus, stack_env
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from trialbus.cli import app

TRIAL = textwrap.dedent(
    """
    import json, os, time
    import nni

    params = nni.get_next_parameter()
    start = time.time()
    if params.get("print"):
        print(params["print"], flush=True)
    time.sleep(params.get("sleep", 0))
    end = time.time()
    record = {
        "trial": os.environ["NNI_TRIAL_JOB_ID"],
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
        "order": os.environ.get("CUDA_DEVICE_ORDER", "<unset>"),
        "start": start,
        "end": end,
    }
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(json.dumps(record) + "\\n")
    nni.report_final_result({"default": params.get("x", 0)})
    """
)
TERMINAL = {"SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"}


@dataclass
class Host:
    """The stack plus the fake GPUs it sees, the trial code and the trials' run log."""

    stack: Stack
    code: Path
    sleepers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def run_log(self) -> Path:
        return Path(self.stack.extra_env["RUN_LOG"])

    # -- fake GPUs ---------------------------------------------------------------------------

    def foreign(self) -> subprocess.Popen:
        """A real process to list on a GPU: not a trial of ours (killed at the test's end)."""
        sleeper = subprocess.Popen(["sleep", "600"])
        self.sleepers.append(sleeper)
        return sleeper

    def set_gpus(self, count: int, foreign: dict[int, subprocess.Popen] | None = None) -> list[dict]:
        """Give the host ``count`` fake GPUs, and wait until the adapter publishes them."""
        foreign = foreign or {}
        gpus = [fake_gpu(i, (foreign[i].pid,) if i in foreign else ()) for i in range(count)]
        set_fake_gpus(self.stack.extra_env[STATE_VAR], gpus)
        wanted = [(i, g["name"], 1 if i in foreign else 0) for i, g in enumerate(gpus)]

        def published() -> bool:
            status = self.platform()
            if status is None:
                return False
            return [(g["index"], g["name"], g["foreignProcesses"]) for g in status["gpus"]] == wanted

        wait_until(published, 20, f"the adapter to publish {count} GPU(s) with foreign processes on {sorted(foreign)}")
        return gpus

    def end_sleepers(self) -> None:
        for sleeper in self.sleepers:
            sleeper.kill()
            sleeper.wait()  # reaped: a zombie would still look alive
        self.sleepers.clear()

    # -- REST --------------------------------------------------------------------------------

    def platform(self) -> dict | None:
        answer = self.stack.rest("GET", "/platforms")
        if answer.status_code != 200:
            return None
        replicas = [p for p in answer.json() if p["adapter"] == "local-gpu" and p["replica"] == "test-host"]
        return replicas[0] if replicas else None

    def experiment(self, training_service: dict, **overrides) -> str:
        body = {
            "experimentName": "gpus",
            "trialCommand": f"{sys.executable} trial.py",
            "trialCodeDirectory": str(self.code),
            "trialConcurrency": 4,
            "trainingService": {"platform": "local", **training_service},
            **overrides,
        }
        answer = self.stack.rest("POST", "/experiments", json=body)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def submit(self, experiment: str, **parameters) -> str:
        answer = self.stack.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": parameters})
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def trial(self, trial_id: str) -> dict:
        return self.stack.rest("GET", f"/trials/{trial_id}").json()

    def wait_status(self, trial_id: str, *statuses: str, timeout: float = 20) -> dict:
        return wait_until(
            lambda: (t := self.trial(trial_id))["status"] in statuses and t, timeout, f"trial {trial_id} {statuses}"
        )

    def wait_message(self, trial_id: str, start: str, timeout: float = 10) -> dict:
        """The trial once its ``message`` starts with ``start`` (the dispatcher's own comes first)."""
        return wait_until(
            lambda: ((t := self.trial(trial_id)).get("message") or "").startswith(start) and t,
            timeout,
            f"trial {trial_id} to say {start!r}",
        )

    def wait_ended(self, *trial_ids: str, timeout: float = 30) -> dict[str, dict]:
        return {t: self.wait_status(t, *TERMINAL, timeout=timeout) for t in trial_ids}

    # -- what the trial processes saw --------------------------------------------------------

    def runs(self, *trial_ids: str) -> dict[str, dict]:
        """The run records of these trials (each must have run exactly once)."""
        lines = self.run_log.read_text().splitlines() if self.run_log.exists() else []
        records = [json.loads(line) for line in lines]
        mine = [r for r in records if r["trial"] in trial_ids]
        assert sorted(r["trial"] for r in mine) == sorted(trial_ids), "each trial ran exactly once"
        return {r["trial"]: r for r in mine}


def most_at_once(records) -> int:
    """The largest number of runs whose [start, end) intervals overlap at one instant."""
    records = list(records)
    edges = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def write_code(root: Path) -> Path:
    code = root / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    return code


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpus")
    nats = NatsServer(root / "jetstream").start()
    env = stack_env(root, [fake_gpu(0)], TRIALBUS_STATUS_INTERVAL="1")
    stack = Stack(root=root, nats=nats, extra_env=env)
    try:
        stack.start()
        yield Host(stack, write_code(root))
    finally:
        stack.stop()
        nats.stop()


@pytest.fixture
def host(gpu_stack: Host, request):
    if "adapter" not in gpu_stack.stack.procs:  # an earlier test failed with the adapter down
        gpu_stack.stack.start("adapter")
    yield gpu_stack
    gpu_stack.end_sleepers()
    if "adapter" in gpu_stack.stack.procs:
        # Back to the fixture's one idle GPU, published: the next test's set_gpus then waits for
        # a fresh read, never matching the last test's status (same shape, a now-dead foreign pid).
        gpu_stack.set_gpus(1)
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(gpu_stack.stack.logs(), file=sys.stderr)


ACTIVE_OK = {"useActiveGpu": True}
NO_ACTIVE = {"useActiveGpu": False}


# -- placement ----------------------------------------------------------------------------------


def test_one_gpu_trials_avoid_the_gpu_with_a_foreign_process_and_never_share(host: Host):
    # Given 3 GPUs, GPU 1 running a process that is not a trial
    host.set_gpus(3, foreign={1: host.foreign()})
    experiment = host.experiment(NO_ACTIVE, trialGpuNumber=1)
    # When 6 one-GPU trials run at concurrency 4
    ids = [host.submit(experiment, x=i, sleep=0.6) for i in range(6)]
    final = host.wait_ended(*ids)
    # Then all succeed, each saw exactly one GPU, 0 or 2 (never 1), numbered in PCI bus order
    assert {t["status"] for t in final.values()} == {"SUCCEEDED"}, final
    runs = host.runs(*ids)
    assert {r["gpus"] for r in runs.values()} == {"0", "2"}
    assert {r["order"] for r in runs.values()} == {"PCI_BUS_ID"}
    # And a GPU never ran two of them at once (maxTrialNumberPerGpu 1)
    for gpu in ("0", "2"):
        assert most_at_once(r for r in runs.values() if r["gpus"] == gpu) == 1


def test_a_gpu_becomes_usable_when_its_foreign_process_exits(host: Host):
    # Given 3 GPUs, GPU 1 busy with a foreign process, and GPUs 0 and 2 taken by two trials
    sleeper = host.foreign()
    host.set_gpus(3, foreign={1: sleeper})
    experiment = host.experiment(NO_ACTIVE, trialGpuNumber=1, trialConcurrency=3)
    long = [host.submit(experiment, x=i, sleep=12) for i in range(2)]  # long enough to outlast a loaded host's start-up
    for trial_id in long:
        host.wait_status(trial_id, "RUNNING")
    third = host.submit(experiment, x=2, sleep=0.1)
    host.wait_message(third, "waiting for 1 free GPU")
    # When the foreign process exits (and nvidia-smi stops listing it), nothing restarted
    sleeper.kill()
    sleeper.wait()
    killed = time.time()
    host.set_gpus(3)
    # Then the waiting trial gets GPU 1 while the other two still hold theirs
    final = host.wait_ended(third, *long)
    assert {t["status"] for t in final.values()} == {"SUCCEEDED"}, final
    runs = host.runs(third, *long)
    assert runs[third]["gpus"] == "1"
    print(f"foreign process exit -> waiting trial start: {seconds(final[third]['startTime']) - killed:.3f}s")
    assert runs[third]["start"] < min(runs[t]["end"] for t in long)


def test_use_active_gpu_and_two_trials_per_gpu_share_one_busy_gpu(host: Host):
    # Given 1 GPU with a foreign process, useActiveGpu true and maxTrialNumberPerGpu 2
    host.set_gpus(1, foreign={0: host.foreign()})
    experiment = host.experiment({**ACTIVE_OK, "maxTrialNumberPerGpu": 2}, trialGpuNumber=1)
    # When 4 trials of 1 s run at concurrency 4
    ids = [host.submit(experiment, x=i, sleep=1) for i in range(4)]
    final = host.wait_ended(*ids)
    # Then all ran on GPU 0, two at a time and never more
    assert {t["status"] for t in final.values()} == {"SUCCEEDED"}, final
    runs = host.runs(*ids)
    assert {r["gpus"] for r in runs.values()} == {"0"}
    assert most_at_once(runs.values()) == 2


def test_a_trial_may_take_every_gpu_of_the_host(host: Host):
    host.set_gpus(3, foreign={1: host.foreign()})
    experiment = host.experiment(ACTIVE_OK, trialGpuNumber=3)
    trial_id = host.submit(experiment, x=1)
    assert host.wait_ended(trial_id)[trial_id]["status"] == "SUCCEEDED"
    run = host.runs(trial_id)[trial_id]
    assert (run["gpus"], run["order"]) == ("0,1,2", "PCI_BUS_ID")


def test_a_trial_that_needs_more_gpus_than_the_host_has_fails_at_once(host: Host):
    host.set_gpus(3)
    experiment = host.experiment(ACTIVE_OK, trialGpuNumber=4)
    began = time.monotonic()
    trial_id = host.submit(experiment, x=1)
    final = host.wait_status(trial_id, *TERMINAL, timeout=5)
    assert time.monotonic() - began < 5
    assert final["status"] == "FAILED"
    assert "trialGpuNumber is 4 but this host (test-host) has 3 GPUs" in final["message"]
    assert final["startTime"] is None
    assert not host.run_log.exists() or trial_id not in host.run_log.read_text()


def test_a_trial_waits_visibly_for_its_gpu_and_starts_as_soon_as_it_frees(host: Host):
    # Given 1 GPU and trial A on it for 2 s
    host.set_gpus(1)
    experiment = host.experiment(NO_ACTIVE, trialGpuNumber=1)
    first = host.submit(experiment, x=1, sleep=2)
    host.wait_status(first, "RUNNING")
    # When trial B is submitted right after
    second = host.submit(experiment, x=2)
    # Then, while A runs, B is WAITING and says what for
    waiting = host.wait_message(second, "waiting for 1 free GPU")
    assert waiting["status"] == "WAITING"
    assert waiting["message"].startswith("waiting for 1 free GPU"), waiting["message"]
    assert host.trial(first)["status"] == "RUNNING"
    # And B starts less than 1 s after A ends
    final = host.wait_ended(first, second)
    assert {t["status"] for t in final.values()} == {"SUCCEEDED"}, final
    gap = seconds(final[second]["startTime"]) - seconds(final[first]["endTime"])
    print(f"A's end -> B's start: {gap:.3f}s")
    assert 0 <= gap < 1, gap
    runs = host.runs(first, second)
    assert runs[second]["start"] >= runs[first]["end"]


def test_platforms_show_the_replica_its_gpus_and_who_runs_on_them(host: Host):
    # Given 3 GPUs, GPU 1 with a foreign process, and a trial running on one of the others
    gpus = host.set_gpus(3, foreign={1: host.foreign()})
    experiment = host.experiment(NO_ACTIVE, trialGpuNumber=1)
    trial_id = host.submit(experiment, x=1, sleep=30)
    host.wait_status(trial_id, "RUNNING")
    key = f"{trial_id}:0"
    # When a user lists the platforms
    status = wait_until(
        lambda: (p := host.platform()) and any(key in g["trials"] for g in p["gpus"]) and p, 10, "trial in status"
    )
    # Then one replica, test-host of local-gpu, with the fake nvidia-smi's GPUs
    everyone = host.stack.rest("GET", "/platforms").json()
    assert [(p["adapter"], p["replica"]) for p in everyone] == [("local-gpu", "test-host")]
    assert (status["gpuSource"], status["maxTrials"], status["running"], status["waiting"]) == ("nvidia-smi", 64, 1, [])
    shown = [(g["index"], g["name"], g["uuid"], g["memoryTotalMib"], g["memoryUsedMib"]) for g in status["gpus"]]
    assert shown == [(i, g["name"], g["uuid"], g["memoryTotalMib"], g["memoryUsedMib"]) for i, g in enumerate(gpus)]
    assert [g["foreignProcesses"] for g in status["gpus"]] == [0, 1, 0]
    holders = [g["index"] for g in status["gpus"] if g["trials"] == [key]]
    assert len(holders) == 1 and holders[0] in (0, 2)
    assert all(g["trials"] == [] for g in status["gpus"] if g["index"] != holders[0])
    # And `trialbus platform list` prints the same
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["--nats-url", host.stack.nats.url, "platform", "list"])
    assert result.exit_code == 0, result.output
    assert "local-gpu" in result.output and "test-host" in result.output and "1/64" in result.output
    for gpu in gpus:
        assert gpu["name"] in result.output
    host.stack.rest("POST", f"/trials/{trial_id}/cancel")
    assert host.wait_ended(trial_id)[trial_id]["status"] == "USER_CANCELED"


# -- restarts -----------------------------------------------------------------------------------


def test_an_adopted_trial_keeps_its_gpu_across_an_adapter_restart(host: Host):
    # Given 1 GPU and trial A running on it
    host.set_gpus(1)
    experiment = host.experiment(NO_ACTIVE, trialGpuNumber=1)
    first = host.submit(experiment, x=7, sleep=5)
    host.wait_status(first, "RUNNING")
    # When the adapter is killed -9, trial B comes, and the adapter comes back
    host.stack.kill("adapter")
    second = host.submit(experiment, x=8)
    host.stack.start("adapter")
    # Then B waits for A's GPU (A still holds it after the restart)
    waiting = host.wait_message(second, "waiting for 1 free GPU")
    assert waiting["status"] == "WAITING"
    # And A ends SUCCEEDED with its metric, B starts only after A's end, never both on GPU 0
    final = host.wait_ended(first, second)
    assert (final[first]["status"], final[first]["finalMetric"]) == ("SUCCEEDED", {"default": 7}), final[first]
    assert final[second]["status"] == "SUCCEEDED", final[second]
    assert seconds(final[second]["startTime"]) >= seconds(final[first]["endTime"])
    runs = host.runs(first, second)
    assert runs[first]["gpus"] == runs[second]["gpus"] == "0"
    assert runs[second]["start"] >= runs[first]["end"]


def test_the_log_of_a_finished_trial_survives_an_adapter_restart(host: Host):
    host.set_gpus(1)
    experiment = host.experiment(NO_ACTIVE, trialGpuNumber=1)
    trial_id = host.submit(experiment, x=1, print=f"hello from {experiment}")
    assert host.wait_ended(trial_id)[trial_id]["status"] == "SUCCEEDED"
    line = f"hello from {experiment}"

    def log_shows_line() -> bool:
        answer = host.stack.rest("GET", f"/trials/{trial_id}/log")
        return answer.status_code == 200 and line in answer.text

    wait_until(log_shows_line, 10, "the log before the restart")
    host.stack.restart("adapter")
    # restart() returns once the new adapter process logged "started"
    wait_until(log_shows_line, 20, "the log after the restart")


def test_finished_trial_directories_are_removed_after_the_retention(tmp_path: Path, nats_server):
    env = stack_env(tmp_path, [fake_gpu(0)], TRIALBUS_TRIAL_RETENTION="1")
    stack = Stack(root=tmp_path, nats=nats_server, extra_env=env)
    try:
        stack.start()
        host = Host(stack, write_code(tmp_path))
        experiment = host.experiment({})
        trial_id = host.submit(experiment, x=1, sleep=1)
        trials_dir = tmp_path / "data" / "local-gpu" / "test-host" / "trials" / experiment
        host.wait_status(trial_id, "RUNNING")
        assert (trials_dir / f"{trial_id}-0").is_dir()
        assert host.wait_ended(trial_id)[trial_id]["status"] == "SUCCEEDED"
        ended = time.monotonic()
        wait_until(lambda: not (trials_dir / f"{trial_id}-0").exists(), 5, "the trial directory removed")
        print(f"removed {time.monotonic() - ended:.2f}s after the end was seen")
    except BaseException:
        print(stack.logs(), file=sys.stderr)
        raise
    finally:
        stack.stop()
