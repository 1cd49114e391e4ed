"""Where every ``trialbus up`` of this user says it runs, so that a client in any directory finds it.

As Jupyter's runtime dir (``jupyter server list`` finds servers from anywhere), each running
``trialbus up`` keeps one file, ``stack-<pid>.json``, in a per-user directory: its pid, data dir,
start time and what a client needs (:class:`trialbus.local.LocalStack`: NATS URL(s), API and web
UI URLs, the ``client`` user's password, the API token). The directory is
``$XDG_RUNTIME_DIR/trialbus`` where that is set and this user's, else
``$XDG_DATA_HOME/trialbus/runtime`` (``~/.local/share/trialbus/runtime``, Jupyter's layout).

Guarantees:

- The directory is mode 0700 and owned by this user (one that is not is never read nor
  written), each file 0600 from its creation: the credentials in it are this user's only.
- A file names a live stack only while its ``trialbus up`` holds an exclusive ``flock`` on it,
  taken before the file appears under its name and released by the kernel when that process
  ends in any way (SIGKILL included). A reader that can take the lock has found a stale entry
  (its stack is gone, whatever process its pid names now): it ignores and deletes it. No pid
  is trusted alone, so a reused pid never passes for a stack.
- ``trialbus up`` removes its file on a clean stop.

Standard library only: every ``trialbus`` command may read it, and must start fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "stack-"


class RuntimeDirError(OSError):
    """The runtime dir cannot be used safely (another user's, or not a directory)."""


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/trialbus`` where that is set and belongs to this user, else
    ``$XDG_DATA_HOME/trialbus/runtime`` (``~/.local/share/trialbus/runtime``);
    :class:`RuntimeDirError` when there is no home to put it in."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        with contextlib.suppress(OSError):
            if os.stat(xdg).st_uid == os.getuid():  # `su` keeps another user's XDG_RUNTIME_DIR
                return Path(xdg) / "trialbus"
    data = os.environ.get("XDG_DATA_HOME")
    try:
        base = Path(data) if data and os.path.isabs(data) else Path.home() / ".local" / "share"
    except RuntimeError:  # no HOME, and no passwd entry to find one
        raise RuntimeDirError("no runtime dir: set XDG_RUNTIME_DIR (or HOME)") from None
    return base / "trialbus" / "runtime"


@dataclass(frozen=True)
class Entry:
    """One running ``trialbus up`` as its file says."""

    path: Path
    pid: int
    data_dir: str
    #: ISO 8601, UTC.
    started_at: str
    #: :class:`trialbus.local.LocalStack`'s fields.
    client: dict[str, Any]


class Registration:
    """This process's entry: holds its lock until :meth:`close`, which removes it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def close(self) -> None:
        """Remove the entry (if it is still ours) and release its lock. Safe to call twice."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                self.path.unlink()
        os.close(self._fd)
        self._fd = None


def register(pid: int, data_dir: str, started_at: str, client: dict[str, Any]) -> Registration:
    """Publish this process's entry, locked before it appears; :class:`OSError` if the runtime
    dir cannot be made or used (the stack still runs, only unseen from other directories)."""
    directory = _own_dir(create=True)
    running(directory)  # tidy: what killed stacks left
    path = directory / f"{PREFIX}{pid}.json"
    tmp = directory / f".{path.name}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        body = {"pid": pid, "data_dir": data_dir, "started_at": started_at, "client": client}
        os.write(fd, json.dumps(body, indent=1).encode())
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return Registration(path, fd)


def running(directory: Path | None = None) -> list[Entry]:
    """The live stacks of this user, oldest first; stale entries are deleted on the way."""
    try:
        directory = directory or _own_dir(create=False)
        names = sorted(p for p in os.listdir(directory) if p.startswith(PREFIX) and p.endswith(".json"))
    except OSError:
        return []
    found = [entry for name in names if (entry := _read(directory / name)) is not None]
    return sorted(found, key=lambda e: e.started_at)


def _read(path: Path) -> Entry | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: its `trialbus up` runs
            with os.fdopen(os.dup(fd), "rb") as f:
                body = json.loads(f.read())
            return Entry(path, int(body["pid"]), str(body["data_dir"]), str(body["started_at"]), dict(body["client"]))
        with contextlib.suppress(OSError):  # free: its stack is gone (unless a new one took the name)
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def _own_dir(create: bool) -> Path:
    """The runtime dir, checked: a directory of this user's, mode 0700 (made so, or made)."""
    path = runtime_dir()
    if create:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = os.stat(path, follow_symlinks=False)
    if not os.path.isdir(path) or os.path.islink(path) or info.st_uid != os.getuid():
        raise RuntimeDirError(f"{path} is not a directory of this user's")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path
