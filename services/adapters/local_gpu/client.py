"""Everything the local-gpu adapter does to the operating system, in one module.

The adapter's "platform" is this host: a trial is a trial keeper process (docs/internals.md
§1) that the adapter spawns and watches. This module is the only one that spawns, signals
or waits for processes, reads the keeper's state files, and unpacks code snapshots.

Speed matters here: a no-op trial costs the keeper's ~12 ms start, so every millisecond
the adapter adds per trial is visible in throughput on a small machine. Hence
``os.posix_spawn`` (vfork-based, no Python between fork and exec) instead of
``subprocess`` or asyncio's subprocess transport, and a pidfd in the event loop instead of
a child watcher thread: the loop hears of a keeper's exit the moment it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

from services.adapters import trialdir
from services.adapters.trialdir import KEEPER_OUT, STATE


def compile_keeper(python: str, source: str, dest: Path) -> str:
    """Byte-compile the keeper once, with the interpreter that will run it; the path to start.

    A script run as ``python file.py`` is compiled on every start (about 7 ms of CPU per
    trial on a 2-core machine); a ``.pyc`` run directly is not. Falls back to the source
    when compiling fails (an interpreter that cannot write ``dest``, say).
    """
    import subprocess

    code = "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"
    try:
        subprocess.run([python, "-S", "-I", "-c", code, source, str(dest)], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return source
    return str(dest)


#: Descriptors the adapter needs beside one pidfd per running keeper: NATS, HTTP, state files,
#: code downloads, the zygote's and the warm templates' pipes.
FD_HEADROOM = 512


def raise_fd_limit(trials: int) -> tuple[int, int, bool]:
    """Raise the soft ``RLIMIT_NOFILE`` to what ``trials`` running keepers need (a pidfd each,
    plus :data:`FD_HEADROOM`), as far as the hard limit allows; never lowers it. ``(soft before,
    soft now, whether that is enough)``. A common soft default is 1,024: about 1,000 trials
    would exhaust it."""
    import resource

    unlimited = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = trials + FD_HEADROOM
    if soft == unlimited or soft >= needed:
        return soft, soft, True
    target = needed if hard == unlimited else min(needed, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, max(soft, target), target >= needed


def spawn_keeper(python: str, keeper: str, env: Mapping[str, str], trial_dir: str) -> int:
    """Start ``python -S -I keeper`` in its own session; return its pid.

    stdin is /dev/null; stdout and stderr go to ``.trialbus/keeper.out`` (the keeper's
    own crashes). ``<trial dir>/.trialbus`` must exist. A restarted adapter finds the
    keeper through ``keeperPid`` in ``state.json``, which the keeper writes at once.
    """
    return os.posix_spawn(
        python,
        [python, "-S", "-I", keeper],
        env,
        setsid=True,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, f"{trial_dir}/{KEEPER_OUT}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
    )


class KeeperZygote:
    """A pre-started keeper that forks one keeper per trial (``trial_keeper --zygote``).

    Starting a Python interpreter costs about 13 ms of CPU on a 2-core machine; a fork of
    one that is already running costs about 1 ms. The forked keeper is the same program
    with the same environment, files and session as one started with :func:`spawn_keeper`,
    so watching, cancelling and adopting it are unchanged. The zygote exits when its
    adapter does (EOF on its stdin); keepers it forked run on.
    """

    def __init__(self, python: str, keeper: str, log: Path, env: Mapping[str, str]) -> None:
        """``env``: the zygote's own environment, which its keepers keep (never the adapter's secrets)."""
        self.python, self.keeper, self.log, self.env = python, keeper, log, env
        self.pid = 0
        self._to = self._from = -1

    def start(self) -> None:
        to_r, self._to = os.pipe()
        self._from, from_w = os.pipe()
        os.set_inheritable(to_r, True)
        os.set_inheritable(from_w, True)
        try:
            self.pid = os.posix_spawn(
                self.python,
                [self.python, "-S", "-I", self.keeper, "--zygote"],
                self.env,
                setsid=True,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, to_r, 0),
                    (os.POSIX_SPAWN_DUP2, from_w, 1),
                    (os.POSIX_SPAWN_OPEN, 2, str(self.log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
                ],
            )
        finally:
            os.close(to_r)
            os.close(from_w)

    def spawn(self, env: Mapping[str, str]) -> int:
        """Fork a keeper with ``env``; its pid. Restarts a zygote that died, once."""
        payload = b"\0".join(f"{k}={v}".encode("utf-8", "surrogateescape") for k, v in env.items())
        request = b"%08d" % len(payload) + payload
        for attempt in (1, 2):
            try:
                os.write(self._to, request)
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = os.read(self._from, 32)
                    if not chunk:
                        raise BrokenPipeError("the keeper zygote closed its output")
                    answer += chunk
                return int(answer)
            except OSError:
                if attempt == 2:
                    raise
                self.close()
                self.start()
        raise AssertionError("unreachable")

    def close(self) -> None:
        for fd in (self._to, self._from):
            if fd >= 0:
                os.close(fd)
        self._to = self._from = -1
        if self.pid:
            with contextlib.suppress(ChildProcessError):  # it exits at EOF; reap it
                os.waitpid(self.pid, 0)
            self.pid = 0


class Keeper:
    """A keeper process the adapter watches: our child, or one adopted after a restart.

    ``watch`` registers a pidfd with the event loop, so ``on_exit`` runs as soon as the
    process ends. Signals go through the pidfd, which cannot hit a recycled pid.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd: int | None = None
        self.alive = True
        #: The keeper's own exit status (``waitstatus_to_exitcode``), when it was our child.
        self.status: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def adopt(cls, pid: int, uid: int | None = None) -> Keeper | None:
        """The running keeper with this pid, or None when the pid is gone or reused. ``uid``: the
        user trials run as, when not ours (the pid comes from a ``state.json`` the trial can write:
        a process of any other user is no keeper of ours)."""
        keeper = cls(pid)
        try:
            keeper.pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except (OSError, AttributeError):  # no pidfd (Linux < 5.3): fall back to liveness checks
            keeper.pidfd = None
        if not is_keeper(pid) or uid is not None and real_uid(pid) != uid:  # after pidfd_open: it pins the process
            keeper.close()
            keeper._exited()  # a zombie of ours (same process, earlier adapter): reap it
            return None
        return keeper

    def watch(self, on_exit: Callable[[], None]) -> None:
        if self.pidfd is None:
            try:
                self.pidfd = os.pidfd_open(self.pid)
            except ProcessLookupError:  # it exited already
                self._exited()
                on_exit()
                return
            except (OSError, AttributeError):
                return  # no pidfd support: poll() checks liveness instead
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.pidfd, self._on_readable, on_exit)

    def _on_readable(self, on_exit: Callable[[], None]) -> None:
        self._exited()
        on_exit()

    def _exited(self) -> None:
        self.alive = False
        try:  # reap it if it is our child; an adopted one is reaped by its parent (init)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        self.close()

    def check(self) -> bool:
        """Liveness without a pidfd (old kernels)."""
        if self.alive and self.pidfd is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.alive, self.status = False, os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.alive = is_keeper(self.pid)
        return self.alive

    def signal(self, signum: int) -> None:
        """Send ``signum``; a keeper that is already gone is not an error."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            elif self.alive:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Stop watching (the process is left alone)."""
        if self.pidfd is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd, self._loop = None, None


def is_keeper(pid: int) -> bool:
    """True when ``pid`` is a live trial keeper (not a recycled pid, not a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"trial_keeper" in f.read()
    except OSError:
        return False


def kill_group(pgid: int, signum: int, uid: int | None = None) -> None:
    """Signal the process group ``pgid`` (a trial's, as its ``state.json`` says). ``uid``: only its
    processes of that user — a trial running as another user writes its ``state.json`` itself,
    and must not have the adapter signal someone else's group (O(processes): a rare path)."""
    if uid is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or reused by someone else's
            os.killpg(pgid, signum)
        return
    for pid in group_members(pgid, uid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def group_members(pgid: int, uid: int) -> list[int]:
    """The processes of group ``pgid`` whose real user is ``uid`` (from ``/proc``)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[2]) != pgid:
                    continue
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if real_uid(int(name)) == uid:
            found.append(int(name))
    return found


def real_uid(pid: int) -> int | None:
    """The real user of process ``pid`` (from ``/proc``); None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return int(next(line for line in f if line.startswith(b"Uid:")).split()[1])
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def read_state(trial_dir: str) -> dict:
    """``state.json`` as written by the keeper; ``{}`` before the keeper wrote it. Read without
    following a link the trial may have put there (:func:`~services.adapters.trialdir.read_in`)."""
    data = trialdir.read_in(trial_dir, STATE)
    try:
        return json.loads(data) if data else {}
    except ValueError:  # a writer without atomic rename
        return {}


def record_early_death(trial_dir: str, pid: int, status: int | None) -> None:
    """Write ``state.json`` for a keeper that died before writing it (e.g. canceled while
    starting), so that a restarted adapter need not wait to learn that it is gone. Written
    without following a link (:func:`~services.adapters.trialdir.open_in`)."""
    folder = os.open(f"{trial_dir}/{trialdir.META}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        tmp, name = os.path.basename(STATE) + ".adapter", os.path.basename(STATE)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
        with os.fdopen(fd, "w") as f:
            json.dump({"keeperPid": pid, "keeperExit": status}, f)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)


def keeper_born(trial_dir: str) -> bool:
    """Whether a keeper was ever started in ``trial_dir``: its ``keeper.out`` is opened by the
    spawn (or by the fork, from the zygote) before the keeper runs a line of its own."""
    return os.path.exists(f"{trial_dir}/{KEEPER_OUT}") or os.path.exists(f"{trial_dir}/{STATE}")


def tail(trial_dir: str, name: str, max_bytes: int) -> str | None:
    """The last ``max_bytes`` of the trial's file ``name`` as text; None when it does not exist (or
    is a link: :func:`~services.adapters.trialdir.read_in`)."""
    data = trialdir.read_in(trial_dir, name, max_bytes)
    return None if data is None else data.decode("utf-8", "replace")
