"""The stack's state file and lock under its data dir, and the leftovers of a killed supervisor.

``<data>/stack.lock`` is held (``flock``) by the live ``trialbus up`` for its whole life; the
kernel releases it when that process ends in any way, SIGKILL included. ``<data>/stack.json``
records what it started: each part's pid and start time, state, restarts and health URL, the
ports and the data dir. A later ``up``, ``down`` or ``status`` reads it: a free lock with live
processes in the file means the supervisor is gone and those processes are leftovers, which
are stopped only after checking each is still the process that was started (a pid reused by
another program is never signalled).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console

from trialbus.stack.errors import StackError
from trialbus.stack.processes import ProcessId, terminate

STATE_FILE = "stack.json"
LOCK_FILE = "stack.lock"
#: Written by ``trialbus down`` before it signals the supervisor: who asked, and for what.
STOP_REQUEST = "stop-request.json"

PartState = Literal["starting", "running", "restarting", "stopping", "exited"]


class PartRecord(BaseModel):
    """One process of the stack, as the supervisor last saw it."""

    model_config = ConfigDict(frozen=True)

    name: str
    #: None while it waits to be started again.
    pid: int | None = None
    #: The process's start time (seconds since the epoch), with ``pid`` its identity.
    started: float | None = None
    state: PartState = "starting"
    #: When it entered ``state``.
    since: datetime
    #: Restarts by the supervisor so far.
    restarts: int = 0
    #: ``/healthz`` URL, or None.
    health: str | None = None
    #: A TCP port that answers once it is ready (nats-server), or None.
    port: int | None = None
    #: How it last ended, e.g. ``killed by SIGKILL``.
    last_exit: str | None = None
    log: str

    def process(self) -> ProcessId | None:
        return ProcessId(self.pid, self.started) if self.pid is not None and self.started is not None else None


class StackRecord(BaseModel):
    """What ``trialbus up`` started, in ``<data>/stack.json``."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["trialbus-stack"] = "trialbus-stack"
    v: Literal[1] = 1
    supervisor_pid: int
    supervisor_started: float
    started_at: datetime
    data_dir: str
    host: str
    #: ``nats``, ``api``, ``gateway``, ``webui``; ``nats-2``… the client ports of a cluster's other nodes.
    ports: dict[str, int]
    keep_trials: bool = False
    #: In start order.
    parts: list[PartRecord]
    #: ``up -- CMD``'s command while it runs (name ``command``), stopped first with the leftovers.
    command: PartRecord | None = None

    def supervisor(self) -> ProcessId:
        return ProcessId(self.supervisor_pid, self.supervisor_started)


class StopRequest(BaseModel):
    """``trialbus down``'s word to the supervisor it signals."""

    by: str = "`trialbus down`"
    keep_trials: bool = False


def take_stop_request(data_dir: Path) -> StopRequest | None:
    """The request ``trialbus down`` left, removed as it is read; None if there is none."""
    path = data_dir / STOP_REQUEST
    try:
        request = StopRequest.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        request = None
    path.unlink(missing_ok=True)
    return request


def read_record(data_dir: Path) -> StackRecord | None:
    """The recorded stack; None when there is none or it cannot be read."""
    try:
        return StackRecord.model_validate_json((data_dir / STATE_FILE).read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def write_record(data_dir: Path, record: StackRecord) -> None:
    """Replace the file at once (write aside, then rename): a reader never sees half of it."""
    path = data_dir / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}")
    tmp.write_text(record.model_dump_json(indent=1))
    tmp.replace(path)


class DataDirLock:
    """``<data>/stack.lock``, held by the one live supervisor of a data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take it without waiting; whether it was free. Not inherited by child processes."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None

    def held_elsewhere(self) -> bool:
        """Whether a live supervisor holds it (checked by taking and releasing it)."""
        if not self.path.exists():
            return False
        if self.acquire():
            self.release()
            return False
        return True


def claim(data_dir: Path) -> DataDirLock:
    """The lock of ``data_dir`` for a new supervisor, or :class:`StackError` naming the one that runs."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(data_dir)
    if lock.acquire():
        return lock
    record = read_record(data_dir)
    who = (
        f"`trialbus up` (pid {record.supervisor_pid}, since {record.started_at:%Y-%m-%d %H:%M:%S})"
        if record
        else (f"another `trialbus up` (it holds {lock.path})")
    )
    raise StackError(
        f"a stack already runs on {data_dir}: {who}. Stop it with `trialbus down --data-dir {data_dir}`, "
        f"see it with `trialbus status --data-dir {data_dir}`, or use another --data-dir"
    )


def live_leftovers(record: StackRecord) -> list[tuple[PartRecord, ProcessId]]:
    """The recorded parts whose very process still runs, in start order."""
    found = []
    for part in [*([record.command] if record.command else []), *record.parts]:
        process = part.process()
        if process is not None and process.alive():
            found.append((part, process))
    return found


def stop_leftovers(
    data_dir: Path, console: Console, grace: float, hurried: Callable[[], bool] = lambda: False
) -> list[str]:
    """Stop what a supervisor that is gone left running on ``data_dir`` (the caller holds the
    lock): ``up -- CMD``'s command, then every service at once, then the nats-servers, each
    SIGTERM then SIGKILL of its group after ``grace`` seconds. Trials are not touched: the next
    stack's adapters adopt them. The names of the parts stopped."""
    record = read_record(data_dir)
    if record is None:
        return []
    left = live_leftovers(record)
    if not left:
        return []
    names = ", ".join(f"{part.name} (pid {process.pid})" for part, process in left)
    console.print(
        f"[yellow]found a stack left running on {data_dir} by `trialbus up` (pid {record.supervisor_pid}), "
        f"which is gone: stopping {names}[/]"
    )
    commands = [(p, proc) for p, proc in left if p is record.command]
    services = [(p, proc) for p, proc in left if p.port is None and p is not record.command]
    brokers = [(p, proc) for p, proc in left if p.port is not None]
    for tier in (commands, services, brokers):
        terminate([process for _, process in tier], grace, hurried)
    for part, process in left:
        console.print(f"[dim]stopped leftover {part.name} (pid {process.pid})[/]")
    return [part.name for part, _ in left]
