"""compose.yaml and the Dockerfile, checked where no Docker engine runs: the file against the
Compose Specification's schema, what users rely on in it (healthchecks, required secrets,
scalable adapters, the sandbox profile), the Dockerfile with hadolint, and the services it
defines started as local processes exactly as ``make up`` starts them, each reporting in."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest
import yaml
from rich.console import Console

from tests.e2e.helpers import wait_until
from tests.fixtures.nats import free_port
from trialbus import local
from trialbus.stack import LOCAL, SERVICES, Stack, StackOptions, compose_services
from trialbus.stack.compose import SECRETS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES_OF_COMPOSE = COMPOSE["services"]
OURS = {name: spec for name, spec in SERVICES_OF_COMPOSE.items() if name != "nats" and not spec.get("profiles")}
ADAPTERS = ("local-gpu", "remote", "openpai", "frameworkcontroller")


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"{name} is a test dependency (pip install -e '.[test]')"
    return found


def test_compose_yaml_follows_the_compose_specification():
    command = [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose.yaml")]
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_service_waits_for_a_healthy_nats_and_has_a_healthcheck():
    assert "healthcheck" in SERVICES_OF_COMPOSE["nats"]
    for name, spec in SERVICES_OF_COMPOSE.items():
        if name == "nats":
            continue
        assert spec["depends_on"] == {"nats": {"condition": "service_healthy"}}, name
        assert spec["healthcheck"]["test"][0] == "CMD", name


def test_adapters_scale_no_fixed_names_or_host_ports_and_their_own_nats_user():
    for name in ADAPTERS:
        spec = SERVICES_OF_COMPOSE[name]
        assert "container_name" not in spec and "ports" not in spec, f"{name} could not be scaled"
        assert spec["environment"]["TRIALBUS_NATS_USER"] == name
        assert "TRIALBUS_REPLICA" not in spec["environment"], "each replica is named after its container"


def test_required_secrets_fail_with_a_message_and_env_example_documents_every_variable():
    text = (ROOT / "compose.yaml").read_text()
    variables = set(re.findall(r"\$\{(\w+)", text))
    documented = set(re.findall(r"^#?\s*(\w+)=", (ROOT / ".env.example").read_text(), re.MULTILINE))
    assert variables <= documented, variables - documented
    for secret in ("TRIALBUS_TRIAL_SECRET", "NATS_PASSWORD_DISPATCHER", "NATS_PASSWORD_CLIENT"):
        assert re.search(rf"\$\{{{secret}:\?[^}}]+\}}", text), f"{secret} must be required with a message"
    # The API token and the secrets key: required wherever they are used, never empty by default
    for name, keys in {
        "dispatcher": ("TRIALBUS_API_TOKEN", "TRIALBUS_SECRETS_KEY"),
        "webui": ("TRIALBUS_API_TOKEN",),
        **{adapter: ("TRIALBUS_SECRETS_KEY",) for adapter in ADAPTERS},
    }.items():
        for key in keys:
            value = SERVICES_OF_COMPOSE[name]["environment"][key]
            assert re.fullmatch(rf"\$\{{{key}:\?[^}}]+\}}", value), (name, key, value)
    # The API, the web UI and NATS are published on loopback unless the user says otherwise
    for name in ("dispatcher", "webui", "nats"):
        assert all(p.startswith("${TRIALBUS_PUBLISH_ADDRESS:-127.0.0.1}:") for p in SERVICES_OF_COMPOSE[name]["ports"])


def test_the_sandbox_profile_adds_both_emulators():
    sandbox = {name for name, spec in SERVICES_OF_COMPOSE.items() if "sandbox" in (spec.get("profiles") or [])}
    assert sandbox == {"openpai-emulator", "kubernetes-emulator"}
    for name in sandbox:
        module = SERVICES_OF_COMPOSE[name]["command"][2]
        run = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0 and "--host" in run.stdout, (name, run.stderr)


def test_the_dockerfile_passes_hadolint_and_runs_what_compose_runs():
    run = subprocess.run([tool("hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "USER 10001" in dockerfile and dockerfile.count("FROM ") == 2, "multi-stage, non-root"
    cmd = re.search(r'^CMD \["python", "-m", "([\w.]+)"\]', dockerfile, re.MULTILINE)
    assert cmd and cmd.group(1) in {spec["command"][2] for spec in OURS.values()}
    included = (ROOT / ".dockerignore").read_text()
    rules = [line for line in included.splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*" and "!tests/emulators/" in rules, "the context is allow-listed"


def test_make_up_runs_the_services_compose_defines():
    assert [s.name for s in SERVICES] == list(OURS)
    for service in SERVICES:
        spec = OURS[service.name]
        assert ("python", *service.argv) == tuple(spec["command"])
        for key, value in spec["environment"].items():  # the same settings, but for addresses and credentials
            if key in SECRETS:  # the same variables, filled with the local stack's own secrets
                assert service.secrets[key] == value, (service.name, key)
            elif key not in LOCAL:
                assert service.env[key] == re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value)), (service.name, key)
    assert compose_services(ROOT / "compose.yaml") == SERVICES


@pytest.mark.timeout(120)
def test_every_compose_service_starts_on_the_host_and_reports_in(tmp_path: Path):
    options = StackOptions(
        data_dir=tmp_path / "data",
        nats_port=free_port(),
        api_port=free_port(),
        gateway_port=free_port(),
        webui_port=free_port(),
        stop_grace=5,
    )
    stack = Stack(options, Console(quiet=True))
    stack.start()
    try:
        assert httpx.get(f"http://127.0.0.1:{options.gateway_port}/healthz").json()["status"] == "ok"
        assert httpx.get(f"{options.webui_url}/healthz").json()["status"] == "ok"
        assert "tuner started" in (options.data_dir / "logs" / "tuner.log").read_text()

        def adapters() -> set[str]:
            token = (options.data_dir / "api-token").read_text().strip()
            replicas = httpx.get(f"{options.api_url}/api/v1/platforms", headers={"Authorization": f"Bearer {token}"})
            replicas = replicas.json()
            return {p["adapter"] for p in replicas}

        wait_until(lambda: adapters() == set(ADAPTERS), 30, "every adapter's status in /platforms")
        local_users_and_secrets(stack)
    finally:
        stack.stop()


def local_users_and_secrets(stack: Stack) -> None:
    """The local stack as secure as compose: NATS users, tokens, secrets only where compose gives them."""
    data = stack.data_dir
    for name in ("api-token", "trial-secret", "secrets-key", "nats-passwords.json", "client.json"):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name
    found = local.find(data)
    assert found is not None and found.api_token == (data / "api-token").read_text().strip()
    # REST: no token, no answer; the token of client.json opens it
    api = f"{stack.options.api_url}/api/v1/experiments"
    assert httpx.get(api).status_code == 401
    assert httpx.get(api, headers={"Authorization": f"Bearer {found.api_token}"}).status_code == 200

    async def nats_checks() -> None:
        with pytest.raises(nats.errors.Error):  # no credentials: refused at connect
            await nats.connect(found.nats_url, max_reconnect_attempts=0, allow_reconnect=False, connect_timeout=2)
        refused: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            refused.append(exc)

        nc = await nats.connect(found.nats_url, user=found.nats_user, password=found.nats_password, error_cb=on_error)
        try:  # the client may ask the dispatcher, and may not send a trial request itself
            listed = json.loads((await nc.request("trialbus.api.experiment.list", b"{}", timeout=5)).data)
            assert listed["ok"] is True
            await nc.publish("dispatch.local-gpu", b"{}")
            await nc.flush()
            await asyncio.sleep(0.5)
            assert any("permissions violation" in str(e).lower() for e in refused), refused
        finally:
            await nc.close()

    asyncio.run(nats_checks())
    # Each service holds the secrets compose gives it, and no other
    held = {part.name: set(environ(part.proc.pid)) for part in stack.parts if part.name != "nats-server"}
    assert {"TRIALBUS_API_TOKEN", "TRIALBUS_TRIAL_SECRET", "TRIALBUS_SECRETS_KEY"} <= held["dispatcher"]
    assert "TRIALBUS_SECRETS_KEY" not in held["webui"] | held["tuner"] | held["metrics-gateway"]
    assert "TRIALBUS_API_TOKEN" not in held["tuner"] | held["local-gpu"] | held["metrics-gateway"]
    assert all("TRIALBUS_SECRETS_KEY" in held[a] and "TRIALBUS_TRIAL_SECRET" not in held[a] for a in ADAPTERS)
    assert all("TRIALBUS_NATS_PASSWORD" in names for names in held.values())


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_image_build_has_every_file_the_wheel_carries():
    """`pip install .` in the Dockerfile fails on a force-included file the context lacks."""
    import tomllib

    forced = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
        "force-include"
    ]
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    copied = " ".join(line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY "))
    for source in forced:
        assert f"!{source}" in allowed, f"{source} is not in the build context (.dockerignore)"
        assert source in copied, f"the Dockerfile's build stage does not COPY {source}"


def test_compose_v1_reads_it_too():
    """Debian's docker-compose 1.29 refuses a top-level `name:`; COMPOSE_PROJECT_NAME in .env
    names the project for both versions. The NATS image can be one built here."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "name" not in compose
    assert re.search(r"^COMPOSE_PROJECT_NAME=trialbus$", (ROOT / ".env.example").read_text(), re.MULTILINE)
    assert compose["services"]["nats"]["image"] == "${TRIALBUS_NATS_IMAGE:-nats:2.10.22-alpine}"
