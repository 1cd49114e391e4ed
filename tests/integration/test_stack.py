"""``trialbus up``'s process supervision with a real nats-server and stand-in services.

The stand-ins are tiny Python programs (an HTTP server answering ``/healthz``, a sleeper),
so these tests check start order, readiness, logs, the trial secret, stop order and exit
codes without depending on the real services.
"""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.fixtures.nats import free_port, nats_server_binary, require_binary
from trialbus.stack import ServiceDef, Stack, StackError, StackOptions, run

WEB = """
import http.server, os, signal, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("web sees", os.environ["TRIALBUS_NATS_URL"], os.environ["TRIALBUS_DATA_DIR"], flush=True)
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Health).serve_forever()
"""
SLEEPER = "import time; print('sleeping', flush=True); time.sleep(600)"
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


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
        data_dir=tmp_path / "data", nats_port=free_port(), api_port=free_port(), gateway_port=free_port(),
        webui_port=free_port(), start_timeout=20, stop_grace=5, settle=0.3,
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
        assert stack.dead() is None
    finally:
        stack.stop()

    assert all(p.poll() is not None for p in procs)
    text = out.getvalue()
    assert text.index("stopped worker") < text.index("stopped web") < text.index("stopped nats-server")
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


def test_a_service_dying_at_startup_aborts_with_its_log(options: StackOptions) -> None:
    broken = ServiceDef("broken", ("-c", "import sys; print('no config here'); sys.exit(3)"))
    stack = Stack(options, quiet()[0], services(broken))

    with pytest.raises(StackError, match=r"broken exited during startup \(exit code 3\)") as raised:
        stack.start()

    assert "no config here" in raised.value.log_tail
    assert stack.parts == []  # everything that started was stopped


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


def test_sigterm_to_up_stops_everything_and_exits_0(options: StackOptions) -> None:
    # Given `up` running in its own process with the stand-in services
    program = (
        "import sys; from pathlib import Path; from rich.console import Console;"
        "from trialbus.stack import StackOptions, run;"
        "from tests.integration.test_stack import services;"
        f"o = StackOptions(data_dir=Path({str(options.data_dir)!r}), nats_port={options.nats_port},"
        f" api_port={options.api_port}, gateway_port={options.gateway_port}, webui_port={options.webui_port},"
        " settle=0.3);"
        "sys.exit(run(o, None, Console(stderr=True, width=300), services()))"
    )
    up = subprocess.Popen([sys.executable, "-c", program], stderr=subprocess.PIPE, text=True,
                          cwd=Path(__file__).parents[2])
    lines = []
    try:
        for line in up.stderr:
            lines.append(line)
            if "Trialbus is up" in line:
                break
        pids = [int(p) for p in re.findall(r"pid (\d+)", "".join(lines))]
        assert len(pids) == 3, lines

        # When it gets SIGTERM
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        up.stderr.close()

    # Then every process it started is gone
    time.sleep(0.1)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
