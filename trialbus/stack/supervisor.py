"""``trialbus up``: start the stack, keep it running as compose would, stop it on request.

One thread, no locks: signal handlers only record the request (:mod:`.signals`), and the loop
here wakes on them at once. While running, a part that exits is started again after a back-off
as its compose ``restart:`` policy says (a nats-server on its same JetStream directory, at its
same addresses: a cluster's node rejoins its cluster), and the console says which, why and
when; a part that keeps dying (``crash_loop`` exits within ``crash_loop_window`` seconds)
stops the stack with its log tail and exit code 1. Once every part is ready it registers the
stack in this user's runtime dir (:mod:`trialbus.runtime`), where clients in any directory and
``trialbus status --all`` find it, until its stop begins.

A stop (first SIGINT, SIGTERM or SIGHUP, ``trialbus down``, or CMD's end) goes in order
within ``stop_timeout`` seconds: CMD is asked to stop; the running experiments are stopped so
their trials end USER_CANCELED with the reason (unless ``keep_trials``: :mod:`.trials`); then
every service, then the nats-servers. A second signal kills every part at once and says so.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape

from trialbus import runtime
from trialbus.stack.compose import NATS_RESTART, SERVICES, ServiceDef
from trialbus.stack.credentials import FILES
from trialbus.stack.errors import StackError
from trialbus.stack.options import StackOptions
from trialbus.stack.parts import Part, Stack, tail
from trialbus.stack.policy import RestartPolicy
from trialbus.stack.processes import ProcessId
from trialbus.stack.signals import StopSignals
from trialbus.stack.state import (
    DataDirLock,
    PartRecord,
    StackRecord,
    StopRequest,
    claim,
    stop_leftovers,
    take_stop_request,
    write_record,
)
from trialbus.stack.trials import end_running_trials

#: Where the API token in force is: the file ``up`` points people to for the web UI.
API_TOKEN_FILE = FILES["TRIALBUS_API_TOKEN"]
#: How a stop was asked for, as the trials' messages say it.
HOW = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP: its terminal closed"}
#: The share of ``stop_timeout`` that ending the running trials may take; the parts get the rest.
TRIALS_SHARE = 0.4


def run(
    options: StackOptions,
    command: Sequence[str] | None,
    console: Console,
    services: Sequence[ServiceDef] = SERVICES,
    nats_restart: RestartPolicy = NATS_RESTART,
) -> int:
    """``trialbus up [-- CMD…]``: start, supervise until a stop (or CMD's end), stop; the exit code.
    Raises :class:`StackError` when the stack cannot start or a part keeps dying."""
    signals = StopSignals()
    with signals.installed():
        return Supervisor(options, console, services, signals, nats_restart).run(command)


class Supervisor:
    def __init__(
        self,
        options: StackOptions,
        console: Console,
        services: Sequence[ServiceDef],
        signals: StopSignals,
        nats_restart: RestartPolicy,
    ) -> None:
        self.options = options
        self.console = console
        self.signals = signals
        self.stack = Stack(options, console, services, signals, nats_restart, on_change=self._write_state)
        self.started_at = datetime.now(UTC)
        self.child: subprocess.Popen[bytes] | None = None
        self._child_id: ProcessId | None = None
        self.command: Sequence[str] | None = None
        self._lock: DataDirLock | None = None
        self._up = False
        #: Monotonic time each restarting part exited, to say how long it was away.
        self._exited_at: dict[str, float] = {}
        self._late: set[str] = set()
        self._registration: runtime.Registration | None = None
        self._me = ProcessId.of(os.getpid()) or ProcessId(os.getpid(), 0.0)

    # -- the whole life ------------------------------------------------------------------------

    def run(self, command: Sequence[str] | None) -> int:
        data_dir = self.stack.data_dir
        self.command = command
        self._lock = claim(data_dir)
        try:
            stop_leftovers(data_dir, self.console, self.options.stop_grace, lambda: self.signals.hurried)
            take_stop_request(data_dir)  # one left by a `down` that found no supervisor is stale
            code = 0
            try:
                self.stack.start()
                self._up = True
                self._register()
                self._banner()
                if command:
                    self.child = self._run_command(command)
                    self._child_id = ProcessId.of(self.child.pid)
                    self._write_state()
                code = self._supervise()
            finally:
                code = self._shutdown(code)
            return code
        finally:
            self._lock.release()

    def _register(self) -> None:
        """Say in this user's runtime dir that the stack runs (:mod:`trialbus.runtime`): clients in
        any directory find it there. A runtime dir that cannot be used costs only that."""
        found = self.stack.local_stack()
        try:
            self._registration = runtime.register(
                self._me.pid, str(self.stack.data_dir), self.started_at.isoformat(), asdict(found)
            )
        except OSError as exc:  # RuntimeDirError included
            self.console.print(
                f"[yellow]could not register the stack for clients in other directories ({exc}): "
                f"they find it with TRIALBUS_DATA_DIR={self.stack.data_dir}[/]"
            )

    def _banner(self) -> None:
        o = self.options
        found = self.stack.local_stack()
        broker = self.stack.broker
        nats = (
            f"NATS cluster of {len(broker.nodes)} ({broker.urls})"
            if broker and broker.clustered
            else (f"NATS {o.nats_url}")
        )
        self.console.print(
            f"[bold green]Trialbus is up[/]: {nats}, API {o.api_url}, "
            f"gateway http://{o.host}:{o.gateway_port}; logs in {self.stack.log_dir}"
        )
        if self.console.is_terminal or not found.api_token:  # the login link holds the token: never in a log
            self.console.print(f"Web UI: {escape(found.login_url)}", soft_wrap=True)
        else:
            self.console.print(
                f"Web UI: {found.webui_url} (log in with {found.webui_url}/login?token=<the token in "
                f"{self.stack.data_dir / API_TOKEN_FILE}>)",
                soft_wrap=True,
            )
        if self._registration is not None:
            self.console.print(
                f"[dim]Credentials (mode 0600) in {self.stack.data_dir} and {self._registration.path}: "
                "the CLI and the Python client find them from any directory (`trialbus status --all` "
                "lists the stacks)[/]"
            )
        else:
            self.console.print(
                f"[dim]Credentials (mode 0600) in {self.stack.data_dir}: the CLI and the Python client "
                f"find them from this directory or with TRIALBUS_DATA_DIR={self.stack.data_dir}[/]"
            )
        if not self.command:
            trials = "leaves running trials to the next `trialbus up`" if o.keep_trials else "cancels running trials"
            self.console.print(
                f"Press Ctrl-C to stop ({trials}; twice to kill at once). `trialbus status` shows each part."
            )

    def _run_command(self, command: Sequence[str]) -> subprocess.Popen[bytes]:
        """CMD in its own process group: the stop signal reaches it once, from here."""
        try:
            return subprocess.Popen(list(command), env=self.stack.client_env(), process_group=0)
        except OSError as exc:
            raise StackError(f"cannot run {command[0]}: {exc.strerror}") from None

    # -- running -------------------------------------------------------------------------------

    def _supervise(self) -> int:
        """Until a stop request or CMD's end: restart what dies. CMD's exit code, else 0."""
        while not self.signals.wait(0.25):
            if self.child is not None and self.child.poll() is not None:
                code = self.child.returncode
                return 128 - code if code < 0 else code
            now = time.monotonic()
            for part in self.stack.parts:
                if part.restart_at is not None:
                    if now >= part.restart_at:
                        self._restart(part)
                elif not part.alive():
                    self._exited(part, now)
                elif part.state == "starting":
                    self._check_started(part, now)
        return 0

    def _exited(self, part: Part, now: float, text: str | None = None) -> None:
        text = text or part.exit_text()
        part.last_exit = text
        code = part.proc.returncode if part.proc is not None else 1
        if not part.policy.restarts(code, part.restarts.count):
            self.stack.mark(part, "exited")
            raise StackError(
                f"{part.name} stopped unexpectedly ({text}) and its restart policy is '{part.policy}'; log: {part.log}",
                tail(part.log),
            )
        delay = part.restarts.exited(now)
        if delay is None:
            self.stack.mark(part, "exited")
            o = self.options
            raise StackError(
                f"{part.name} keeps dying: {o.crash_loop} exits within {o.crash_loop_window:g}s, the last with "
                f"{text}; stopped the stack. Its log: {part.log}",
                tail(part.log, 30),
            )
        part.restart_at = now + delay
        self._exited_at[part.name] = now
        self.stack.mark(part, "restarting")
        self.console.print(
            f"[yellow]{_clock()} {part.name} exited ({text}); restarting it in {delay:.1f}s[/] "
            f"[dim](restart {part.restarts.count + 1}, policy {part.policy}, log {part.log})[/]"
        )

    def _restart(self, part: Part) -> None:
        part.restarts.count += 1
        self._late.discard(part.name)
        try:
            self.stack.spawn(part, reason=part.last_exit)
        except OSError as exc:  # e.g. the program is gone: counts as one more exit
            part.proc = None
            self._exited(part, time.monotonic(), f"cannot start: {exc.strerror}")

    def _check_started(self, part: Part, now: float) -> None:
        if self.stack.ready(part):
            self.stack.mark(part, "running")
            away = now - self._exited_at.pop(part.name, part.started)
            self.console.print(
                f"[green]✓[/] {_clock()} {part.name} ready again "
                f"[dim](pid {part.process().pid}, {away:.1f}s after it exited)[/]"
            )
        elif now - part.started > self.options.start_timeout and part.name not in self._late:
            self._late.add(part.name)
            self.console.print(
                f"[yellow]{_clock()} {part.name} is not ready {self.options.start_timeout:g}s "
                f"after its restart; still waiting. Log: {part.log}[/]"
            )

    # -- stopping ------------------------------------------------------------------------------

    def _shutdown(self, code: int) -> int:
        """Stop CMD, end the running trials (a user's stop), stop every part; the exit code."""
        if self._registration is not None:  # a stopping stack is no client's to find
            self._registration.close()
        o = self.options
        deadline = time.monotonic() + o.stop_timeout
        request = take_stop_request(self.stack.data_dir)
        if self.signals.requested and not self.signals.hurried:
            self.console.print(
                f"[bold]{_clock()} stopping[/] ({escape(self._how(request))}); "
                "press Ctrl-C again to kill every part at once"
            )
        code = self._stop_command(code, deadline)
        keep = o.keep_trials or (request is not None and request.keep_trials)
        user_stop = self.signals.requested or (self.child is not None and self.child.returncode is not None)
        if self._up and user_stop and not keep and not self.signals.hurried:
            self._end_trials(request, min(deadline - 2.0, time.monotonic() + o.stop_timeout * TRIALS_SHARE))
        self.stack.stop(deadline)
        if self.signals.hurried:
            self.console.print(
                "[bold red]second signal: killed every part of the stack at once[/] (trials still "
                "running are left to the next `trialbus up`, which adopts them)"
            )
            return 128 + (self.signals.first or signal.SIGINT)
        return code

    def _how(self, request: StopRequest | None) -> str:
        if request is not None:
            return request.by
        if self.signals.first is not None:
            return HOW.get(self.signals.first, self.signals.first.name)
        if self.command:
            return f"`{shlex.join(self.command)}` ended"
        return "a part of the stack failed"

    def _stop_command(self, code: int, deadline: float) -> int:
        child = self.child
        if child is None:
            return code
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGINT if self.signals.first == signal.SIGINT else signal.SIGTERM)
            until = min(time.monotonic() + self.options.stop_grace, deadline)
            while child.poll() is None and time.monotonic() < until and not self.signals.hurried:
                self.signals.wait(0.05)
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        with contextlib.suppress(ProcessLookupError):  # what CMD left in its group goes with it
            os.killpg(child.pid, signal.SIGKILL)
        returned = child.returncode
        return 128 - returned if returned < 0 else returned

    def _end_trials(self, request: StopRequest | None, deadline: float) -> None:
        reason = f"trialbus up stopped ({self._how(request)})"
        with self.console.status("ending the running trials…"):
            found = self.stack.local_stack()
            result = end_running_trials(
                found.nats_url, (found.nats_user, found.nats_password), reason, deadline, lambda: self.signals.hurried
            )
        if result.error:
            self.console.print(
                f"[yellow]could not stop the running experiments ({escape(result.error)}); their "
                "trials run on and the next `trialbus up` adopts them[/]"
            )
        for experiment_id, trials in result.stopped.items():
            self.console.print(f"stopped experiment {experiment_id} ({trials} running trials cancelled: {reason})")
        if result.still_running:
            self.console.print(
                f"[yellow]{result.still_running} trials had not ended in time; their adapters "
                "end them, or the next `trialbus up` does[/]"
            )

    # -- the state file ------------------------------------------------------------------------

    def _command_record(self) -> PartRecord | None:
        child, identity = self.child, self._child_id
        if child is None or identity is None or child.poll() is not None:
            return None
        return PartRecord(
            name="command", pid=child.pid, started=identity.started, state="running", since=self.started_at, log=""
        )

    def _nats_ports(self) -> dict[str, int]:
        return self.stack.broker.ports if self.stack.broker is not None else {}

    def _write_state(self) -> None:
        o = self.options
        me = self._me
        record = StackRecord(
            supervisor_pid=me.pid,
            supervisor_started=me.started,
            started_at=self.started_at,
            data_dir=str(self.stack.data_dir),
            host=o.host,
            ports={**o.ports, **self._nats_ports()},
            keep_trials=o.keep_trials,
            parts=[part.record() for part in self.stack.parts],
            command=self._command_record(),
        )
        with contextlib.suppress(OSError):  # a full disk must not stop the supervision
            write_record(self.stack.data_dir, record)


def _clock() -> str:
    return datetime.now().strftime("%H:%M:%S")
