"""``trialbus render -f config.yml``: the OpenPAI job of a trial, offline, with its secrets masked."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from contracts.experiment import load_experiment_config
from services.adapters.openpai import jobs
from services.adapters.openpai.adapter import bundle as adapter_bundle
from tests.emulators.openpai.protocol import schema_errors
from tests.emulators.openpai.render import semantic_error
from trialbus.cli import app

SECRET, REGISTRY_PASSWORD, TOKEN = "s3cret-api-key-7f1d", "registry-pass-92ab", "pai-token-0c4e"
JOB = {
    "protocolVersion": 2,
    "name": "my-job",
    "type": "job",
    "jobRetryCount": 1,
    "parameters": {"lr": 0.01},
    "secrets": {"apikey": SECRET},
    "prerequisites": [
        {
            "name": "img",
            "type": "dockerimage",
            "uri": "registry.example.com/team/train:1",
            "auth": {"username": "robot", "password": REGISTRY_PASSWORD, "registryuri": "registry.example.com"},
        }
    ],
    "taskRoles": {
        "worker": {
            "instances": 2,
            "dockerImage": "img",
            "resourcePerInstance": {"gpu": 1, "cpu": 4, "memoryMB": 8192, "ports": {"nccl": 1}},
            "commands": ["python3 train.py --lr <% $parameters.lr %> --key <% $secrets.apikey %>"],
        }
    },
    "extras": {"gangAllocation": False},
}


@cache
def published_schema() -> jsonschema.Draft7Validator:
    """The rest-server's job protocol as published (a copy of ``specs/openpai/rest-server-protocol.schema.json``)."""
    path = Path(__file__).parents[1] / "emulators" / "openpai" / "rest-server-protocol.schema.json"
    return jsonschema.Draft7Validator(json.loads(path.read_text()))


def protocol_errors(job: dict) -> list[str]:
    """Empty when ``job`` passes both the published schema and the emulator's (the server's) checks."""
    found = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in published_schema().iter_errors(job)]
    return found + [str(e) for e in schema_errors(job)] + [str(e) for e in [semantic_error(job)] if e is not None]


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner(env={"TRIALBUS_NATS_URL": None, "TRIALBUS_DATA_DIR": None, "COLUMNS": "200"})


def write_config(folder: Path, name: str = "config.yml", **service) -> Path:
    """An openpai experiment config in ``folder``; ``service`` adds to or replaces its trainingService."""
    config = {
        "trialCommand": "python3 trial.py --epochs 3",
        "trialConcurrency": 2,
        "trialGpuNumber": 1,
        "trainingService": {
            "platform": "openpai",
            "host": "pai.example.com",
            "username": "alice",
            "token": TOKEN,
            "trialCpuNumber": 2,
            "trialMemorySize": "4gb",
            "storageConfigName": "confignfs",
            "localStorageMountPoint": "/mnt/local",
            "containerStorageMountPoint": "/mnt/share",
            **service,
        },
    }
    path = folder / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))  # the order written: the first task role reports
    return path


def rendered(cli: CliRunner, config: Path) -> tuple[str, dict]:
    result = cli.invoke(app, ["render", "-f", str(config)])
    assert result.exit_code == 0, result.output
    return result.stdout, yaml.safe_load(result.stdout)


def test_the_user_s_job_file_is_rendered_as_submitted_with_its_secrets_masked(cli: CliRunner, tmp_path: Path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.yml").write_text(yaml.safe_dump(JOB))
    config = write_config(tmp_path, openpaiConfigFile="jobs/train.yml")  # relative to the config's folder

    text, job = rendered(cli, config)

    assert text.startswith("# ") and "EXPERIMENT" in text.splitlines()[0], "the placeholder ids are said first"
    assert re.fullmatch(r"trialbus_EXPERIMENT_TRIAL", job["name"])
    assert job["secrets"] == {"apikey": "******"}, "each secret masked in its place: the job keeps its shape"
    assert job["prerequisites"][0]["auth"]["password"] == "******"
    assert protocol_errors(job) == [], "what is printed is a job the server accepts"
    for secret in (SECRET, REGISTRY_PASSWORD, TOKEN):
        assert secret not in text
    assert (job["parameters"], job["jobRetryCount"], job["extras"]) == (JOB["parameters"], 1, JOB["extras"])
    worker = job["taskRoles"]["worker"]
    assert worker["resourcePerInstance"] == JOB["taskRoles"]["worker"]["resourcePerInstance"]
    commands = worker["commands"]
    # the role's commands kept, templates too, after the line that gives them their grace period at a stop
    assert commands[1:4] == ["trap 'exit 143' TERM", JOB["taskRoles"]["worker"]["commands"][0], "TRIALBUS_COMMAND"]
    assert commands[0].startswith("T=/mnt/share/trialbus/trials/EXPERIMENT/TRIAL-0/")
    bundle = adapter_bundle().hash  # the adapter's: where it installs the keeper on the share
    assert re.fullmatch(r"[0-9a-f]{16}", bundle)
    assert f"python3 -S -I /mnt/share/trialbus/bin/{bundle}/trial_keeper.py --env" in commands[-1]
    assert "report.env" in commands[-1], "the only task role reports"

    clear = {**job, "secrets": JOB["secrets"], "prerequisites": JOB["prerequisites"]}
    assert protocol_errors(clear) == [], "the rest-server's checks accept it"
    service = load_experiment_config(config).training_service
    assert clear == jobs.trial_job(service, "EXPERIMENT", "TRIAL", 0, "python3 trial.py --epochs 3", 1, bundle)[2], (
        "only the secrets differ from what the adapter submits"
    )


def test_without_openpai_config_nni_s_job_wraps_the_trial_command(cli: CliRunner, tmp_path: Path):
    text, job = rendered(cli, write_config(tmp_path, virtualCluster="gpu"))
    role = job["taskRoles"]["taskrole"]
    assert role["commands"][1:3] == ["trap 'exit 143' TERM", "python3 trial.py --epochs 3"]
    assert role["resourcePerInstance"] == {"gpu": 1, "cpu": 2, "memoryMB": 4096}
    assert job["defaults"] == {"virtualCluster": "gpu"} and job["extras"]["storages"] == [{"name": "confignfs"}]
    assert protocol_errors(job) == []
    assert TOKEN not in text, "the token is never part of a job"


def test_with_several_task_roles_the_first_one_reports(cli: CliRunner, tmp_path: Path):
    role = JOB["taskRoles"]["worker"]
    two_roles = {**JOB, "taskRoles": {"worker": role, "ps": role}}  # one mapping: the file says ps: *id001
    for service, reporter in (({}, "worker"), ({"reportingTaskRole": "ps"}, "ps")):
        _, job = rendered(cli, write_config(tmp_path, openpaiConfig=two_roles, **service))
        assert [role for role, spec in job["taskRoles"].items() if "report.env" in spec["commands"][-1]] == [reporter]


def test_an_invalid_config_prints_the_validation_error(cli: CliRunner, tmp_path: Path):
    two_roles = {**JOB, "taskRoles": {"b": JOB["taskRoles"]["worker"], "a": JOB["taskRoles"]["worker"]}}
    (tmp_path / "two.yml").write_text(yaml.safe_dump(two_roles, sort_keys=False))
    no_role = "reportingTaskRole 'c' is not a task role of openpaiConfig (b, a)"
    cases = {
        "memory.yml": ({"trialMemorySize": "8 furlongs"}, "bad size '8 furlongs'"),
        "roles.yml": ({"openpaiConfig": two_roles, "reportingTaskRole": "c"}, no_role),
        "roles-file.yml": ({"openpaiConfigFile": "two.yml", "reportingTaskRole": "c"}, no_role),
        "file.yml": ({"openpaiConfigFile": "nope.yml"}, "cannot read trainingService.openpaiConfigFile"),
    }
    for name, (service, complaint) in cases.items():
        config = write_config(tmp_path, name, **service)
        result = cli.invoke(app, ["render", "-f", str(config)])
        assert result.exit_code == 1, (name, result.output)
        assert result.output.startswith("error: ") and complaint in result.output, (name, result.output)
        assert "Traceback" not in result.output and result.stdout == "", name


@pytest.mark.parametrize(
    ("service", "how"),
    [
        ({"platform": "local"}, "runs trials as processes"),
        (
            {"platform": "remote", "machineList": [{"host": "gpu1", "user": "alice", "password": "pw"}]},
            "runs trials as processes on SSH machines",
        ),
    ],
)
def test_a_platform_that_submits_no_job_is_refused(cli: CliRunner, tmp_path: Path, service: dict, how: str):
    config = tmp_path / "config.yml"
    config.write_text(
        yaml.safe_dump({"trialCommand": "python3 trial.py", "trialConcurrency": 1, "trainingService": service})
    )
    result = cli.invoke(app, ["render", "-f", str(config)])
    assert result.exit_code == 2
    expected = (
        f"error: trialbus render shows the job of platforms that submit jobs (openpai, frameworkcontroller); "
        f"platform {service['platform']!r} {how}"
    )
    assert result.output.strip() == expected


def test_reuse_mode_shows_the_environment_job(cli: CliRunner, tmp_path: Path):
    text, job = rendered(cli, write_config(tmp_path, reuseMode=True))
    assert text.startswith("# reuseMode: the OpenPAI job of environment ENV")
    assert job["name"] == "trialbus_EXPERIMENT_env_ENV"
    commands = job["taskRoles"]["taskrole"]["commands"]
    assert commands[1] == "python3 trial.py --epochs 3", "the trial command, run for each trial"
    runner = f"python3 -S -I /mnt/share/trialbus/bin/{adapter_bundle().hash}/openpai_runner.py"
    assert commands[-1].startswith(f"{runner} --env /mnt/share/trialbus/envs/EXPERIMENT/ENV --poll 0.1 --orphan 600")
    assert commands[-1].endswith("--reports")
    assert schema_errors(job) == [] and semantic_error(job) is None


def test_the_virtual_cluster_goes_into_the_user_s_job_unless_it_names_its_own(cli: CliRunner, tmp_path: Path):
    text, job = rendered(cli, write_config(tmp_path, virtualCluster="gpu", openpaiConfig=JOB))
    assert job["defaults"] == {"virtualCluster": "gpu"}, "trainingService.virtualCluster, openpaiConfig or not"
    assert job["secrets"] == {"apikey": "******"} and SECRET not in text
    assert protocol_errors(job) == []

    own = {
        **JOB,
        "defaults": {"virtualCluster": "research", "deployment": "share"},
        "deployments": [{"name": "share", "taskRoles": {"worker": {"preCommands": ["echo ready"]}}}],
    }
    _, job = rendered(cli, write_config(tmp_path, virtualCluster="gpu", openpaiConfig=own))
    assert job["defaults"] == {"virtualCluster": "research", "deployment": "share"}, "the job's own is kept"
    assert protocol_errors(job) == []

    _, job = rendered(cli, write_config(tmp_path, openpaiConfig=JOB))  # none named: the cluster's default
    assert "defaults" not in job


def test_the_masked_shape_is_what_the_schema_checks(cli: CliRunner, tmp_path: Path):
    """The check above can fail: the server's schema refuses ``secrets`` masked as one string."""
    _, job = rendered(cli, write_config(tmp_path, openpaiConfig=JOB))
    assert protocol_errors(job) == []
    assert any(error.startswith("secrets: ") for error in protocol_errors({**job, "secrets": "******"}))
