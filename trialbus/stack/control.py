"""``trialbus status`` and ``trialbus down``: a stack seen and stopped from another terminal.

Both read ``<data>/stack.json`` and the lock beside it (:mod:`.state`): a held lock means a
live supervisor, which ``down`` asks to stop (SIGTERM, after leaving its word in
``stop-request.json``) and waits for; a free lock with live recorded processes means
leftovers of a killed supervisor, which ``down`` stops itself. Processes are always checked by
pid *and* start time before anything is signalled.
"""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from trialbus.stack.errors import StackError
from trialbus.stack.options import StackOptions
from trialbus.stack.probes import health, port_open
from trialbus.stack.state import (
    STOP_REQUEST,
    DataDirLock,
    PartRecord,
    StopRequest,
    live_leftovers,
    read_record,
    stop_leftovers,
)


@dataclass(frozen=True)
class PartStatus:
    name: str
    pid: int | None
    state: str
    #: Seconds since it entered ``state`` (its uptime while running).
    for_seconds: float
    restarts: int
    #: ``ok``, ``unavailable (…)``, ``not answering``, or ``-`` when not running.
    health: str
    last_exit: str | None
    log: str


@dataclass(frozen=True)
class StackStatus:
    data_dir: str
    #: ``running`` (its supervisor is alive), ``leftovers`` (the supervisor is gone, parts are not), ``stopped``.
    state: str
    supervisor_pid: int
    started_at: str
    ports: dict[str, int]
    parts: list[PartStatus] = field(default_factory=list)

    def as_json(self) -> dict:
        return asdict(self)


def stack_status(data_dir: Path, probe: bool = True) -> StackStatus | None:
    """What runs on ``data_dir``, each part probed for health (``probe``); None if no stack ever ran there."""
    record = read_record(data_dir)
    if record is None:
        return None
    supervised = DataDirLock(data_dir).held_elsewhere() and record.supervisor().alive()
    left = {part.name for part, _ in live_leftovers(record)}
    state = "running" if supervised else "leftovers" if left else "stopped"
    now = datetime.now(UTC)
    parts = []
    for part in [*record.parts, *([record.command] if record.command else [])]:
        live = supervised and part.pid is not None or part.name in left
        shown = part.state if supervised else ("running" if live else "exited")
        health = _health(record.host, part) if live and probe else "-"
        parts.append(
            PartStatus(
                part.name,
                part.pid if live else None,
                shown,
                (now - part.since).total_seconds(),
                part.restarts,
                health,
                part.last_exit,
                part.log,
            )
        )
    return StackStatus(str(data_dir), state, record.supervisor_pid, record.started_at.isoformat(), record.ports, parts)


def _health(host: str, part: PartRecord) -> str:
    if part.port is not None:
        return "ok" if port_open(host, part.port, timeout=0.5) else "not answering"
    return health(part.health) if part.health is not None else "-"


def down(data_dir: Path, console: Console, keep_trials: bool = False, timeout: float = 40.0) -> str:
    """Stop the stack on ``data_dir``; what was done, in words. :class:`StackError` if it would not stop."""
    lock = DataDirLock(data_dir)
    record = read_record(data_dir)
    if lock.held_elsewhere():
        supervisor = record.supervisor() if record is not None else None
        if supervisor is None or not supervisor.alive():
            raise StackError(
                f"a process holds {lock.path} but is not the `trialbus up` recorded in "
                f"{data_dir / 'stack.json'}; stop it by hand"
            )
        (data_dir / STOP_REQUEST).write_text(StopRequest(keep_trials=keep_trials).model_dump_json())
        began = time.monotonic()
        supervisor.signal(signal.SIGTERM)
        with console.status(f"stopping the stack on {data_dir} (`trialbus up`, pid {supervisor.pid})…"):
            if not _released(lock, began + timeout):
                supervisor.signal(signal.SIGTERM)  # its second signal: kill every part at once
                if not _released(lock, time.monotonic() + 10):
                    raise StackError(f"`trialbus up` (pid {supervisor.pid}) did not stop within {timeout + 10:g}s")
                return f"killed the stack on {data_dir}: it did not stop in order within {timeout:g}s"
        trials = "running trials left running" if keep_trials else "running trials ended"
        return f"stopped the stack on {data_dir} in {time.monotonic() - began:.1f}s ({trials})"
    if record is None or not lock.acquire():
        return f"no stack is running on {data_dir}"
    try:
        stopped = stop_leftovers(data_dir, console, grace=StackOptions().stop_grace)
    finally:
        lock.release()
    if not stopped:
        return f"no stack is running on {data_dir}"
    return f"stopped what a killed `trialbus up` left on {data_dir}: {', '.join(stopped)}"


def _released(lock: DataDirLock, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not lock.held_elsewhere():
            return True
        time.sleep(0.1)
    return False
