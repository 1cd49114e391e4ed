"""compose.yaml and the Dockerfile, checked where no Docker engine runs: the file against the
Compose Specification's schema, what users rely on in it (healthchecks, required secrets,
scalable adapters, the sandbox profile), the Dockerfile with hadolint, and the services it
defines started as local processes exactly as ``make up`` starts them, each reporting in."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from rich.console import Console

from tests.e2e.helpers import wait_until
from tests.fixtures.nats import free_port
from trialbus.stack import LOCAL, SERVICES, Stack, StackOptions, compose_services

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
    assert included.splitlines()[2:3] == ["*"] and "!tests/emulators/" in included, "the context is allow-listed"


def test_make_up_runs_the_services_compose_defines():
    assert [s.name for s in SERVICES] == list(OURS)
    for service in SERVICES:
        spec = OURS[service.name]
        assert ("python", *service.argv) == tuple(spec["command"])
        for key, value in spec["environment"].items():  # the same settings, but for addresses and credentials
            if key not in LOCAL:
                assert service.env[key] == re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value)), (service.name, key)
    assert compose_services(ROOT / "compose.yaml") == SERVICES


@pytest.mark.timeout(120)
def test_every_compose_service_starts_on_the_host_and_reports_in(tmp_path: Path):
    options = StackOptions(data_dir=tmp_path / "data", nats_port=free_port(), api_port=free_port(),
                           gateway_port=free_port(), webui_port=free_port(), stop_grace=5)  # fmt: skip
    stack = Stack(options, Console(quiet=True))
    stack.start()
    try:
        assert httpx.get(f"http://127.0.0.1:{options.gateway_port}/healthz").json()["status"] == "ok"
        assert httpx.get(f"{options.webui_url}/healthz").json()["status"] == "ok"
        assert "tuner started" in (options.data_dir / "logs" / "tuner.log").read_text()

        def adapters() -> set[str]:
            replicas = httpx.get(f"{options.api_url}/api/v1/platforms").json()
            return {p["adapter"] for p in replicas}

        wait_until(lambda: adapters() == set(ADAPTERS), 30, "every adapter's status in /platforms")
    finally:
        stack.stop()
