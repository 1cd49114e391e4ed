"""Starting and stopping the stack's parts (:class:`trialbus.stack.Stack`) with a real
nats-server and stand-in services: start order, readiness, logs, the trial secret, stop
order, exit codes. ``trialbus up`` as a whole (signals, restarts, leftovers) is in test_up.py.
"""

from __future__ import annotations

import io
import socket
import stat
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.fixtures.nats import free_port, nats_server_binary, require_binary
from tests.fixtures.standins import MODULES
from trialbus.stack import ServiceDef, Stack, StackError, StackOptions, run

WEB, SLEEPER, STUBBORN = MODULES["web"], MODULES["worker"], MODULES["stubborn"]


def services(*extra: ServiceDef) -> tuple[ServiceDef, ...]:
    return (
        ServiceDef("web", ("-c", WEB), {"PORT": "{api_port}"}, health="http://{host}:{api_port}/healthz"),
        ServiceDef("worker", ("-c", SLEEPER)),
        *extra,
    )


@pytest.fixture
def options(tmp_path: Path) -> StackOptions:
    require_binary(nats_server_binary(), "nats-server")
    return StackOptions(
        data_dir=tmp_path / "data",
        nats_port=free_port(),
        api_port=free_port(),
        gateway_port=free_port(),
        webui_port=free_port(),
        start_timeout=20,
        stop_grace=5,
        settle=0.3,
    )


def quiet() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200), out


def test_the_stack_starts_in_order_and_stops_in_reverse(options: StackOptions) -> None:
    console, out = quiet()
    stack = Stack(options, console, services())
    stack.start()
    try:
        procs = [part.proc for part in stack.parts]
        assert [p.name for p in stack.parts] == ["nats-server", "web", "worker"]
        assert all(p.poll() is None for p in procs)
    finally:
        stack.stop()

    assert all(p.poll() is not None for p in procs)
    text = out.getvalue()
    assert text.index("stopped worker") < text.index("stopped nats-server")
    assert text.index("stopped web") < text.index("stopped nats-server"), "the services first, nats-server last"
    logs = stack.log_dir
    assert f"web sees {options.nats_url} {stack.data_dir}" in (logs / "web.log").read_text()
    assert "sleeping" in (logs / "worker.log").read_text()
    assert "JetStream" in (logs / "nats-server.log").read_text()


def test_the_trial_secret_is_private_and_kept(options: StackOptions) -> None:
    secrets = []
    for _ in range(2):
        stack = Stack(options, quiet()[0], ())
        stack.start()
        stack.stop()
        secret = stack.data_dir / "trial-secret"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        secrets.append(secret.read_text())
    assert secrets[0] == secrets[1] and len(secrets[0].strip()) == 64


def test_the_stacks_own_files_are_its_users_alone(options: StackOptions) -> None:
    # Given a stack that ran (local trials run as another user: docs/security.md)
    stack = Stack(options, quiet()[0], ())
    stack.start()
    stack.stop()
    # Then its credentials, the broker's configuration and the services' logs are private
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in stack.data_dir.iterdir() if p.is_file()}
    for name in ("client.json", "api-token", "nats-passwords.json", "trial-secret", "secrets-key", "nats-auth.conf"):
        assert modes.pop(name) == 0o600, name
    assert {name: mode for name, mode in modes.items() if mode & 0o077} == {}
    assert stat.S_IMODE(stack.log_dir.stat().st_mode) == 0o700


def test_a_service_dying_at_startup_aborts_with_its_log(options: StackOptions) -> None:
    broken = ServiceDef("broken", ("-c", "import sys; print('no config here'); sys.exit(3)"))
    stack = Stack(options, quiet()[0], services(broken))

    with pytest.raises(StackError, match=r"broken exited during startup \(exit code 3\)") as raised:
        stack.start()

    assert "no config here" in raised.value.log_tail
    assert all(not part.alive() for part in stack.parts), "everything that started was stopped"


def test_a_service_ignoring_sigterm_is_killed_after_the_grace(options: StackOptions) -> None:
    options = StackOptions(**{**options.__dict__, "stop_grace": 0.5})
    stack = Stack(options, quiet()[0], (ServiceDef("stubborn", ("-c", STUBBORN)),))
    stack.start()
    proc = stack.parts[-1].proc
    stack.stop()
    assert proc.returncode == -9


def test_a_busy_port_is_refused_with_the_option_to_change(options: StackOptions) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", options.api_port))
        s.listen()
        with pytest.raises(StackError, match="--api-port"):
            Stack(options, quiet()[0], services()).start()


def test_up_with_a_command_returns_its_exit_code(options: StackOptions) -> None:
    script = (
        "import os, socket, sys; host, port = os.environ['TRIALBUS_NATS_URL'].rsplit(':', 1);"
        "socket.create_connection((host.removeprefix('nats://'), int(port))).close();"
        "print(os.environ['TRIALBUS_API_URL']); sys.exit(7)"
    )
    console, _ = quiet()
    code = run(options, [sys.executable, "-c", script], console, services())
    assert code == 7


def test_up_with_a_missing_command_stops_the_stack(options: StackOptions) -> None:
    with pytest.raises(StackError, match="cannot run no-such-command-here"):
        run(options, ["no-such-command-here"], quiet()[0], services())
