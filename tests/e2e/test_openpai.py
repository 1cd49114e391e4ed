"""The openpai adapter end to end, against the OpenPAI emulator over real HTTP.

The emulator (``tests/emulators/openpai``) runs each task as a real process on this host;
the share is a folder here (``localStorageMountPoint``) that the "containers" reach under
another path (``containerStorageMountPoint``, a link the emulator makes), so the adapter
must use each path where it belongs. The fixtures (``share``, ``pai``, ``pai_stack``) are
``tests/fixtures/openpai.py``'s, which ``tests/e2e/conftest.py`` offers every e2e test.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from datetime import UTC, datetime

import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.emulators.openpai import start_openpai
from tests.fixtures.openpai import openpai_config, pai_job
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(240)

TRIAL = textwrap.dedent(
    """
    import os, sys, time
    import nni

    params = nni.get_next_parameter()
    for i in range(params.get("intermediate", 0)):
        nni.report_intermediate_result(params["x"] * (i + 1))
    time.sleep(params.get("sleep", 0))
    if "exit" in params:
        sys.exit(params["exit"])
    nni.report_final_result({"default": params["x"], "role": os.environ.get("PAI_CURRENT_TASK_ROLE_NAME")})
    """
)


def test_twenty_trials_run_as_jobs_and_every_metric_arrives(pai_stack, pai, share, tmp_path):
    experiment = create(pai_stack, openpai_config(write_code(tmp_path, TRIAL), pai, share))
    ids = [submit(pai_stack, experiment, {"x": i, "intermediate": 2}) for i in range(20)]
    finals = [ended(pai_stack, t, timeout=120) for t in ids]
    assert [t["status"] for t in finals] == ["SUCCEEDED"] * 20, [t["message"] for t in finals]
    assert [t["finalMetric"]["default"] for t in finals] == list(range(20))
    for trial_id in ids:
        records = pai_stack.rest("GET", f"/trials/{trial_id}/metrics").json()
        assert [(r["type"], r["sequence"]) for r in records] == [("PERIODICAL", 0), ("PERIODICAL", 1), ("FINAL", 0)]
    shown = pai_stack.rest("GET", f"/experiments/{experiment}").json()["config"]["trainingService"]
    assert shown["token"] == "**********"
    everything = "".join(pai_stack.log(n) for n in ("dispatcher", "gateway", "openpai")) + pai.log()
    assert pai.token("alice") not in everything


def test_failures_are_classified_and_cancel_stops_the_job(pai_stack, pai, share, tmp_path):
    experiment = create(pai_stack, openpai_config(write_code(tmp_path, TRIAL), pai, share))
    failing = submit(pai_stack, experiment, {"x": 1, "exit": 3})
    sleeper = submit(pai_stack, experiment, {"x": 2, "sleep": 60})
    found = ended(pai_stack, failing)
    assert found["status"] == "FAILED" and found["exitCode"] == 3, found
    code = pai_job(pai, experiment, failing)["jobStatus"]
    spec = code["appExitSpec"]
    assert f"exit code {code['appExitCode']} ({spec['phrase']}, {spec['behavior'].lower()})" in found["message"]
    assert "the trial command exited with 3" in found["message"], found["message"]
    wait_until(lambda: trial(pai_stack, sleeper)["status"] == "RUNNING", 30, "RUNNING")
    assert pai_stack.rest("POST", f"/trials/{sleeper}/cancel").status_code == 202
    assert ended(pai_stack, sleeper)["status"] == "USER_CANCELED"
    assert pai_job(pai, experiment, sleeper)["jobStatus"]["state"] == "STOPPED"


def through_a_restart(stack: Stack, experiment: str) -> list[str]:
    """Two trials that run while the adapter is killed and started again: both end SUCCEEDED
    with their metric (the new run adopted them); their ids."""
    ids = [submit(stack, experiment, {"x": i, "intermediate": 1, "sleep": 3}) for i in range(2)]
    for trial_id in ids:
        wait_until(lambda t=trial_id: trial(stack, t)["status"] == "RUNNING", 30, "RUNNING")
    stack.kill("openpai")
    stack.start("openpai")
    for trial_id in ids:
        found = ended(stack, trial_id)
        assert found["status"] == "SUCCEEDED" and found["intermediateCount"] == 1, found
    return ids


def test_a_restarted_adapter_adopts_running_jobs(pai_stack, pai, share, tmp_path):
    experiment = create(pai_stack, openpai_config(write_code(tmp_path, TRIAL), pai, share))
    ids = through_a_restart(pai_stack, experiment)
    # Logs of trials that ended before this run of the adapter come from the share.
    pai_stack.kill("openpai")
    pai_stack.start("openpai")
    log = pai_stack.rest("GET", f"/trials/{ids[0]}/log")
    assert log.status_code == 200 and "==> taskrole-0/stdout <==" in log.text and "NNISDK_MEb" in log.text, log.text


def test_a_two_role_trial_runs_both_roles_and_reports_once(pai_stack, pai, share, tmp_path):
    small = {"gpu": 0, "cpu": 1, "memoryMB": 1024}
    job = {
        "protocolVersion": 2,
        "name": "x",
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "python:3.11"}],
        "parameters": {"epochs": 3},
        "taskRoles": {
            "worker": {
                "instances": 2,
                "dockerImage": "img",
                "resourcePerInstance": small,
                "commands": [
                    "env | grep ^PAI_ > pai-env-$PAI_CURRENT_TASK_ROLE_NAME-$PAI_TASK_INDEX.txt",
                    "python3 trial.py",
                ],
            },
            "ps": {
                "instances": 1,
                "dockerImage": "img",
                "resourcePerInstance": small,
                "completion": {"minSucceededInstances": -1},  # the workers decide when the trial is done
                "commands": ["echo epochs <% $parameters.epochs %> > ps-epochs.txt", "python3 trial.py"],
            },
        },
    }
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, openpaiConfig=job, reportingTaskRole="worker")
    experiment = create(pai_stack, config)
    trial_id = submit(pai_stack, experiment, {"x": 5})
    found = ended(pai_stack, trial_id)
    assert found["status"] == "SUCCEEDED" and found["finalMetric"] == {"default": 5, "role": "worker"}, found
    records = pai_stack.rest("GET", f"/trials/{trial_id}/metrics").json()
    assert [(r["type"], r["value"]) for r in records] == [("FINAL", {"default": 5, "role": "worker"})]
    code = next((share[0] / "trialbus" / "code").iterdir())
    assert (code / "ps-epochs.txt").read_text().strip() == "epochs 3", "parameters are rendered by OpenPAI"
    worker1 = (code / "pai-env-worker-1.txt").read_text()
    assert "PAI_TASK_ROLE_TASK_COUNT_worker=2" in worker1 and "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX=1" in worker1


def test_bad_settings_are_refused_at_creation(pai_stack, pai, share, tmp_path):
    code = write_code(tmp_path, TRIAL)
    cases = {
        "bad token": (openpai_config(code, pai, share, token="not-a-token"), "OpenPAI refused the token"),
        "no share": (
            openpai_config(code, pai, share, localStorageMountPoint=str(tmp_path / "nope")),
            "is not a directory on the adapter's host",
        ),
        "unknown storage": (
            openpai_config(code, pai, share, storageConfigName="nope"),
            "storageConfigName 'nope' is not a storage",
        ),
    }
    for name, (config, reason) in cases.items():
        reply = pai_stack.rest("POST", "/experiments", json=config)
        assert reply.status_code == 422 and reason in reply.json()["error"], (name, reply.text)
    assert "not-a-token" not in reply.text
    shutil.rmtree(tmp_path / "nope", ignore_errors=True)


def test_a_forbidden_virtual_cluster_fails_the_trial_with_the_reason(tmp_path, nats_server, share, request):
    local, container = share
    emulator = start_openpai(tmp_path / "pai", mounts={str(container): str(local)}, vcs={"gpu": ["bob"]})
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_STATUS_POLL": "0.3"})
    try:
        stack.start("dispatcher", "gateway", "openpai")
        experiment = create(stack, openpai_config(write_code(tmp_path, TRIAL), emulator, share, virtualCluster="gpu"))
        found = ended(stack, submit(stack, experiment, {"x": 1}))
        assert found["status"] == "FAILED", found
        assert "OpenPAI forbids submitting job" in found["message"] and "gpu" in found["message"], found["message"]
    finally:
        stack.stop()
        emulator.stop()


def test_a_429_storm_is_ridden_out(tmp_path, nats_server, share):
    local, container = share
    emulator = start_openpai(tmp_path / "pai", mounts={str(container): str(local)}, submit_limit=3, submit_window=3)
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_STATUS_POLL": "0.3"})
    try:
        stack.start("dispatcher", "gateway", "openpai")
        experiment = create(stack, openpai_config(write_code(tmp_path, TRIAL), emulator, share))
        ids = [submit(stack, experiment, {"x": i}) for i in range(8)]
        finals = [ended(stack, t, timeout=90) for t in ids]
        assert [t["status"] for t in finals] == ["SUCCEEDED"] * 8, [t["message"] for t in finals]
        assert "OpenPAI rate limit" in stack.log("openpai")
    finally:
        stack.stop()
        emulator.stop()


def test_unknown_states_failed_reads_and_a_queue_keep_the_trial_running_and_say_so(tmp_path, nats_server, share):
    local, container = share
    emulator = start_openpai(tmp_path / "pai", mounts={str(container): str(local)}, lag=3)
    stack = Stack(
        root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_STATUS_POLL": "0.3", "TRIALBUS_QUEUE_NOTE_AFTER": "1"}
    )
    try:
        stack.start("dispatcher", "gateway", "openpai")
        experiment = create(stack, openpai_config(write_code(tmp_path, TRIAL), emulator, share))
        trial_id = submit(stack, experiment, {"x": 1, "sleep": 4})
        framework = f"alice~trialbus_{experiment}_{trial_id}"

        def message() -> str:
            found = trial(stack, trial_id)
            assert found["status"] == "RUNNING", found
            return found["message"] or ""

        wait_until(lambda: trial(stack, trial_id)["status"] == "RUNNING", 30, "RUNNING")
        wait_until(lambda: message() == f"job {framework} is waiting in OpenPAI's queue", 10, "the queue note")
        wait_until(lambda: message() == "", 10, "the note cleared once the job runs")
        emulator.faults(job_list_errors=1000)
        wait_until(
            lambda: message().startswith(f"cannot read the state of job {framework} from OpenPAI: "),
            10,
            "the failed reads said",
        )
        assert "500" in message()
        emulator.faults(unknown=(framework,))
        wait_until(
            lambda: message() == f"OpenPAI reports job {framework} in state UNKNOWN; waiting for it to settle",
            10,
            "UNKNOWN said",
        )
        time.sleep(4)  # the job ends meanwhile, but OpenPAI does not say so: the trial keeps running
        assert message().startswith("OpenPAI reports job")
        emulator.faults()
        found = ended(stack, trial_id)
        assert found["status"] == "SUCCEEDED" and not found["message"], found
    finally:
        stack.stop()
        emulator.stop()


def test_a_restarted_replica_adopts_only_its_own_jobs(tmp_path, nats_server, share):
    local, container = share
    emulator = start_openpai(tmp_path / "pai", mounts={str(container): str(local)})
    stack = Stack(
        root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_STATUS_POLL": "0.3", "TRIALBUS_STATUS_INTERVAL": "0.5"}
    )
    try:
        stack.start("dispatcher", "gateway", "openpai@b")
        experiment = create(stack, openpai_config(write_code(tmp_path, TRIAL), emulator, share))
        ids = [submit(stack, experiment, {"x": i, "sleep": 6}) for i in range(2)]
        for trial_id in ids:
            wait_until(lambda t=trial_id: trial(stack, t)["status"] == "RUNNING", 30, "RUNNING on replica b")
        stack.start("openpai")  # replica test-host, which launched nothing
        stack.kill("openpai")
        restarted = datetime.now(UTC)
        stack.start("openpai")

        def clusters() -> dict[str, list[dict]]:
            replicas = stack.rest("GET", "/platforms").json()
            return {
                p["replica"]: p["clusters"]
                for p in replicas
                if p["adapter"] == "openpai" and datetime.fromisoformat(p["time"]) > restarted
            }

        wait_until(lambda: {"b", "test-host"} <= clusters().keys(), 20, "both replicas' status")
        found = clusters()
        assert [c["jobs"] for c in found["b"]] == [2], found
        assert sum(c["jobs"] for c in found["test-host"]) == 0, "the other replica's jobs are not adopted"
        assert [ended(stack, t)["status"] for t in ids] == ["SUCCEEDED"] * 2
    finally:
        stack.stop()
        emulator.stop()


def test_teams_share_a_virtual_cluster_s_gpus_by_quota(pai_stack, pai, share, tmp_path):
    # Given an OpenPAI virtual cluster of 8 GPUs (the emulator says so) and team nlp's quota of 4 there
    tokens = {}
    for name, team in (("ana", "vision"), ("bo", "nlp")):
        added = pai_stack.rest("POST", "/users", json={"name": name, "team": team, "role": "member"})
        assert added.status_code == 201, added.text
        tokens[name] = added.json()["token"]
    quota = {"platforms": {"openpai/default": {"gpus": 4}}}
    assert pai_stack.rest("PUT", "/teams/nlp", json=quota).status_code == 200
    code = write_code(tmp_path, TRIAL)

    def experiment(person: str, concurrency: int) -> str:
        body = openpai_config(code, pai, share) | {"trialGpuNumber": 4, "trialConcurrency": concurrency}
        made = pai_stack.rest("POST", "/experiments", json=body, headers={"Authorization": f"Bearer {tokens[person]}"})
        assert made.status_code == 201, made.text
        return made.json()["id"]

    def vision() -> dict:
        return next((t["use"] for t in pai_stack.rest("GET", "/teams").json() if t["name"] == "vision"), {})

    # And team vision's two 4-GPU trials running on all 8 (borrowing nlp's 4), a third waiting, saying why
    mine = experiment("ana", 4)

    def vc_gpus() -> list:
        return [c["virtualClusters"] for p in pai_stack.rest("GET", "/platforms").json() for c in p["clusters"]]

    wait_until(lambda: vc_gpus() == [{"default": 8}], 20, "the adapter to publish the virtual cluster's GPUs")
    long = [submit(pai_stack, mine, {"x": i, "sleep": 10}) for i in range(4)]
    wait_until(lambda: sum(trial(pai_stack, t)["status"] == "RUNNING" for t in long) == 2, 60, "two running")
    third, fourth = long[2:]
    why = wait_until(
        lambda: "GPUs of openpai/default" in (m := trial(pai_stack, third)["message"] or "") and m, 20, "why"
    )
    # (the one behind it in the experiment's queue says whose turn it waits for)
    assert trial(pai_stack, fourth)["message"] == f"queued behind trial {third}, which is {why}"
    assert why.startswith("waiting for 4 free GPUs (0 of 8 GPUs of openpai/default free)"), why
    assert vision()["openpai/default"]["borrowedGpus"] == 8
    # When team nlp submits a 4-GPU trial there
    theirs = experiment("bo", 1)
    short = submit(pai_stack, theirs, {"x": 7})
    # Then one of vision's running trials is preempted (its job stopped) and nlp's runs and succeeds
    assert ended(pai_stack, short, timeout=90)["status"] == "SUCCEEDED"
    finals = [ended(pai_stack, t, timeout=120) for t in long]
    assert [f["status"] for f in finals] == ["SUCCEEDED"] * 4, finals
    preempted = [f for f in finals if any(a["status"] == "PREEMPTED" for a in f["attempts"])]
    assert len(preempted) == 1, finals
    said = preempted[0]["attempts"][0]["message"]
    assert "reclaimed by team nlp (its quota on openpai/default: 4 GPUs)" in said, said
