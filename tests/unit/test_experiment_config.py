"""The experiment config accepts NNI v2 files and refuses bad ones with errors a person can act on."""

import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.experiment import ExperimentConfig, LocalConfig, format_validation_error, load_experiment_config
from contracts.units import parse_megabytes, parse_seconds

NNI_DETAILED = """
experimentName: MNIST
searchSpace:
  lr: {_type: choice, _value: [0.0001, 0.001]}
  momentum: {_type: uniform, _value: [0, 1]}
trialCommand: python3 mnist.py
trialCodeDirectory: .
trialGpuNumber: 1
trialConcurrency: 4
maxTrialNumber: 10
maxExperimentDuration: 1h
tuner:
  name: TPE
  classArgs: {optimize_mode: maximize}
trainingService:
  platform: local
  useActiveGpu: false
"""


def errors_of(data: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        ExperimentConfig.model_validate(data)
    return format_validation_error(caught.value)


def minimal(**extra) -> dict:
    return {
        "trialCommand": "python3 trial.py",
        "trialConcurrency": 1,
        "trainingService": {"platform": "local"},
        **extra,
    }


def test_nni_example_config_loads_with_paths_resolved_against_the_file(tmp_path: Path) -> None:
    path = tmp_path / "exp" / "config.yml"
    path.parent.mkdir()
    path.write_text(NNI_DETAILED)
    config = load_experiment_config(path)
    assert config.trial_code_directory == str(path.parent.resolve())
    assert config.max_experiment_duration == 3600
    assert config.gpus_per_trial == 1
    assert isinstance(config.training_service, LocalConfig)
    assert config.training_service.use_active_gpu is False
    assert config.adapter == "local-gpu"
    assert config.public_json()["tuner"] == {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}


def test_keys_match_ignoring_case_and_underscores() -> None:
    config = ExperimentConfig.model_validate(
        {"trial_command": "x", "TRIALCONCURRENCY": 2, "max_trial_number": 3, "training_service": {"PLATFORM": "local"}}
    )
    assert (config.trial_concurrency, config.max_trial_number) == (2, 3)


def test_unknown_keys_are_named() -> None:
    assert "does not have field(s) colour, flavour" in errors_of(minimal(flavour=1, colour=2))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"trialConcurrency": -1}, "trialConcurrency: Input should be greater than 0"),
        ({"trainingService": {"platform": "k8s"}}, "unknown platform 'k8s'; available: local"),
        (
            {"trainingService": {"platform": "frameworkcontroller", "storage": {"storageType": "pvc"}}},
            "storage.storageType must be nfs or azureStorage, not 'pvc'",
        ),
        (
            {"trainingService": [{"platform": "local"}, {"platform": "aml"}]},
            "trainingService lists platform(s) aml that Trialbus does not have; a hybrid list may hold local, remote",
        ),
        ({"trainingService": [{"platform": "local"}, {"platform": "local"}]}, "lists platform local more than once"),
        ({"trainingService": []}, "trainingService is an empty list"),
        (
            {"trainingService": [{"platform": "local"}, {"platform": "remote"}]},
            "trainingService item 1 (remote): machineList: Field required",
        ),
        (
            {"trainingService": [{"platform": "local", "trialCodeDirectory": "/elsewhere"}]},
            "trialCodeDirectory differs from trialCodeDirectory",
        ),
        ({"trainingService": {"platform": "kubeflow"}}, "platform 'kubeflow' is not available in Trialbus"),
        ({"maxTrialDuration": "3 years"}, "bad duration '3 years'"),
        ({"trialGpuNumber": 1}, "useActiveGpu must be set when trialGpuNumber > 0"),
        ({"trainingService": {"platform": "local", "maxTrialNumberPerGpu": 2}}, "maxTrialNumberPerGpu only applies"),
        ({"trainingService": {"platform": "local", "gpuIndices": "0,0"}}, "contains duplicates"),
        ({"trainingService": {"platform": "local", "gpuIndices": -1}}, "negative index"),
    ],
)
def test_invalid_configs_are_refused_with_a_reason(change: dict, expected: str) -> None:
    assert expected in errors_of(minimal(**change))


def test_gpu_indices_accept_nni_forms() -> None:
    for given, canonical in [(1, [1]), ("0,2", [0, 2]), ([3, 1], [3, 1])]:
        config = ExperimentConfig.model_validate(minimal(trainingService={"platform": "local", "gpuIndices": given}))
        assert config.training_service.gpu_indices == canonical


def test_missing_file_and_bad_yaml_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read experiment config"):
        load_experiment_config(tmp_path / "nope.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text(textwrap.dedent("a: [1, 2"))
    with pytest.raises(ValueError, match="not valid YAML"):
        load_experiment_config(bad)


def test_units_follow_nni() -> None:
    assert parse_seconds("1.5h") == 5400
    assert parse_seconds("30m") == 1800
    assert parse_seconds(12) == 12
    assert parse_megabytes("8GB") == 8192
    assert parse_megabytes("1.5kb") == 1  # rounded up to whole MiB
    with pytest.raises(ValueError, match="unit"):
        parse_megabytes("8 apples")


# -- platform: remote ------------------------------------------------------------------------


def remote(*machines: dict, **extra) -> dict:
    return minimal(trainingService={"platform": "remote", "machineList": list(machines)}, **extra)


def test_remote_machines_take_nni_names_and_defaults():
    config = ExperimentConfig.model_validate(
        remote(
            {"host": "gpu1", "user": "alice", "ssh_key_file": "~/.ssh/id_ed25519", "gpuIndices": "0,1"},
            {"HOST": "gpu2", "port": 2222, "user": "bob", "password": "pw", "sshKeyFile": "/ignored"},
        )
    )
    first, second = config.training_service.machine_list
    assert (first.port, first.gpu_indices, first.max_trial_number_per_gpu) == (22, [0, 1], 1)
    assert first.use_active_gpu is False
    assert second.address == "bob@gpu2:2222"
    assert second.ssh_key_file is None, "with a password, NNI drops sshKeyFile"


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ({"host": "h", "user": "u", "port": 0}, "port: Input should be greater than 0"),
        ({"host": "h", "user": "u", "port": 65536}, "port: Input should be less than 65536"),
        ({"host": "h", "user": "u", "password": 12345}, "password: must be a string: quote it in YAML"),
        ({"host": "h"}, "user: Field required"),
        ({"host": "h", "user": "u", "gpuIndices": [0, 0]}, "duplicates"),
        ({"host": "h", "user": "u", "sshKeyPath": "x"}, "does not have field(s) sshKeyPath"),
    ],
)
def test_bad_remote_machines_are_refused_with_a_reason(machine, expected):
    assert expected in errors_of(remote(machine))


def test_remote_needs_machines_and_trial_gpus_for_sharing():
    assert "machineList: List should have at least 1 item" in errors_of(remote())
    shared = {"host": "h", "user": "u", "maxTrialNumberPerGpu": 2}
    assert "maxTrialNumberPerGpu only applies when trialGpuNumber is set" in errors_of(remote(shared))
    assert ExperimentConfig.model_validate(remote(shared, trialGpuNumber=1))


def with_sync(sync) -> dict:
    config = remote({"host": "h", "user": "u"})
    config["trainingService"]["checkpointSync"] = sync
    return config


def test_remote_checkpoint_sync_is_on_by_default_and_takes_nni_units():
    default = ExperimentConfig.model_validate(remote({"host": "h", "user": "u"})).training_service
    assert (default.checkpoints.max_size, default.checkpoints.interval) == (1024, None)  # MiB; the adapter's interval
    assert "checkpointSync" not in default.model_dump(by_alias=True, exclude_none=True), "no key, no change in dumps"
    given = ExperimentConfig.model_validate(with_sync({"max_size": "512mb", "INTERVAL": "2m"})).training_service
    assert (given.checkpoints.max_size, given.checkpoints.interval) == (512, 120.0)
    assert ExperimentConfig.model_validate(with_sync(True)).training_service.checkpoints.max_size == 1024
    off = ExperimentConfig.model_validate(with_sync(False))
    assert off.training_service.checkpoints is None
    # off stays off on the bus (None fields are left out there), and as the API shows it
    again = ExperimentConfig.model_validate(off.wire_json())
    assert again.training_service.checkpoints is None and off.public_json()["trainingService"]["checkpointSync"] == {
        "enabled": False,
        "maxSize": 1024,
    }


@pytest.mark.parametrize(
    ("sync", "expected"),
    [
        ({"maxSize": "1 apple"}, "checkpointSync.maxSize: bad size '1 apple'"),
        ({"maxSize": 0}, "checkpointSync.maxSize: Input should be greater than 0"),
        ({"interval": "0.5s"}, "checkpointSync.interval: Input should be greater than or equal to 1"),
        ({"interval": "soon"}, "checkpointSync.interval: bad duration 'soon'"),
        ({"maxBytes": 1}, "CheckpointSyncConfig does not have field(s) maxBytes"),
    ],
)
def test_bad_checkpoint_sync_is_refused_with_a_reason(sync, expected):
    assert expected in errors_of(with_sync(sync))


def test_secrets_are_masked_everywhere_and_sealed_on_the_bus():
    from contracts import ExperimentState, sealing
    from contracts.base import utcnow

    config = ExperimentConfig.model_validate(remote({"host": "h", "user": "u", "password": "hunter2"}))
    assert "hunter2" not in repr(config) and "hunter2" not in str(config.public_json())
    assert config.public_json()["trainingService"]["machineList"][0]["password"] == "**********"
    assert config.wire_json()["trainingService"]["machineList"][0]["password"] == "hunter2", "a user's request"
    state = ExperimentState(id="e1", config=config, start_time=utcnow())
    sealing.install(sealing.generate_key())
    try:
        assert b"hunter2" not in state.encode()
        stored = ExperimentState.decode(state.encode()).config.training_service.machine_list[0]
    finally:
        sealing.install(None)
    assert stored.password.get_secret_value() == "hunter2", "the dispatcher keeps what adapters need"
    assert "hunter2" not in str(state.view({}))


def test_key_files_are_read_where_the_config_is_loaded(tmp_path: Path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n")
    text = textwrap.dedent(
        """
        trialCommand: python3 trial.py
        trialConcurrency: 1
        trainingService:
          platform: remote
          machineList:
            - {host: h, user: u, sshKeyFile: keys/id}
        """
    )
    (tmp_path / "config.yml").write_text(text)
    machine = load_experiment_config(tmp_path / "config.yml").training_service.machine_list[0]
    assert machine.ssh_key_file == str(tmp_path / "keys" / "id")
    assert machine.ssh_key.get_secret_value().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    (tmp_path / "config.yml").write_text(text.replace("keys/id", "keys/missing"))
    with pytest.raises(ValueError, match=r"machineList.0.sshKeyFile: cannot read .*keys/missing \(No such file"):
        load_experiment_config(tmp_path / "config.yml")


NNI_HYBRID = """
searchSpaceFile: search_space.json
trialCommand: python3 mnist.py
trialGpuNumber: 0
trialConcurrency: 5
maxTrialNumber: 20
tuner:
  name: TPE
  classArgs:
    optimize_mode: maximize
# For local, remote, openpai, and aml, NNI can use multiple training services at one time
trainingService:
  - platform: local
  - platform: remote
    trialCommand: python3 mnist.py --remote
    trialGpuNumber: 1
    machineList:
      - host: 10.1.1.1
        user: alice
        ssh_key_file: id_rsa
"""


def test_nni_hybrid_config_loads_each_platform_with_its_own_settings(tmp_path: Path) -> None:
    """NNI's hybrid example (its aml entry left out): each platform's section, key files read, and
    NNI's rule that a platform's own trialCommand and trialGpuNumber win over the top-level ones."""
    from contracts import sealing
    from contracts.messages import TrialRequest
    from contracts.state import ExperimentState, TrialState
    from services.dispatcher.requests import trial_request

    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "uniform", "_value": [0, 1]}}')
    (tmp_path / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (tmp_path / "config.yml").write_text(NNI_HYBRID)
    config = load_experiment_config(tmp_path / "config.yml")
    assert config.hybrid and config.platform == "local+remote" and config.adapters == ["local-gpu", "remote"]
    local, remote = config.training_services
    assert remote.machine_list[0].ssh_key.get_secret_value().startswith("-----BEGIN")  # read where loaded
    assert (config.command_for(local), config.gpus_for(local)) == ("python3 mnist.py", 0)
    assert (config.command_for(remote), config.gpus_for(remote)) == ("python3 mnist.py --remote", 1)
    assert config.service_for("remote") is remote and config.service_for("openpai") is None
    # What an adapter receives is its own platform's section, with its command and GPUs.
    state = ExperimentState(id="e", config=config, code_ref=None, start_time="2026-01-01T00:00:00Z")
    trial = TrialState(id="t", experiment_id="e", sequence_id=0, platform="remote", submit_time=state.start_time)
    sealing.install(sealing.generate_key())  # the bus carries the SSH key sealed
    try:
        request = TrialRequest.decode(trial_request(state, trial, "secret").encode())
    finally:
        sealing.install(None)
    assert request.training_service.platform == "remote" and request.trial_command == "python3 mnist.py --remote"
    assert request.trial_gpu_number == 1
    # Round trip as the API shows it: a list, secrets masked.
    shown = config.public_json()["trainingService"]
    assert [s["platform"] for s in shown] == ["local", "remote"] and "BEGIN" not in str(shown)
    assert ExperimentConfig.model_validate(config.wire_json()).training_services == config.training_services


def test_nni_hybrid_example_with_aml_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text(NNI_HYBRID + "  - platform: aml\n    dockerImage: msranni/nni\n")
    with pytest.raises(ValueError, match="trainingService lists platform.s. aml that Trialbus does not have"):
        load_experiment_config(tmp_path / "config.yml")
