"""Every advanced OpenPAI job setting reaches the job, and its secrets never leak.

One experiment whose ``openpaiConfig`` uses every part of job protocol v2 that a user may
write (parameters, secrets, a private registry with its password, script and data
prerequisites, ports, retry counts, completion, container options, deployments, a virtual
cluster and the ``extras`` OpenPAI's plugins and schedulers read) runs one trial through
the whole stack against the OpenPAI emulator. The job the emulator stored must hold every
field as written, the task must see what OpenPAI renders and sets, and neither the secret
nor the registry password (nor the token) may show in an API answer, a service's log, an
event, a metric or the trial state on the bus.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.errors import NotFoundError

from contracts.experiment import ExperimentConfig
from services.adapters.openpai import jobs
from services.adapters.openpai.adapter import bundle
from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit
from tests.e2e.test_openpai import TRIAL
from tests.emulators.openpai import start_openpai
from tests.fixtures.openpai import openpai_config

pytestmark = pytest.mark.timeout(240)

SECRET = "apikey-5d1c9e7a"
REGISTRY_PASSWORD = "registry-pw-83f0b2"
PORTS = {"nccl": 2, "tb": 1}


@pytest.fixture
def pai(tmp_path: Path, share):
    """The emulator, with a virtual cluster ``research`` that alice may use (``pai_stack`` runs on this one)."""
    local, container = share
    emulator = start_openpai(tmp_path / "pai", mounts={str(container): str(local)}, vcs={"research": ["alice"]})
    yield emulator
    emulator.stop()


def job_config(container: Path) -> dict:
    """A job protocol v2 document with every setting a user may write."""
    seen = "settings-seen.txt"
    return {
        "protocolVersion": 2,
        "name": "every-setting",
        "type": "job",
        "version": "1.2",
        "contributor": "alice",
        "description": "every job protocol v2 setting at once",
        "jobRetryCount": 2,
        "parameters": {"greeting": "hello-from-parameters", "epochs": 3},
        "secrets": {"apikey": SECRET},
        "prerequisites": [
            {
                "name": "img",
                "type": "dockerimage",
                "uri": "registry.example.com/team/trainer:1",
                "auth": {"username": "robot", "password": REGISTRY_PASSWORD, "registryuri": "registry.example.com"},
            },
            {"name": "bench", "type": "script", "uri": "https://github.com/example/bench", "version": "84820935"},
            {"name": "cifar", "type": "data", "uri": ["https://data.example.com/cifar-10.tar.gz"]},
        ],
        "taskRoles": {
            "trainer": {
                "instances": 1,
                "completion": {"minFailedInstances": 1, "minSucceededInstances": 1},
                "taskRetryCount": 1,
                "prerequisites": ["bench", "cifar"],
                "dockerImage": "img",
                "script": "bench",
                "data": "cifar",
                "extraContainerOptions": {"shmMB": 256, "infiniband": False},
                "resourcePerInstance": {"gpu": 0, "cpu": 1, "memoryMB": 1024, "ports": PORTS},
                "commands": [
                    f"printf '%s\\n' '<% $parameters.greeting %>' '<% $secrets.apikey %>' '<% $script.uri %>' "
                    f"'<% $data.uri[0] %>' > {seen}",
                    "env | grep '^PAI_' | sort > settings-env.txt",
                    "python3 trial.py",
                ],
            },
        },
        "deployments": [
            {
                "name": "share",
                "taskRoles": {
                    "trainer": {
                        "preCommands": [f"echo epochs <% $parameters.epochs %> > {container}/deployment-pre.txt"]
                    }
                },
            }
        ],
        "defaults": {"virtualCluster": "research", "deployment": "share"},
        "extras": {
            "gangAllocation": False,
            "hivedScheduler": {"jobPriorityClass": "prod", "taskRoles": {"trainer": {"skuType": "DT", "skuNumber": 1}}},
            "jobStatusChangeNotification": {
                "running": True,
                "succeeded": True,
                "stopped": False,
                "failed": True,
                "retried": False,
            },
            "com.microsoft.pai.runtimeplugin": [
                {"plugin": "ssh", "parameters": {"jobssh": True, "sshbarrier": False}},
                {"plugin": "teamwise_storage", "parameters": {"storageConfigNames": ["confignfs"]}},
            ],
            "submitFrom": "settings-test",
        },
    }


def stored_config(pai, name: str) -> dict:
    """``GET /jobs/{user}~{name}/config``: the job as the cluster keeps it (secrets hidden by OpenPAI)."""
    reply = httpx.get(f"{pai.api}/jobs/alice~{name}/config", headers=pai.headers("alice"))
    assert reply.status_code == 200, reply.text
    return json.loads(reply.text)


async def bus_contents(url: str) -> dict[str, str]:
    """Every message JetStream holds (streams, KV buckets with their history, the object store), by stream."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    found: dict[str, str] = {}
    try:
        for info in await js.streams_info():
            parts = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1) if info.state.messages else ():
                try:
                    msg = await js.get_msg(info.config.name, seq)
                except NotFoundError:  # deleted (acked off a work queue, purged)
                    continue
                parts.append(f"{msg.subject} {msg.headers or {}} {(msg.data or b'').decode(errors='replace')}")
            found[info.config.name] = "\n".join(parts)
    finally:
        await nc.close()
    return found


def test_every_setting_reaches_the_job_and_secrets_never_leak(pai_stack, pai, share, tmp_path):
    local, container = share
    template = job_config(container)
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, openpaiConfig=template)
    token = config["trainingService"]["token"]

    experiment = create(pai_stack, config)
    trial_id = submit(pai_stack, experiment, {"x": 7})
    found = ended(pai_stack, trial_id, timeout=90)
    assert found["status"] == "SUCCEEDED", found
    assert found["finalMetric"] == {"default": 7, "role": "trainer"}, found

    # The cluster holds the job as written: only the name and each role's commands are Trialbus's.
    name = f"trialbus_{experiment}_{trial_id}"
    stored = stored_config(pai, name)
    commands = {role: spec.pop("commands") for role, spec in stored["taskRoles"].items()}
    expected = copy.deepcopy(template)
    written = {role: spec.pop("commands") for role, spec in expected["taskRoles"].items()}
    assert stored == {**expected, "name": name, "secrets": "******"}
    for role, lines in written.items():
        at = commands[role].index(lines[0])
        assert commands[role][at : at + len(lines)] == lines, "the user's commands are kept, templates and all"

    # ... and it is exactly the job trialbus render shows for this trial.
    service = ExperimentConfig.model_validate(config).training_service
    _, _, job = jobs.trial_job(service, experiment, trial_id, 0, config["trialCommand"], 0, bundle().hash)
    assert stored_config(pai, name) == {**job, "secrets": "******"}

    # OpenPAI acted on the settings: virtual cluster, ports, resources, completion.
    detail = pai.job("alice", name)
    assert detail["jobStatus"]["virtualCluster"] == "research"
    task = detail["taskRoles"]["trainer"]["taskStatuses"][0]
    assert {label: len(ports.split(",")) for label, ports in task["containerPorts"].items()} == {
        **PORTS,
        "ssh": 1,
        "http": 1,
    }

    # Inside the task: parameters, script and data rendered at submission, the secret at run time.
    code = next((local / "trialbus" / "code").iterdir())
    seen = (code / "settings-seen.txt").read_text().splitlines()
    assert seen == [
        "hello-from-parameters",
        SECRET,
        "https://github.com/example/bench",
        "https://data.example.com/cifar-10.tar.gz",
    ]
    env = dict(line.split("=", 1) for line in (code / "settings-env.txt").read_text().splitlines())
    assert env["PAI_VIRTUAL_CLUSTER"] == "research"
    assert env["PAI_RESOURCE_trainer"] == "0,1,1024,256", "gpu,cpu,memoryMB,shmMB"
    assert (env["PAI_MIN_FAILED_TASK_COUNT_trainer"], env["PAI_MIN_SUCCEEDED_TASK_COUNT_trainer"]) == ("1", "1")
    assert env["PAI_PORT_LIST_trainer_0_nccl"] == task["containerPorts"]["nccl"]
    assert len(env["PAI_PORT_LIST_trainer_0_nccl"].split(",")) == 2 and env["PAI_CONTAINER_HOST_tb_PORT_LIST"]
    assert (local / "deployment-pre.txt").read_text().strip() == "epochs 3", "the default deployment ran"

    # Secrets: masked in API answers, absent from every answer, log and message but where they must be.
    shown = pai_stack.rest("GET", f"/experiments/{experiment}").json()["config"]["trainingService"]
    assert shown["openpaiConfig"]["secrets"] == "******" and shown["token"] == "**********"
    assert shown["openpaiConfig"]["prerequisites"][0]["auth"] == {
        "username": "robot",
        "password": "******",
        "registryuri": "registry.example.com",
    }
    paths = [
        "/experiments",
        f"/experiments/{experiment}",
        f"/experiments/{experiment}/trials",
        f"/trials/{trial_id}",
        f"/trials/{trial_id}/metrics",
        f"/trials/{trial_id}/log",
        "/platforms",
    ]
    answers = {path: pai_stack.rest("GET", path) for path in paths}
    assert all(reply.status_code == 200 for reply in answers.values()), answers
    logs = {name: pai_stack.log(name) for name in ("dispatcher", "gateway", "openpai")}
    bus = asyncio.run(bus_contents(pai_stack.nats.url))
    for secret in (SECRET, REGISTRY_PASSWORD, token):
        assert not [path for path, reply in answers.items() if secret in reply.text]
        assert not [who for who, log in logs.items() if secret in log]
        holders = {stream for stream, text in bus.items() if secret in text}
        # The stored experiment keeps the platform's secrets sealed (contracts.sealing): an
        # adapter restarted on another host unseals them with its key to adopt its jobs.
        assert holders == set(), (secret, holders)
    assert experiment in bus["KV_experiments"] and f"{trial_id}:SUCCEEDED" in bus["EVENTS"], "the dump saw them"


def test_a_reporting_task_role_that_names_no_role_is_refused_at_creation(pai_stack, pai, share, tmp_path):
    template = job_config(share[1])
    template["taskRoles"]["evaluator"] = copy.deepcopy(template["taskRoles"]["trainer"])
    template["extras"]["hivedScheduler"]["taskRoles"]["evaluator"] = {"skuType": "DT", "skuNumber": 1}
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, openpaiConfig=template, reportingTaskRole="tester")

    reply = pai_stack.rest("POST", "/experiments", json=config)

    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert "reportingTaskRole 'tester' is not a task role of openpaiConfig (trainer, evaluator)" in error, error
    assert pai_stack.rest("GET", "/experiments").json() == [], "nothing was created"
    assert SECRET not in reply.text and REGISTRY_PASSWORD not in reply.text
    assert SECRET not in pai_stack.log("dispatcher") and REGISTRY_PASSWORD not in pai_stack.log("dispatcher")


@pytest.mark.parametrize("reuse", [False, True], ids=["job-per-trial", "reuse"])
def test_a_secret_used_in_a_command_is_not_left_on_the_share(pai_stack, pai, share, tmp_path, reuse):
    """The commands, once OpenPAI rendered the secrets in them, live in a private temporary file
    of the container (mktemp), not on the share."""
    local, container = share
    template = job_config(container)
    template["taskRoles"]["trainer"]["commands"] = ["test -n '<% $secrets.apikey %>'", "python3 trial.py"]
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, openpaiConfig=template, reuseMode=reuse)
    experiment = create(pai_stack, config)
    found = ended(pai_stack, submit(pai_stack, experiment, {"x": 1}), timeout=90)
    assert found["status"] == "SUCCEEDED", found

    files = [path for path in (local / "trialbus").rglob("*") if path.is_file()]
    assert [path for path in files if SECRET.encode() in path.read_bytes()] == [], "Trialbus's files hold the secret"
