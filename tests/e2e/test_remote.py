"""The remote adapter end to end: real sshd "machines", real processes, real HTTP.

Both machines are sshd servers on loopback that log in the same unprivileged user, so
they share a home directory; each trial reports the port of the sshd it came through
(``SSH_CONNECTION``), which says which machine ran it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.fixtures.gpus import FAKE_NVIDIA_SMI, set_fake_gpus
from tests.fixtures.nats import free_port
from tests.fixtures.sshd import (
    KeyPair,
    SshServer,
    known_hosts_file,
    make_key,
    require_password_user,
    require_sshd,
    ssh_user,
)
from tests.fixtures.stack import Stack
from trialbus.cli import app

pytestmark = pytest.mark.timeout(240)

TRIAL = textwrap.dedent(
    """
    import os, time
    import nni

    params = nni.get_next_parameter()
    port = int(os.environ["SSH_CONNECTION"].split()[3])
    with open(os.path.join(os.environ["NNI_OUTPUT_DIR"], "pid"), "w") as f:
        f.write(str(os.getpid()))
    for i in range(params.get("intermediate", 0)):
        nni.report_intermediate_result(params["x"] * (i + 1))
        time.sleep(params.get("pause", 0))
    if params.get("child"):
        import subprocess
        subprocess.Popen(["sleep", "300"])
    time.sleep(params.get("sleep", 0))
    nni.report_final_result({"default": params["x"], "port": port, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")})
    """
)


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    return write_code(tmp_path, TRIAL)


@pytest.fixture
def remote_root():
    """A fresh Trialbus folder in the machines' home, removed afterwards."""
    name = f".trialbus-test-{secrets.token_hex(4)}"
    yield name
    shutil.rmtree(ssh_user().home / name, ignore_errors=True)


def machine(server: SshServer, key: KeyPair | None = None, **extra) -> dict:
    entry = {"host": server.host, "port": server.port, "user": ssh_user().name, **extra}
    if key is not None:
        entry["sshKeyFile"] = str(key.private)
    return entry


def remote_config(code_dir: Path, machines: list[dict], **overrides) -> dict:
    return {
        "experimentName": "remote-e2e",
        "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(code_dir),
        "trialConcurrency": 4,
        "trainingService": {"platform": "remote", "machineList": machines},
        **overrides,
    }


def start_stack(root: Path, nats_server, servers, remote_root: str, **env: str) -> Stack:
    require_sshd()
    known = known_hosts_file(root / "known_hosts", *servers)
    stack = Stack(
        root=root,
        nats=nats_server,
        extra_env={
            "TRIALBUS_SSH_KNOWN_HOSTS": str(known),
            "TRIALBUS_REMOTE_ROOT": remote_root,
            "TRIALBUS_RELAY_AFTER": "1",
            "TRIALBUS_SSH_KEEPALIVE": "1",
            **env,
        },
    )
    return stack.start("dispatcher", "gateway", "remote")


@pytest.fixture
def remote_stack(tmp_path: Path, nats_server, sshd_pair, remote_root, stacks):
    stacks.append(start_stack(tmp_path, nats_server, sshd_pair, remote_root))
    return stacks[-1]


def metrics(stack: Stack, trial_id: str) -> list[dict]:
    return stack.rest("GET", f"/trials/{trial_id}/metrics").json()


def test_twenty_trials_over_two_machines_all_metrics_arrive(remote_stack, sshd_pair, ssh_key, code_dir, remote_root):
    machines = [machine(server, ssh_key) for server in sshd_pair]
    experiment = create(remote_stack, remote_config(code_dir, machines))
    ids = [submit(remote_stack, experiment, {"x": i, "intermediate": 3, "sleep": 0.3}) for i in range(20)]
    finals = [ended(remote_stack, t, timeout=120) for t in ids]
    assert [t["status"] for t in finals] == ["SUCCEEDED"] * 20, [t.get("message") for t in finals]
    assert [t["finalMetric"]["default"] for t in finals] == list(range(20))
    ports = {t["finalMetric"]["port"] for t in finals}
    assert ports == {server.port for server in sshd_pair}, "trials should spread over both machines"
    for trial_id in ids:
        records = metrics(remote_stack, trial_id)
        assert [(r["type"], r["sequence"]) for r in records] == [
            ("PERIODICAL", 0),
            ("PERIODICAL", 1),
            ("PERIODICAL", 2),
            ("FINAL", 0),
        ]
    status = remote_stack.rest("GET", "/platforms").json()
    remote = next(s for s in status if s["adapter"] == "remote")
    assert {m["name"] for m in remote["machines"]} == {f"{ssh_user().name}@127.0.0.1:{s.port}" for s in sshd_pair}
    assert all(m["up"] for m in remote["machines"])
    # Each machine's agent forks these Python trials from its warm template (a trial that finds
    # the template still starting, under load, starts cold instead)
    found = (ssh_user().home / remote_root).glob("trials/*/*/.trialbus/state.json")
    states = [json.loads(path.read_text()) for path in found]
    assert len(states) == 20 and sum(s.get("warm", False) for s in states) >= 10, states
    # And the agent's folder is its SSH user's alone: another account on the machine lists nothing in it
    assert stat.S_IMODE((ssh_user().home / remote_root).stat().st_mode) == 0o700


def test_password_and_passphrase_keys_work(remote_stack, sshd_pair, tmp_path, code_dir):
    user = require_password_user()
    key = make_key(tmp_path, "locked", passphrase="open sesame")
    sshd_pair[1].authorize(key)
    by_password = create(remote_stack, remote_config(code_dir, [machine(sshd_pair[0], password=user.password)]))
    by_passphrase = create(
        remote_stack, remote_config(code_dir, [machine(sshd_pair[1], key, sshPassphrase="open sesame")])
    )
    first = ended(remote_stack, submit(remote_stack, by_password, {"x": 1}))
    second = ended(remote_stack, submit(remote_stack, by_passphrase, {"x": 2}))
    assert (first["status"], first["finalMetric"]["port"]) == ("SUCCEEDED", sshd_pair[0].port), first
    assert (second["status"], second["finalMetric"]["port"]) == ("SUCCEEDED", sshd_pair[1].port), second
    shown = remote_stack.rest("GET", f"/experiments/{by_password}").json()["config"]["trainingService"]
    assert shown["machineList"][0]["password"] == "**********"
    everything = "".join(remote_stack.log(name) for name in ("dispatcher", "gateway", "remote"))
    assert user.password not in everything and "open sesame" not in everything


def test_bad_machines_are_refused_at_creation_with_the_reason(
    tmp_path, nats_server, sshd_pair, sshd, ssh_key, remote_root, stacks, code_dir
):
    stack = start_stack(tmp_path, nats_server, sshd_pair, remote_root)
    stacks.append(stack)
    other = make_key(tmp_path, "impostor")  # a host key that is not the server's
    (tmp_path / "known_hosts").write_text(
        sshd_pair[0].known_hosts_line() + "\n" + f"[127.0.0.1]:{sshd_pair[1].port} {other.public}\n"
    )
    nowhere = {"host": "127.0.0.1", "port": free_port(), "user": ssh_user().name, "sshKeyFile": str(ssh_key.private)}
    cases = {
        "wrong password": ([machine(sshd_pair[0], password="not-the-password")], "authentication failed"),
        "missing key": ([machine(sshd_pair[0], sshKeyFile=str(tmp_path / "nope"))], "does not exist"),
        "changed host key": ([machine(sshd_pair[1], ssh_key)], "does not match the one in"),
        "unknown host key": ([machine(sshd, ssh_key)], f"ssh-keyscan -p {sshd.port} 127.0.0.1 >>"),
        "nothing listens": ([nowhere], "connection refused"),
        "no python3 there": ([machine(sshd_pair[0], ssh_key, pythonPath="/nonexistent")], "has no python3"),
        "one bad of two": ([machine(sshd_pair[0], ssh_key), nowhere], "connection refused"),
    }
    for name, (machines, reason) in cases.items():
        reply = stack.rest("POST", "/experiments", json=remote_config(code_dir, machines))
        assert reply.status_code == 422, (name, reply.text)
        assert "the remote platform cannot run this experiment" in reply.json()["error"], name
        assert reason in reply.json()["error"], (name, reply.json()["error"])
    assert stack.rest("GET", "/experiments").json() == [], "nothing is created"
    bad = remote_config(code_dir, [machine(sshd_pair[0], password=12345)])
    reply = stack.rest("POST", "/experiments", json=bad)
    assert reply.status_code == 422 and "must be a string" in reply.json()["error"]
    bad = remote_config(code_dir, [machine(sshd_pair[0], ssh_key, port=70000)])
    reply = stack.rest("POST", "/experiments", json=bad)
    assert reply.status_code == 422 and "port" in reply.json()["error"]


def test_a_machine_that_goes_bad_after_creation_fails_its_trials_with_the_reason(
    tmp_path, nats_server, sshd_pair, ssh_key, remote_root, stacks, code_dir
):
    stack = start_stack(tmp_path, nats_server, sshd_pair, remote_root, TRIALBUS_UNREACHABLE_TIMEOUT="2")
    stacks.append(stack)
    stack.kill("remote")  # not there to check at creation
    down = machine(sshd_pair[1], ssh_key)
    experiment = create(stack, remote_config(code_dir, [machine(sshd_pair[0], password="not-the-password")]))
    unreachable = create(stack, remote_config(code_dir, [down]))
    sshd_pair[1].stop()
    first, second = submit(stack, experiment, {"x": 0}), submit(stack, unreachable, {"x": 0})
    stack.start("remote")
    found = ended(stack, first)
    assert found["status"] == "FAILED" and "authentication failed" in found["message"], found
    found = ended(stack, second)
    assert found["status"] == "FAILED" and "no machine reachable for 2s" in found["message"], found
    assert "connection refused" in found["message"]


def test_a_dropped_connection_leaves_the_trial_running_and_loses_nothing(remote_stack, sshd_pair, ssh_key, code_dir):
    server = sshd_pair[0]
    experiment = create(remote_stack, remote_config(code_dir, [machine(server, ssh_key)]))
    trial_id = submit(remote_stack, experiment, {"x": 7, "intermediate": 6, "pause": 1})
    wait_until(lambda: trial(remote_stack, trial_id)["intermediateCount"] >= 1, 30, "the first metric")
    server.stop()  # every SSH session drops; the trial's process group runs on
    message = wait_until(lambda: trial(remote_stack, trial_id)["message"], 15, "the stale-status message")
    assert "unreachable" in message and trial(remote_stack, trial_id)["status"] == "RUNNING"
    time.sleep(2)
    server.start()
    found = ended(remote_stack, trial_id, timeout=60)
    assert found["status"] == "SUCCEEDED" and found["message"] is None, found
    assert [r["sequence"] for r in metrics(remote_stack, trial_id) if r["type"] == "PERIODICAL"] == list(range(6))


def test_metrics_of_a_machine_that_cannot_reach_the_gateway_arrive_over_ssh(
    tmp_path, nats_server, sshd_pair, ssh_key, remote_root, stacks, code_dir
):
    blocked = f"http://127.0.0.1:{free_port()}"  # nothing listens: as a firewall between machine and gateway
    stack = start_stack(tmp_path, nats_server, sshd_pair, remote_root, TRIALBUS_TRIAL_GATEWAY_URL=blocked)
    stacks.append(stack)
    experiment = create(stack, remote_config(code_dir, [machine(sshd_pair[0], ssh_key)]))
    ids = [submit(stack, experiment, {"x": i, "intermediate": 3}) for i in range(2)]
    for trial_id in ids:
        found = ended(stack, trial_id, timeout=60)
        assert found["status"] == "SUCCEEDED", found
        assert [(r["type"], r["sequence"]) for r in metrics(stack, trial_id)] == [
            ("PERIODICAL", 0),
            ("PERIODICAL", 1),
            ("PERIODICAL", 2),
            ("FINAL", 0),
        ]
    assert "over SSH" in stack.log("remote")


def test_a_restarted_adapter_adopts_running_remote_trials(remote_stack, sshd_pair, ssh_key, code_dir):
    experiment = create(remote_stack, remote_config(code_dir, [machine(s, ssh_key) for s in sshd_pair]))
    ids = [submit(remote_stack, experiment, {"x": i, "intermediate": 4, "pause": 0.7}) for i in range(2)]
    for trial_id in ids:
        wait_until(lambda t=trial_id: trial(remote_stack, t)["status"] == "RUNNING", 30, "RUNNING")
    remote_stack.kill("remote")
    remote_stack.start("remote")
    for trial_id in ids:
        found = ended(remote_stack, trial_id, timeout=60)
        assert found["status"] == "SUCCEEDED", found
        assert found["intermediateCount"] == 4
    home = ssh_user().home / remote_stack.extra_env["TRIALBUS_REMOTE_ROOT"]
    trial_dirs = list((home / "trials" / experiment).iterdir())
    assert sorted(d.name for d in trial_dirs) == sorted(f"{t}-0" for t in ids)  # each ran once
    remote_stack.restart("remote")  # finished trials' logs come from their machine, after a restart too
    log = remote_stack.rest("GET", f"/trials/{ids[0]}/log")
    assert log.status_code == 200 and "NNISDK_MEb" in log.text, log.text


def test_stopping_an_experiment_leaves_no_process_on_any_machine(remote_stack, sshd_pair, ssh_key, code_dir):
    experiment = create(remote_stack, remote_config(code_dir, [machine(s, ssh_key) for s in sshd_pair]))
    # (a sleep of its own length: other tests on this machine may run a `sleep 300` at the same time)
    ids = [submit(remote_stack, experiment, {"x": i, "child": True, "sleep": 313}) for i in range(4)]
    for trial_id in ids:
        wait_until(lambda t=trial_id: trial(remote_stack, t)["status"] == "RUNNING", 30, "RUNNING")
    home = ssh_user().home / remote_stack.extra_env["TRIALBUS_REMOTE_ROOT"] / "trials" / experiment
    pids = wait_until(
        lambda: [int(p.read_text()) for p in home.glob("*/pid")] if len(list(home.glob("*/pid"))) == 4 else None,
        30,
        "every trial to start",
    )
    assert remote_stack.rest("DELETE", f"/experiments/{experiment}").status_code == 200
    for trial_id in ids:
        assert ended(remote_stack, trial_id, timeout=30)["status"] == "USER_CANCELED"
    wait_until(lambda: not any(alive(pid) for pid in pids), 15, "the trials' processes to exit")
    wait_until(lambda: not sleepers(313), 15, "the trials' children to exit")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def sleepers(seconds: int) -> list[int]:
    """Processes of the machines' user running ``sleep <seconds>`` (the trials' children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (
                    entry.stat().st_uid == ssh_user().uid
                    and (entry / "cmdline").read_bytes() == f"sleep\0{seconds}\0".encode()
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def fake_gpus():
    """``nvidia-smi`` that the machines' user can run: 2 idle fake GPUs."""
    folder = Path(tempfile.mkdtemp(prefix="tb-fake-gpus-"))
    folder.chmod(0o755)
    shutil.copy(FAKE_NVIDIA_SMI, folder / "fake_nvidia_smi.py")
    gpu = {"name": "Fake GPU", "memoryTotalMib": 16384, "memoryUsedMib": 0, "gpuUtil": 0, "memoryUtil": 0}
    set_fake_gpus(folder / "state.json", [gpu, gpu])
    (folder / "state.json").chmod(0o644)
    script = folder / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\nFAKE_NVIDIA_SMI_STATE={folder}/state.json exec python3 {folder}/fake_nvidia_smi.py "$@"\n'
    )
    script.chmod(0o755)
    yield script
    shutil.rmtree(folder, ignore_errors=True)


def test_gpus_are_placed_per_machine_by_the_shared_rules(
    tmp_path, nats_server, sshd_pair, ssh_key, remote_root, stacks, code_dir, fake_gpus
):
    stack = start_stack(tmp_path, nats_server, sshd_pair, remote_root, TRIALBUS_NVIDIA_SMI=str(fake_gpus))
    stacks.append(stack)
    a, b = sshd_pair
    machines = [machine(a, ssh_key, gpuIndices="1"), machine(b, ssh_key)]  # slots: a:1, b:0, b:1
    experiment = create(stack, remote_config(code_dir, machines, trialGpuNumber=1, trialConcurrency=4))
    ids = [submit(stack, experiment, {"x": i, "sleep": 2.5}) for i in range(4)]

    def three_run_one_waits_for_a_gpu():
        found = [trial(stack, i) for i in ids]
        waiting = [t["message"] or "" for t in found if t["status"] == "WAITING"]
        running = [t for t in found if t["status"] == "RUNNING"]
        return len(running) == 3 and len(waiting) == 1 and "GPU" in waiting[0]

    wait_until(three_run_one_waits_for_a_gpu, 30, "three trials on the three free GPUs, one waiting for a GPU")
    finals = [ended(stack, t, timeout=60) for t in ids]
    assert [t["status"] for t in finals] == ["SUCCEEDED"] * 4, finals
    placed = {(t["finalMetric"]["port"], t["finalMetric"]["cuda"]) for t in finals}
    assert placed == {(a.port, "1"), (b.port, "0"), (b.port, "1")}, placed
    status = next(s for s in stack.rest("GET", "/platforms").json() if s["adapter"] == "remote")
    assert all(len(m["gpus"]) == 2 for m in status["machines"]), status["machines"]
    sshd_pair[1].stop()
    wait_until(
        lambda: any(
            not m["up"]
            for s in stack.rest("GET", "/platforms").json()
            if s["adapter"] == "remote"
            for m in s["machines"]
        ),
        20,
        "the platform status to show the machine down",
    )
    shown = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["--nats-url", stack.nats.url, "platform", "list"])
    assert shown.exit_code == 0, shown.output
    assert f"{ssh_user().name}@127.0.0.1:{a.port}" in shown.output and "0: Fake GPU" in shown.output
    assert f"{ssh_user().name}@127.0.0.1:{b.port}" in shown.output and "unreachable" in shown.output
    # Once the experiment is over, its machines leave the platform status (the panel lists no stale "down").
    assert stack.rest("DELETE", f"/experiments/{experiment}").status_code == 200
    remote = lambda: next(s for s in stack.rest("GET", "/platforms").json() if s["adapter"] == "remote")  # noqa: E731
    wait_until(lambda: not remote()["machines"], 20, "the finished experiment's machines to leave the platform status")


def test_a_machine_down_longer_than_the_timeout_fails_its_trials_and_they_are_stopped_when_it_is_back(
    tmp_path, nats_server, sshd_pair, ssh_key, remote_root, stacks, code_dir
):
    stack = start_stack(tmp_path, nats_server, sshd_pair, remote_root, TRIALBUS_UNREACHABLE_TIMEOUT="3")
    stacks.append(stack)
    server = sshd_pair[0]
    experiment = create(stack, remote_config(code_dir, [machine(server, ssh_key)]))
    trial_id = submit(stack, experiment, {"x": 1, "sleep": 300})
    pid_file = ssh_user().home / remote_root / "trials" / experiment / f"{trial_id}-0" / "pid"
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, "the trial to start"))
    server.stop()
    found = ended(stack, trial_id, timeout=30)
    # the attempt on the lost machine failed (infrastructure), and its retry found no machine at all
    [lost] = found["attempts"]
    assert (lost["failure"], lost["status"]) == ("infrastructure", "FAILED") and "gave up after 3s" in lost["message"]
    assert found["status"] == "FAILED" and "no machine reachable" in found["message"], found
    assert alive(pid), "an unreachable machine's trial is not ours to kill until it is back"
    server.start()
    wait_until(lambda: not alive(pid), 30, "the abandoned trial to be stopped once its machine is back")


def test_new_host_keys_are_trusted_on_first_use_only_when_asked(
    tmp_path, nats_server, sshd_pair, ssh_key, remote_root, stacks, code_dir
):
    stack = start_stack(tmp_path, nats_server, sshd_pair[:1], remote_root, TRIALBUS_SSH_TRUST_NEW_HOSTS="true")
    stacks.append(stack)
    newcomer = sshd_pair[1]
    experiment = create(stack, remote_config(code_dir, [machine(newcomer, ssh_key)]))
    assert ended(stack, submit(stack, experiment, {"x": 3}))["status"] == "SUCCEEDED"
    known = (tmp_path / "known_hosts").read_text().splitlines()
    assert newcomer.known_hosts_line() in known, "the trusted key is recorded"
    assert "trusted the new host key" in stack.log("remote")


def test_teams_share_a_pool_of_machines_by_quota_and_other_pools_are_left_alone(
    tmp_path, nats_server, sshd_pair, ssh_key, remote_root, stacks, code_dir, fake_gpus
):
    stack = start_stack(
        tmp_path, nats_server, sshd_pair, remote_root, TRIALBUS_NVIDIA_SMI=str(fake_gpus), TRIALBUS_STATUS_INTERVAL="1"
    )
    stacks.append(stack)
    a, b = sshd_pair
    tokens = {}
    for name, team in (("ana", "vision"), ("bo", "nlp")):
        added = stack.rest("POST", "/users", json={"name": name, "team": team, "role": "member"})
        assert added.status_code == 201, added.text
        tokens[name] = added.json()["token"]

    def experiment(person: str, server: SshServer, pool: str, concurrency: int) -> str:
        body = remote_config(code_dir, [machine(server, ssh_key)], trialGpuNumber=1, trialConcurrency=concurrency)
        body["trainingService"]["pool"] = pool
        made = stack.rest("POST", "/experiments", json=body, headers={"Authorization": f"Bearer {tokens[person]}"})
        assert made.status_code == 201, made.text
        return made.json()["id"]

    # Given team nlp's quota of 1 GPU in pool lab (machine a, 2 GPUs), set by the admin with the CLI
    shown = CliRunner().invoke(
        app, ["--nats-url", stack.nats.url, "team", "set", "nlp", "--platform", "remote/lab", "--gpus", "1"]
    )
    assert shown.exit_code == 0 and "team nlp on remote/lab: 1 GPUs" in shown.output, shown.output
    # And team vision running two long trials on lab's two GPUs (borrowing nlp's), one on pool night's machine b
    lab, night = experiment("ana", a, "lab", 2), experiment("ana", b, "night", 1)
    long = [submit(stack, lab, {"x": i, "sleep": 15}) for i in range(2)]
    other = submit(stack, night, {"x": 9, "sleep": 15})
    wait_until(lambda: all(trial(stack, t)["status"] == "RUNNING" for t in [*long, other]), 60, "vision's trials")

    def vision_in(pool: str) -> dict:
        return next(t for t in stack.rest("GET", "/teams").json() if t["name"] == "vision")["use"].get(pool) or {}

    wait_until(lambda: vision_in("remote/lab").get("capacity", {}).get("gpus") == 2, 20, "pool lab's 2 GPUs known")
    assert vision_in("remote/lab")["borrowedGpus"] == 2 and vision_in("remote/night")["capacity"]["gpus"] == 2

    # When team nlp submits a trial to pool lab
    theirs = experiment("bo", a, "lab", 1)
    short = submit(stack, theirs, {"x": 5, "sleep": 0.5})
    # Then one of vision's lab trials is preempted for it, and it runs and succeeds
    assert ended(stack, short, timeout=60)["status"] == "SUCCEEDED"
    finals = {t: ended(stack, t, timeout=90) for t in [*long, other]}
    assert {f["status"] for f in finals.values()} == {"SUCCEEDED"}, finals
    preempted = [f for f in finals.values() if f["attempt"] == 1]
    assert len(preempted) == 1 and preempted[0]["id"] in long, finals
    first = preempted[0]["attempts"][0]
    assert (
        first["status"] == "PREEMPTED" and "reclaimed by team nlp (its quota on remote/lab: 1 GPUs)" in first["message"]
    )
    # and the trial in pool night, where nlp has no quota, ran once, untouched
    assert finals[other]["attempt"] == 0 and finals[other]["finalMetric"]["port"] == b.port
