"""Platform secrets on the bus: sealed with TRIALBUS_SECRETS_KEY, readable only with it, never in clear."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from contracts import ExperimentConfig, ExperimentState, TrialRequest, sealing
from contracts.base import utcnow
from contracts.experiment import secret_paths

PASSWORD = "ssh-password-3f9e"
TOKEN = "pai-token-71c2"
JOB_SECRET = "registry-secret-55aa"


@pytest.fixture(autouse=True)
def no_key():
    """Every test starts, and leaves the process, without a key (as clients, the web UI and the tuner)."""
    sealing.install(None)
    yield
    sealing.install(None)


def remote(**machine: Any) -> dict[str, Any]:
    service = {"platform": "remote", "machineList": [{"host": "h", "user": "u", **machine}]}
    return {"trialCommand": "python3 trial.py", "trialConcurrency": 1, "trainingService": service}


def openpai(**service: Any) -> dict[str, Any]:
    return {
        "trialCommand": "python3 trial.py",
        "trialConcurrency": 1,
        "trialGpuNumber": 0,
        "trainingService": {
            "platform": "openpai",
            "host": "pai.example.com",
            "username": "alice",
            "token": TOKEN,
            "trialCpuNumber": 1,
            "trialMemorySize": "1gb",
            "storageConfigName": "nfs",
            "localStorageMountPoint": "/mnt/l",
            "containerStorageMountPoint": "/mnt/c",
            **service,
        },
    }


def state(config: dict[str, Any]) -> ExperimentState:
    return ExperimentState(id="e1", config=ExperimentConfig.model_validate(config), start_time=utcnow())


def request(config: dict[str, Any] | None = None, token: str = "trial-token-0d1e") -> TrialRequest:
    config = ExperimentConfig.model_validate(config or remote(password=PASSWORD))
    return TrialRequest(
        experiment_id="e1",
        trial_id="T1",
        sequence_id=0,
        trial_command="python3 trial.py",
        parameter_record="{}",
        training_service=config.training_service,
        token=token,
    )


def test_a_secret_round_trips_sealed():
    sealing.install(sealing.generate_key())
    sealed = sealing.seal(PASSWORD)
    assert sealed.startswith("sealed:v1:") and PASSWORD not in sealed
    assert sealed != sealing.seal(PASSWORD), "each sealing is fresh (nothing to compare across messages)"
    assert sealing.unseal(sealed) == PASSWORD


def test_what_the_dispatcher_stores_is_sealed_and_reads_back_in_clear():
    sealing.install(sealing.generate_key())
    stored = state(remote(password=PASSWORD)).encode()
    assert PASSWORD.encode() not in stored
    assert json.loads(stored)["config"]["trainingService"]["machineList"][0]["password"].startswith("sealed:v1:")
    machine = ExperimentState.decode(stored).config.training_service.machine_list[0]
    assert machine.password.get_secret_value() == PASSWORD


def test_a_rotation_reads_old_values_and_seals_new_ones_with_the_new_key():
    old, new = sealing.generate_key(), sealing.generate_key()
    sealing.install(old)
    before = state(remote(password=PASSWORD)).encode()
    sealing.install(f"{new},{old}")  # the rotation: the new key first, the old one still read
    read = ExperimentState.decode(before)
    assert read.config.training_service.machine_list[0].password.get_secret_value() == PASSWORD
    after = read.encode()  # the dispatcher writes the state again: sealed with the new key
    sealing.install(new)  # the old key dropped
    assert ExperimentState.decode(after).config.training_service.machine_list[0].password.get_secret_value() == PASSWORD
    with pytest.raises(sealing.SealingError, match="sealed with a key this service's TRIALBUS_SECRETS_KEY"):
        sealing.unseal(json.loads(before)["config"]["trainingService"]["machineList"][0]["password"])


def test_a_wrong_key_is_a_clear_error_that_shows_no_secret():
    sealing.install(sealing.generate_key())
    stored = state(remote(password=PASSWORD)).encode()
    wrong = sealing.generate_key()
    sealing.install(wrong)
    with pytest.raises(sealing.SealingError) as caught:
        sealing.unseal(json.loads(stored)["config"]["trainingService"]["machineList"][0]["password"])
    message = str(caught.value)
    assert "TRIALBUS_SECRETS_KEY" in message and "the dispatcher's key" in message
    assert PASSWORD not in message and wrong not in message
    machine = ExperimentState.decode(stored).config.training_service.machine_list[0]
    assert sealing.is_sealed(machine.password), "a reader with another key keeps it sealed, and does not crash"
    why = sealing.unreadable(machine)
    assert why is not None and why.startswith("password cannot be unsealed: it was sealed with a key")


def test_without_a_key_nothing_is_sealed_and_nothing_is_written_in_clear():
    with pytest.raises(sealing.SealingError, match="has no TRIALBUS_SECRETS_KEY: platform secrets cannot be written"):
        sealing.seal(PASSWORD)
    with pytest.raises(PydanticSerializationError, match="set the same key on the dispatcher and the adapters"):
        state(remote(password=PASSWORD)).encode()
    assert b"sealed:v1:" not in state(remote()).encode(), "an experiment without secrets needs no key"


def test_a_process_without_the_key_passes_sealed_values_through_unchanged():
    key = sealing.generate_key()
    sealing.install(key)  # the dispatcher
    stored = state(openpai(openpaiConfig={"secrets": {"registry": JOB_SECRET}})).encode()
    sealing.install(None)  # the web UI, the tuner, a client
    read = ExperimentState.decode(stored)
    assert sealing.is_sealed(read.config.training_service.token)
    shown = json.dumps(read.view({})) + repr(read) + str(read)
    assert TOKEN not in shown and JOB_SECRET not in shown and "sealed:v1:" not in shown
    written = read.encode()  # what it would write back: the same ciphertext, never clear text
    assert json.loads(written)["config"] == json.loads(stored)["config"]
    sealing.install(key)  # an adapter
    service = ExperimentState.decode(written).config.training_service
    assert service.token.get_secret_value() == TOKEN
    assert service.openpai_config["secrets"] == {"registry": JOB_SECRET}


def test_an_adapter_without_the_key_says_which_key_to_set():
    sealing.install(sealing.generate_key())
    raw = request().encode()
    sealing.install(None)
    why = sealing.unreadable(TrialRequest.decode(raw))
    assert why == (
        "trainingService.machineList.0.password cannot be unsealed: this service has no "
        "TRIALBUS_SECRETS_KEY; set it to the dispatcher's key"
    )


def test_repr_logs_and_api_answers_never_show_a_secret():
    sealing.install(sealing.generate_key())
    image = {"name": "img", "type": "dockerimage", "uri": "x", "auth": {"username": "u", "password": JOB_SECRET}}
    config = openpai(openpaiConfig={"secrets": {"registry": JOB_SECRET}, "prerequisites": [image]})
    for model in (state(config), state(remote(password=PASSWORD, sshPassphrase=PASSWORD)), request()):
        shown = [repr(model), str(model), model.model_dump_json(), json.dumps(model.to_json())]
        if isinstance(model, ExperimentState):
            shown.append(json.dumps(model.view({})))
        for text in shown:
            assert PASSWORD not in text and TOKEN not in text and JOB_SECRET not in text and "trial-token" not in text
        raw = model.encode()
        assert PASSWORD.encode() not in raw and TOKEN.encode() not in raw and JOB_SECRET.encode() not in raw
        assert b"trial-token" not in raw
        assert type(model).decode(raw) == model, "the key holder reads back exactly what was written"


def test_the_trial_token_is_sealed_with_a_key_and_in_clear_only_without_one():
    assert json.loads(request(remote()).encode())["token"] == "trial-token-0d1e", "no key: the metrics token only"
    sealing.install(sealing.generate_key())
    raw = request().encode()
    assert json.loads(raw)["token"].startswith("sealed:v1:")
    assert TrialRequest.decode(raw).token.get_secret_value() == "trial-token-0d1e"


@pytest.mark.parametrize(
    "config",
    [
        remote(password="sealed:v1:gAAAAA"),
        openpai(token="sealed:v1:gAAAAA"),
        openpai(openpaiConfig={"secrets": "sealed:v1:gAAAAA"}),
    ],
    ids=["ssh-password", "openpai-token", "openpai-job-secrets"],
)
def test_a_user_cannot_hand_in_a_sealed_value(config):
    """A copy of someone's sealed token from the bus, given back as one's own with a host of
    one's choosing, would make the adapter decrypt it and send it there: refused."""
    sealing.install(sealing.generate_key())  # even where the key is
    with pytest.raises(ValidationError, match="is accepted only from the bus, not from users"):
        ExperimentConfig.model_validate(config)


def test_the_dispatcher_knows_which_configs_hold_secrets():
    assert secret_paths(ExperimentConfig.model_validate(remote())) == []
    assert secret_paths(ExperimentConfig.model_validate(remote(password=PASSWORD))) == [
        "trainingService.machineList.0.password"
    ]
    held = secret_paths(ExperimentConfig.model_validate(openpai(openpaiConfig={"secrets": {"a": "b"}})))
    assert held == ["trainingService.token", "trainingService.openpaiConfig.secrets"]


def test_a_bad_key_is_refused_at_start_without_echoing_it():
    good = sealing.generate_key()
    with pytest.raises(sealing.SealingError, match="key 2 of 2 is neither a Fernet key") as caught:
        sealing.install(f"{good}, not-a-key")
    assert good not in str(caught.value) and "not-a-key" not in str(caught.value)
    assert sealing.install(f" {good} ,") == 1 and sealing.installed()
    assert sealing.install("") == 0 and not sealing.installed()


def test_a_long_random_string_is_a_key_too_as_for_every_other_secret():
    hexed = "9f" * 32  # `openssl rand -hex 32`, as .env.example and k8s/ make every secret
    assert sealing.install(hexed) == 1
    sealed = sealing.seal("hunter2")
    assert sealing.install(f"{sealing.generate_key()},{hexed}") == 2, "rotation mixes both kinds"
    assert sealing.unseal(sealed) == "hunter2"
    sealing.install("ab" * 32)
    with pytest.raises(sealing.SealingError, match="sealed with a key"):
        sealing.unseal(sealed)
    sealing.install(None)
