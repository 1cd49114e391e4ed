"""Processes by identity, not by pid: a pid is reused once its process is gone, so the stack
records each process's start time with it and never signals a pid whose start time differs.
Also: who holds a port, for an error a person can act on."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

#: Start times are read from /proc in clock ticks; the same process reads the same value.
_SAME_START = 0.05


@dataclass(frozen=True)
class ProcessId:
    """A process as the stack recorded it: its pid and when it started (seconds since the epoch)."""

    pid: int
    started: float

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The identity of a live process; None once it is gone."""
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        except psutil.AccessDenied:  # another user's process: its pid alone names it
            return cls(pid, 0.0)

    def alive(self) -> bool:
        """Whether the process that was recorded still runs (not a new one under its pid)."""
        try:
            process = psutil.Process(self.pid)
            return abs(process.create_time() - self.started) < _SAME_START and process.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return False

    def signal(self, signum: int, group: bool = False) -> bool:
        """Send ``signum`` (to its whole process group with ``group``) if it is still the same
        process; whether it was sent. A part of the stack leads its own group (its own session)."""
        if not self.alive():
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group and os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)
            return True
        return False

    def kill(self) -> bool:
        return self.signal(signal.SIGKILL, group=True)


def terminate(processes: Sequence[ProcessId], grace: float, hurried: Callable[[], bool] = lambda: False) -> None:
    """SIGTERM each, wait up to ``grace`` seconds for all (less once ``hurried()``), then SIGKILL
    the process groups still there and wait until the kernel has them gone."""
    for process in processes:
        if not hurried():
            process.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.alive() for p in processes) and time.monotonic() < deadline and not hurried():
        time.sleep(0.05)
    for process in processes:
        process.kill()
    until = time.monotonic() + 5  # SIGKILL is not instant
    while any(p.alive() for p in processes) and time.monotonic() < until:
        time.sleep(0.02)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


#: The ports :func:`free_port` gave lately, most recent last.
_GIVEN: deque[int] = deque(maxlen=256)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's choice), and none of the last 256 this process was given:
    ports taken in a row for several servers, before any of them listens, are distinct (the kernel may offer a
    port again once its probe socket is closed; a dispatcher and a gateway once got the same one)."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            break
    _GIVEN.append(port)
    return port


def port_holder(port: int) -> psutil.Process | None:
    """The process listening on ``port`` (any address), where the system lets us see it."""
    try:
        connections = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            with contextlib.suppress(psutil.Error):
                return psutil.Process(conn.pid)
    return None


def stack_of(process: psutil.Process) -> str | None:
    """The data dir of the Trialbus stack ``process`` belongs to, where it shows: a nats-server's
    ``-sd <data>/nats``, or a service's ``TRIALBUS_DATA_DIR``."""
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        if "-sd" in argv[:-1] and "nats-server" in process.name():
            store = argv[argv.index("-sd") + 1]
            return store.removesuffix("/nats") if store.endswith("/nats") else None
        return process.environ().get("TRIALBUS_DATA_DIR")
    return None


def describe(process: psutil.Process, width: int = 120) -> str:
    """``name (pid N: command line)``, shortened to ``width`` characters of command line."""
    try:
        command = " ".join(process.cmdline()) or process.name()
        name = process.name()
    except psutil.Error:
        return f"pid {process.pid}"
    if len(command) > width:
        command = command[: width - 1] + "…"
    return f"{name} (pid {process.pid}: {command})"
