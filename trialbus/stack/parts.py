"""Starting and stopping the parts of the stack: ``nats-server`` and the services of compose.yaml.

Start order: ``nats-server`` (JetStream, store in ``<data>/nats``), ready (its TCP port
answers), or with ``cluster`` N the N nodes of a JetStream cluster at once, ready when each one's
``/healthz`` says it has joined and the cluster has a meta leader (:mod:`.nats`); then every
service of compose.yaml at once, as compose starts services that depend only on nats; each is
ready when its ``/healthz`` answers 200. Stop: every service at once (each stops its own intake,
then finishes or hands back its work and drains), then the nats-servers, each SIGTERM then
SIGKILL of its whole process group after ``stop_grace`` seconds, all within the caller's
deadline. A hurried stop (a second Ctrl-C) kills at once.

Guarantees:

- Every process started is stopped, whatever happens (error, Ctrl-C, SIGTERM).
- Services run in their own sessions: a Ctrl-C in the terminal reaches only ``trialbus``,
  which then stops them in order.
- Each process writes stdout and stderr to ``<data>/logs/<name>.log`` (new at every ``up``;
  a restart appends under a line saying why), so the log of a crash survives its restart.
- nats-server requires a user: one per service, with the permissions of auth.conf, as in
  compose and Kubernetes. Each service gets the secrets compose.yaml gives it and no other
  (:mod:`trialbus.stack.credentials`: generated once, kept in the data dir, mode 0600), and
  ``<data>/client.json`` (0600) tells clients on this machine how to connect (:mod:`trialbus.local`).
- Every service and client gets every nats-server's URL (``TRIALBUS_NATS_URL``, comma-separated)
  and ``TRIALBUS_STREAM_REPLICAS``: one copy of each stream and bucket per server.
- Services and trials see the Python that runs ``trialbus`` first on PATH, so a trial's
  ``python3`` is the stack's Python.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from trialbus import local
from trialbus.stack import credentials, nats
from trialbus.stack.compose import NATS_RESTART, SECRETS, SERVICES, ServiceDef, interpolate
from trialbus.stack.errors import StackError
from trialbus.stack.options import StackOptions, nats_server_binary
from trialbus.stack.policy import RestartPolicy, Restarts
from trialbus.stack.probes import health, port_open
from trialbus.stack.processes import ProcessId, describe, free_port, port_free, port_holder, stack_of, terminate
from trialbus.stack.signals import StopSignals
from trialbus.stack.state import PartRecord, PartState


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def exit_text(code: int | None) -> str:
    """``exit code 3`` or ``killed by SIGKILL``."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


@dataclass
class Part:
    """A process of the stack: how to run it, and the one running now."""

    name: str
    #: Full command line; ``env`` and ``health`` may use ``{port}``, chosen at every start.
    argv: list[str]
    env: dict[str, str]
    health: str | None
    #: A nats-server's client port, which answers once it is ready when it has no ``health``.
    port: int | None
    policy: RestartPolicy
    log: Path
    restarts: Restarts
    proc: subprocess.Popen[bytes] | None = None
    identity: ProcessId | None = None
    state: PartState = "starting"
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: Monotonic time of the latest start, and the health URL of that start.
    started: float = 0.0
    health_url: str | None = None
    #: Monotonic time at which to start it again, while it waits to.
    restart_at: float | None = None
    last_exit: str | None = None

    def process(self) -> subprocess.Popen[bytes]:
        """The process, once started (a part that is ready, running or stopping has one)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_text(self) -> str:
        return exit_text(self.proc.returncode if self.proc is not None else None)

    def record(self) -> PartRecord:
        return PartRecord(
            name=self.name,
            pid=self.proc.pid if self.alive() and self.proc else None,
            started=self.identity.started if self.alive() and self.identity else None,
            state=self.state,
            since=self.since,
            restarts=self.restarts.count,
            health=self.health_url,
            port=self.port,
            last_exit=self.last_exit,
            log=str(self.log),
        )


class Stack:
    """The parts, started in order and stopped within a deadline. ``signals`` (optional) lets a
    signal interrupt a start and hurry a stop; ``on_change`` is called whenever a part starts,
    exits or changes state (the supervisor writes the state file there)."""

    def __init__(
        self,
        options: StackOptions,
        console: Console,
        services: Sequence[ServiceDef] = SERVICES,
        signals: StopSignals | None = None,
        nats_restart: RestartPolicy = NATS_RESTART,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.options = options
        self.console = console
        self.services = services
        self.signals = signals or StopSignals()
        self.nats_restart = nats_restart
        self.on_change = on_change
        self.parts: list[Part] = []
        self.data_dir = options.data_dir.expanduser().resolve()
        self.log_dir = self.data_dir / "logs"
        self.credentials: credentials.Credentials | None = None
        #: The nats-servers, chosen at start.
        self.broker: nats.Broker | None = None

    def client_env(self) -> dict[str, str]:
        """Environment for programs that use the stack (``trialbus up -- CMD``): its URLs, the
        NATS client user and the API token, as a client on this machine finds them."""
        found = self.local_stack()
        env = {
            "TRIALBUS_NATS_URL": found.nats_url,
            "TRIALBUS_API_URL": found.api_url,
            "TRIALBUS_WEBUI_URL": found.webui_url,
            "TRIALBUS_DATA_DIR": str(self.data_dir),
            "TRIALBUS_NATS_USER": found.nats_user,
            "TRIALBUS_NATS_PASSWORD": found.nats_password,
        }
        if found.api_token:
            env["TRIALBUS_API_TOKEN"] = found.api_token
        return {**self._base_env(), **env}

    def _base_env(self) -> dict[str, str]:
        """This environment less any secret setting (each service gets only its own), with
        this Python first on PATH."""
        bin_dir = str(Path(sys.executable).parent)
        env = {k: v for k, v in os.environ.items() if k not in SECRETS and not k.startswith("NATS_PASSWORD_")}
        return {**env, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]), "PYTHONUNBUFFERED": "1"}

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    # -- starting -------------------------------------------------------------------------

    def start(self) -> None:
        """Start every part in order, or stop what started and raise :class:`StackError`."""
        o = self.options
        if self.signals.requested:
            raise StackError("interrupted before the stack started", exit_code=130)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(mode=0o700, exist_ok=True)
            self.log_dir.chmod(0o700)  # the services' logs are the stack's, as its credentials are
            self.check_ports()
            self.parts = self._define()
            for tier in self._tiers():
                for part in tier:
                    self.spawn(part)
                self._wait_ready(tier)
        except BaseException:
            self.stop(deadline=time.monotonic() + o.stop_timeout)
            raise

    def _define(self) -> list[Part]:
        o = self.options
        values: dict[str, str | int] = {
            "host": o.host,
            "nats_port": o.nats_port,
            "api_port": o.api_port,
            "gateway_port": o.gateway_port,
            "webui_port": o.webui_port,
            "data_dir": str(self.data_dir),
        }
        self.credentials = creds = credentials.load(self.data_dir)
        broker = self.broker = nats.plan(
            o.host, o.nats_port, o.cluster, self.data_dir, (o.api_port, o.gateway_port, o.webui_port)
        )
        local.write(self.data_dir, self.local_stack())
        common = {
            **self._base_env(),
            "TRIALBUS_NATS_URL": broker.urls,
            "TRIALBUS_DATA_DIR": str(self.data_dir),
            "TRIALBUS_STREAM_REPLICAS": str(broker.replicas),
        }

        def restarts() -> Restarts:
            return Restarts(o.restart_backoff, o.restart_backoff_max, o.crash_loop, o.crash_loop_window)

        binary = nats_server_binary()
        nats.write_configs(broker, self.data_dir)
        nats_env = {**common, **{v: creds.nats[u] for u, v in creds.nats_variables.items()}}
        nats_env["NATS_CALLOUT_ISSUER"] = creds.callout_issuer  # the callout's answers are signed by it
        parts = [
            Part(
                node.name,
                [binary, "-c", str(node.config)],
                nats_env,
                node.health(o.host),
                node.port,
                self.nats_restart,
                self.log_dir / f"{node.name}.log",
                restarts(),
            )
            for node in broker.nodes
        ]
        variables = {**os.environ, **creds.variables}
        for service in self.services:
            env = {**common, **{k: _fill(v, values) for k, v in service.env.items()}}
            for key, template in service.secrets.items():
                if (value := interpolate(template, variables)) is not None:
                    env[key] = value
            health = _fill(service.health, values) if service.health else None
            parts.append(
                Part(
                    service.name,
                    [sys.executable, *service.argv],
                    env,
                    health,
                    None,
                    service.restart,
                    self.log_dir / f"{service.name}.log",
                    restarts(),
                )
            )
        return parts

    def local_stack(self) -> local.LocalStack:
        """What a client on this machine needs to use the stack (``<data>/client.json``)."""
        o = self.options
        creds = self.credentials
        if creds is None:
            raise RuntimeError("the stack's credentials are not loaded yet (define the stack first)")
        urls = self.broker.urls if self.broker is not None else o.nats_url
        return local.LocalStack(
            nats_url=urls,
            nats_user="client",
            nats_password=creds.nats["client"],
            api_url=o.api_url,
            webui_url=o.webui_url,
            api_token=creds.api_token,
        )

    def check_ports(self) -> None:
        """Each port of the stack is free, or an error naming the port, who holds it and the option to change."""
        o = self.options
        for port, what, flag in (
            (o.nats_port, "NATS", "--nats-port"),
            (o.api_port, "the API", "--api-port"),
            (o.gateway_port, "the metrics gateway", "--gateway-port"),
            (o.webui_port, "the web UI", "--webui-port"),
        ):
            if port_free(o.host, port):
                continue
            holder = port_holder(port)
            if holder is None:
                raise StackError(
                    f"port {port} for {what} is in use on {o.host} by a program this user cannot see: "
                    f"stop it, or choose another port with {flag}"
                )
            stack = stack_of(holder)
            if stack is not None:
                raise StackError(
                    f"port {port} for {what} is in use on {o.host} by {describe(holder, 60)}, part of the Trialbus "
                    f"stack on {stack}: `trialbus down --data-dir {stack}` stops it; or choose another port with {flag}"
                )
            raise StackError(
                f"port {port} for {what} is in use on {o.host} by {describe(holder)}: stop that "
                f"program, or choose another port with {flag}"
            )

    def spawn(self, part: Part, reason: str | None = None) -> None:
        """Start ``part`` (again, after ``reason``); its log is new at the first start, appended after."""
        port = free_port(self.options.host) if "{port}" in " ".join([*part.env.values(), part.health or ""]) else 0
        env = {k: v.replace("{port}", str(port)) for k, v in part.env.items()}
        part.health_url = part.health.replace("{port}", str(port)) if part.health else None
        with part.log.open("ab" if reason else "wb") as out:
            if reason:
                when = f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"
                out.write(f"\n----- {when}: restarted after {reason} -----\n".encode())
                out.flush()
            part.proc = subprocess.Popen(
                part.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        part.identity = ProcessId.of(part.proc.pid) or ProcessId(part.proc.pid, 0.0)
        part.started = time.monotonic()
        part.restart_at = None
        self.mark(part, "starting")

    def ready(self, part: Part) -> bool:
        """Whether the part's latest start is ready (one quick probe): its ``/healthz`` where it has
        one (a service, a cluster's nats-server), else its port (one nats-server), else alive a while."""
        if part.health_url is not None:
            return health(part.health_url) == "ok"
        if part.port is not None:
            return port_open(self.options.host, part.port)
        return time.monotonic() - part.started >= self.options.settle

    def _tiers(self) -> list[list[Part]]:
        """The nats-servers, then every service at once: as compose, where each depends only on nats."""
        return [[p for p in self.parts if p.port is not None], [p for p in self.parts if p.port is None]]

    def _wait_ready(self, tier: list[Part]) -> None:
        deadline = time.monotonic() + self.options.start_timeout
        waiting = list(tier)
        with self.console.status(f"starting {', '.join(p.name for p in tier)}…"):
            while waiting:
                for part in list(waiting):
                    if self.ready(part):
                        waiting.remove(part)
                        self.mark(part, "running")
                        where = f"nats://{self.options.host}:{part.port}" if part.port else part.health_url or "running"
                        self.console.print(
                            f"[green]✓[/] {part.name} ready: {where} [dim](pid {part.process().pid}, log {part.log})[/]"
                        )
                    elif not part.alive():
                        raise StackError(
                            f"{part.name} exited during startup ({part.exit_text()}); log: {part.log}", tail(part.log)
                        )
                if not waiting:
                    break
                if self.signals.requested:
                    raise StackError("interrupted during startup; stopped what had started", exit_code=130)
                if time.monotonic() > deadline:
                    late = waiting[0]
                    raise StackError(
                        f"{late.name} was not ready within {self.options.start_timeout:g}s; log: {late.log}",
                        tail(late.log),
                    )
                self.signals.wait(0.1)

    def mark(self, part: Part, state: PartState) -> None:
        """Record a new state of ``part``, and say so through ``on_change``."""
        part.state, part.since = state, datetime.now(UTC)
        self.on_change()

    # -- stopping -------------------------------------------------------------------------

    def stop(self, deadline: float | None = None) -> None:
        """Stop every part: the services at once, then the nats-servers; each gets SIGTERM, then SIGKILL of
        its group after ``stop_grace`` seconds or at ``deadline`` (monotonic), at once when hurried."""
        deadline = deadline if deadline is not None else time.monotonic() + self.options.stop_timeout
        services = [p for p in self.parts if p.port is None]
        brokers = [p for p in self.parts if p.port is not None]
        for tier in (services, brokers):
            self._stop_tier(list(reversed(tier)), deadline)

    def _stop_tier(self, tier: list[Part], deadline: float) -> None:
        for part in tier:
            part.restart_at = None
            if not part.alive() and part.state != "exited":
                self.mark(part, "exited")
        running = [p for p in tier if p.alive()]
        if not running:
            return
        for part in running:
            self.mark(part, "stopping")
        grace = max(0.0, min(self.options.stop_grace, deadline - time.monotonic()))
        with self.console.status(f"stopping {', '.join(p.name for p in running)}…"):
            terminate([p.identity for p in running if p.identity], grace, lambda: self.signals.hurried)
        for part in running:
            if part.alive():  # not the process its identity names (it cannot be): by its handle
                self.kill(part)
            part.process().wait()
            self._stopped(part)

    def _stopped(self, part: Part) -> None:
        part.last_exit = part.exit_text()
        self.mark(part, "exited")
        self.console.print(f"[dim]stopped {part.name} ({part.exit_text()})[/]")

    def kill(self, part: Part) -> None:
        """SIGKILL the part's whole process group and reap it."""
        if part.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(part.proc.pid, signal.SIGKILL)
        part.proc.wait()


def _fill(template: str, values: Mapping[str, str | int]) -> str:
    """``str.format`` for the stack's names, leaving ``{port}`` for :meth:`Stack.spawn`."""
    return template.format(**values, port="{port}")
