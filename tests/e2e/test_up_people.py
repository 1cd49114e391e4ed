"""A person uses the stack of ``trialbus up`` with nothing but their token and its NATS address.

``trialbus up`` runs nats-server with the real ``auth.conf`` and the dispatcher with the auth
callout's issuer it made (``<data>/nats-callout.seed``); a person's CLI, given no NATS user and
no data dir of the stack, connects as that person (docs/security.md, "People").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures.nats import nats_server_binary, require_binary
from tests.fixtures.up import Up, new_ports, processes

TRIALBUS = str(Path(sys.executable).parent / "trialbus")


@pytest.fixture
def up(tmp_path: Path):
    require_binary(nats_server_binary(), "nats-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"}
    data_dir = tmp_path / "data"
    up = Up(data_dir, new_ports(), {**env, "COLUMNS": "300"}, tmp_path / "up.log")
    yield up
    up.kill()
    if (data_dir / "stack.json").exists():
        for process in processes(data_dir).values():
            process.kill()


def test_a_person_s_cli_needs_only_their_token_and_the_nats_url(up: Up, tmp_path: Path) -> None:
    up.wait_for("Trialbus is up")
    assert (up.data_dir / "nats-callout.seed").stat().st_mode & 0o777 == 0o600
    api = f"http://127.0.0.1:{up.ports['api']}/api/v1"
    added = httpx.post(
        f"{api}/users",
        json={"name": "ana", "team": "vision"},
        headers={"Authorization": f"Bearer {up.local.api_token}"},
        timeout=10,
    )
    assert added.status_code == 201, added.text
    # A person's environment: the NATS address and their token; no NATS user, no stack's data dir
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIALBUS_", "NATS_"))}
    env |= {
        "TRIALBUS_NATS_URL": up.nats_url,
        "TRIALBUS_API_TOKEN": added.json()["token"],
        "TRIALBUS_DATA_DIR": str(tmp_path / "elsewhere"),
    }
    me = subprocess.run([TRIALBUS, "whoami"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert me.returncode == 0 and me.stdout.strip() == "ana (team vision, member)", me
    # a wrong token: NATS refuses it at connect, and the CLI says what to do
    env["TRIALBUS_API_TOKEN"] = "tbu_ana.not-her-token"
    wrong = subprocess.run([TRIALBUS, "whoami"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert wrong.returncode == 1 and "refused your user's token" in wrong.stderr + wrong.stdout, wrong
