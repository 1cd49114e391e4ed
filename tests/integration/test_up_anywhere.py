"""A running ``trialbus up`` found from any directory, as a user meets it: ``trialbus up --data-dir
<dir>`` in one terminal, then the CLI in another directory (no ``.trialbus`` there, no
``TRIALBUS_*`` set), with ``XDG_RUNTIME_DIR`` a directory of the test's. The stacks are real:
nats-server and the dispatcher of compose.yaml (the other services are left out, as nothing here
needs them), on free ports."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fixtures.nats import nats_server_binary, require_binary
from tests.fixtures.up import TRIALBUS, Up, new_ports, processes
from trialbus import local

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "experimentName": "from-elsewhere",
    "trialCommand": "python3 trial.py",
    "trialCodeDirectory": "code",
    "trialConcurrency": 1,
    "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}},
    "tuner": {"name": "GridSearch"},
    "trainingService": {"platform": "local"},
}


class World:
    """This user's machine: a runtime dir, stacks each in a directory of its own, and ``elsewhere``,
    a directory with an experiment's config but no ``.trialbus``, where the CLI runs."""

    def __init__(self, root: Path) -> None:
        require_binary(nats_server_binary(), "nats-server")
        self.root = root
        self.xdg = root / "xdg"
        self.xdg.mkdir(mode=0o700)
        self.elsewhere = root / "elsewhere"
        (self.elsewhere / "code").mkdir(parents=True)
        (self.elsewhere / "code" / "trial.py").write_text("print('trial')\n")
        (self.elsewhere / "config.yml").write_text(yaml.safe_dump(CONFIG))
        compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
        compose["services"] = {k: v for k, v in compose["services"].items() if k in ("nats", "dispatcher")}
        self.compose = root / "compose.yaml"
        self.compose.write_text(yaml.safe_dump(compose))
        self.ups: list[Up] = []

    @property
    def runtime(self) -> Path:
        return self.xdg / "trialbus"

    def entries(self) -> list[Path]:
        return sorted(self.runtime.glob("stack-*.json"))

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIALBUS_", "NATS_", "XDG_"))}
        return {
            **env,
            "XDG_RUNTIME_DIR": str(self.xdg),
            "TRIALBUS_COMPOSE_FILE": str(self.compose),
            "COLUMNS": "300",
            **extra,
        }

    def up(self, name: str, **env: str) -> Up:
        """``trialbus up --data-dir <root>/<name>``, run from that stack's own directory; ready."""
        home = self.root / name
        home.mkdir(exist_ok=True)
        up = Up(home / "stackdir", new_ports(), self.env(**env), home / "up.log", cwd=home)
        self.ups.append(up)
        up.wait_for("Trialbus is up")
        return up

    def cli(self, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        """The CLI as a user runs it in ``elsewhere`` (or ``cwd``)."""
        return subprocess.run(
            [TRIALBUS, *args],
            cwd=cwd or self.elsewhere,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def cleanup(self) -> None:
        for up in self.ups:
            left = processes(up.data_dir) if (up.data_dir / "stack.json").exists() else {}
            up.kill()
            for process in left.values():
                process.kill()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    yield made
    made.cleanup()


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, Up, Up]]:
    """Two stacks of one user, neither on the default ports; the tests only read them."""
    made = World(tmp_path_factory.mktemp("two"))
    try:
        yield made, made.up("a"), made.up("b")
    finally:
        made.cleanup()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cli_uses_a_stack_from_any_directory_until_it_stops(world: World) -> None:
    # Given `trialbus up --data-dir <dir>` running in its own directory
    up = world.up("one")

    # Then it registered in this user's runtime dir: one private file, in a private directory
    [entry] = world.entries()
    assert entry.name == f"stack-{up.proc.pid}.json"
    assert mode(world.runtime) == 0o700 and mode(entry) == 0o600
    said = json.loads(entry.read_text())
    assert said["pid"] == up.proc.pid and said["data_dir"] == str(up.data_dir.resolve())
    assert said["client"]["nats_url"] == up.nats_url and said["client"]["nats_password"] == up.local.nats_password

    # When, in another directory, the user creates an experiment on it and lists the experiments
    created = world.cli("--nats-url", up.nats_url, "create", "-f", "config.yml")
    listed = world.cli("--nats-url", up.nats_url, "experiment", "list")

    # Then both work, with the stack's own credentials found there, and its own web UI named
    assert created.returncode == 0, created.stderr
    assert f"web UI: http://127.0.0.1:{up.ports['webui']}/experiments/" in created.stdout
    assert listed.returncode == 0, listed.stderr
    assert "from-elsewhere" in listed.stdout

    # And `trialbus status --all` lists it: pid, data dir, URLs
    every = world.cli("status", "--all")
    assert every.returncode == 0, every.stderr
    assert f"{up.data_dir.resolve()}: `trialbus up` pid {up.proc.pid}, since " in every.stdout
    assert up.nats_url in every.stdout and f"http://127.0.0.1:{up.ports['webui']}" in every.stdout

    # When it is stopped from there too (`down` finds it by its NATS URL)
    down = world.cli("--nats-url", up.nats_url, "down")

    # Then it stopped, and its entry is gone with it
    assert down.returncode == 0, down.stderr
    assert f"stopped the stack on {up.data_dir.resolve()}" in down.stderr
    assert up.wait(30) == 0
    assert world.entries() == []
    after = world.cli("status", "--all")
    assert after.returncode == 1 and "no `trialbus up` of this user runs" in after.stdout


def test_two_stacks_are_told_apart_by_data_dir_and_by_url(two: tuple[World, Up, Up]) -> None:
    world, a, b = two
    # By its data dir (the option, or the variable), the CLI uses that stack, its URL and password
    named = world.cli("--data-dir", str(a.data_dir), "experiment", "list")
    assert named.returncode == 0, named.stderr
    by_variable = world.cli("experiment", "list", TRIALBUS_DATA_DIR=str(b.data_dir))
    assert by_variable.returncode == 0, by_variable.stderr
    for up in (a, b):
        # By its NATS URL alone, found among the running stacks (each has its own password)
        by_url = world.cli("--nats-url", up.nats_url, "experiment", "list")
        assert by_url.returncode == 0, by_url.stderr
    # status (and down) choose the same way
    status = world.cli("--nats-url", a.nats_url, "status")
    assert status.returncode == 0 and f"Trialbus stack on {a.data_dir.resolve()}: running" in status.stdout
    status = world.cli("status", TRIALBUS_DATA_DIR=str(b.data_dir))
    assert status.returncode == 0 and f"Trialbus stack on {b.data_dir.resolve()}: running" in status.stdout

    # A's password is never sent to B's servers: naming A and B's URL finds no credentials
    mixed = world.cli("--data-dir", str(a.data_dir), "--nats-url", b.nats_url, "experiment", "list")
    assert mixed.returncode == 1
    assert "Authorization Violation" in mixed.stderr and f"{a.data_dir.resolve()}/client.json" in mixed.stderr

    # and `down` naming neither stops neither, but says how to
    neither = world.cli("down")
    assert neither.returncode == 0 and "no stack is running" in neither.stderr
    assert "`trialbus status --all` lists this user's running stacks" in neither.stderr
    assert a.proc.poll() is None and b.proc.poll() is None

    # The Python client and trialbus.Experiment choose the same way, by URL or by data dir
    script = textwrap.dedent("""
        import sys
        from trialbus import Client, Experiment
        with Client(sys.argv[1]) as client:
            print("by url:", len(client.list_experiments()))
        experiment = Experiment("config.yml", data_dir=sys.argv[2])
        print("created:", experiment.start())
        experiment.close()
    """)
    python = subprocess.run(
        [sys.executable, "-c", script, a.nats_url, str(b.data_dir)],
        cwd=world.elsewhere,
        env=world.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert python.returncode == 0, python.stderr
    created = python.stdout.split("created: ")[1].strip()
    on_b = world.cli("--data-dir", str(b.data_dir), "experiment", "list").stdout
    on_a = world.cli("--nats-url", a.nats_url, "experiment", "list").stdout
    assert created in on_b and created not in on_a

    # And `status --all` lists both, the older first
    every = world.cli("status", "--all").stdout
    assert every.index(str(a.data_dir.resolve())) < every.index(str(b.data_dir.resolve()))


def test_without_credentials_the_error_says_where_it_looked_and_what_to_set(two: tuple[World, Up, Up]) -> None:
    # Given a stack runs, but this user's runtime dir (as this environment says) has no entry for it
    world, a, _ = two
    empty = world.root / "other-xdg"
    empty.mkdir(mode=0o700, exist_ok=True)

    # When the CLI connects to it from elsewhere
    run = world.cli("--nats-url", a.nats_url, "experiment", "list", XDG_RUNTIME_DIR=str(empty))

    # Then NATS refused it, and the error names where it looked and what to set, not a stack that is down
    assert run.returncode == 1
    error = run.stderr
    assert "Authorization Violation" in error
    assert str(empty / "trialbus") in error and str(world.elsewhere / ".trialbus" / "client.json") in error
    assert "--data-dir" in error and "TRIALBUS_DATA_DIR" in error
    assert "TRIALBUS_NATS_USER" in error and "TRIALBUS_NATS_PASSWORD" in error
    assert "is the stack running" not in error
    assert a.local.nats_password not in error


def test_a_running_stack_wins_over_a_stale_client_json_here(two: tuple[World, Up, Up]) -> None:
    # Given a directory whose .trialbus/client.json names A's URL with a password A no longer has
    world, a, _ = two
    here = world.root / "stale-here"
    (here / ".trialbus").mkdir(parents=True, exist_ok=True)
    local.write(here / ".trialbus", dataclasses.replace(a.local, nats_password="p-a-password-of-old"))

    # When the CLI runs there, it uses the running stack's entry, which comes first
    found = world.cli("--nats-url", a.nats_url, "experiment", "list", cwd=here)
    assert found.returncode == 0, found.stderr

    # and without that entry, the refusal names the stale file and what to set, not a stack that is down
    empty = world.root / "no-entries"
    empty.mkdir(mode=0o700, exist_ok=True)
    refused = world.cli("--nats-url", a.nats_url, "experiment", "list", cwd=here, XDG_RUNTIME_DIR=str(empty))
    assert refused.returncode == 1
    assert "refused the client user found in" in refused.stderr
    assert str(here / ".trialbus" / "client.json") in refused.stderr and "--data-dir" in refused.stderr
    assert "p-a-password-of-old" not in refused.stderr


def test_the_api_token_file_holds_the_token_in_force(world: World) -> None:
    # Given a data dir whose api-token holds an older, generated token, and a token in the environment
    data = world.root / "token" / "stackdir"
    data.mkdir(parents=True)
    (data / "api-token").write_text("an-older-token-generated-before\n")
    token = secrets.token_urlsafe(32)

    # When `trialbus up` starts with it (its output going to a file, not a terminal)
    up = world.up("token", TRIALBUS_API_TOKEN=token)

    # Then the file it points to holds that token, privately, and the API takes it; the old one is refused
    assert f"{data.resolve() / 'api-token'}>" in up.text()
    assert (data / "api-token").read_text().strip() == token and mode(data / "api-token") == 0o600
    assert up.local.api_token == token
    api = f"http://127.0.0.1:{up.ports['api']}/api/v1/experiments"
    file_token = (data / "api-token").read_text().strip()
    assert httpx.get(api, headers={"Authorization": f"Bearer {file_token}"}, timeout=10).status_code == 200
    older = {"Authorization": "Bearer an-older-token-generated-before"}
    assert httpx.get(api, headers=older, timeout=10).status_code == 401
    # And no secret shows in what it printed
    assert token not in up.text()
    up.ctrl_c()
    assert up.wait(30) == 0


def test_an_entry_whose_stack_is_gone_is_ignored_and_deleted(world: World) -> None:
    # Given a process that registered as a stack would, then was killed (no clean stop)
    script = textwrap.dedent("""
        import os, sys, time
        from trialbus import runtime
        client = {"nats_url": "nats://127.0.0.1:1", "nats_user": "client", "nats_password": "p",
                  "api_url": "http://127.0.0.1:2", "webui_url": "http://127.0.0.1:3"}
        runtime.register(os.getpid(), "/gone/stackdir", "2026-01-01T00:00:00+00:00", client)
        print("registered", flush=True)
        time.sleep(600)
    """)
    killed = subprocess.Popen([sys.executable, "-c", script], env=world.env(), stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline().strip() == "registered"
        assert "/gone/stackdir" in world.cli("status", "--all").stdout, "alive, it is listed"
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        killed.stdout.close()
    # and an entry whose pid runs, but is not a stack's (a reused pid: this test's own)
    reused = world.runtime / f"stack-{os.getpid()}.json"
    reused.write_text(
        json.dumps({"pid": os.getpid(), "data_dir": "/reused/stackdir", "started_at": "2026-01-01", "client": {}})
    )
    reused.chmod(0o600)
    assert len(world.entries()) == 2

    # When the CLI looks for stacks
    every = world.cli("status", "--all")

    # Then neither is listed, and both are deleted
    assert every.returncode == 1, every.stdout
    assert "no `trialbus up` of this user runs" in every.stdout
    assert world.entries() == []


def test_given_no_url_nor_data_dir_a_client_uses_the_stack_on_the_default_ports(tmp_path: Path, monkeypatch) -> None:
    from trialbus import runtime
    from trialbus.client import AsyncClient

    # Given two stacks of this user registered (as `trialbus up` does), one on the default ports
    for name in ("TRIALBUS_DATA_DIR", "TRIALBUS_NATS_URL", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no .trialbus here

    def client(url: str, password: str) -> dict[str, str]:
        return {"nats_url": url, "nats_user": "client", "nats_password": password, "api_url": "", "webui_url": ""}

    default = runtime.register(os.getpid(), "/a", "2026-01-01T00:00:00+00:00", client(local.DEFAULT_NATS_URL, "pa"))
    other = runtime.register(os.getpid() + 1, "/b", "2026-01-01T00:00:01+00:00", client("nats://127.0.0.1:5222", "pb"))
    try:
        # Then a client given nothing goes to the default ports, with that stack's password
        assert AsyncClient().url == local.DEFAULT_NATS_URL
        assert local.credentials_for(AsyncClient().url) == ("client", "pa")
        # one given the other's URL gets the other's; one whose URL names a server of no stack, none
        assert local.credentials_for("nats://localhost:5222") == ("client", "pb")
        assert local.credentials_for("nats://127.0.0.1:5222,nats://elsewhere:4222") is None
    finally:
        default.close()
        other.close()
    # And once they stopped, nothing is found
    assert local.credentials_for(local.DEFAULT_NATS_URL) is None and list(runtime.runtime_dir().iterdir()) == []

    # Without XDG_RUNTIME_DIR, the runtime dir is under the user's data dir, as Jupyter's
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    assert runtime.runtime_dir() == tmp_path / "share" / "trialbus" / "runtime"
