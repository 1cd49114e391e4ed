"""The warm templates of one host: which trial forks from which template, and when a template is
started, replaced or retired (``trial_template.py`` is the process itself).

Used by every adapter that starts keepers on a host it controls (local-gpu in its own process,
the remote agent on each machine, shipped there beside it); stdlib only (Python ≥ 3.9),
synchronous and never blocking for long, so an event loop can call it. A template is kept per
*key*: the trial's interpreter and options, its code directory (a snapshot named by the hash of
its content), its environment without what differs per trial or per experiment
(``trial_template.PER_TRIAL``), and the user it runs as (``TRIALBUS_RUN_AS``, set by a caller
running as root: a template runs as that user, and only that user's trials fork from it). So
experiments of the same code, interpreter, environment and user share their templates, and what
the first learned: a second one forks from the first's templates at once, while they live
(``idle`` seconds unused; at most ``max_templates``). The first trial of a key starts a bare
template (the modules asked for in ``warmStart.preload``, and the ``nni`` shim) and, beside it,
a fuller one with what the script's source imports, swapped in once ready; each warm trial
lists, at its exit, what it imported beyond its template (``.trialbus/imports``), and when that
adds modules the ready template imports them in place (:meth:`Template.add`). A module whose
import touches a GPU is never preloaded again for that key. A template that dies, or fails to
answer, costs nothing but a log line: the trial starts cold (the caller's fallback).

Complexity: per trial O(1) in the number of trials and templates (dict lookups); learning is
O(modules listed). At most ``max_templates`` templates live; the least recently used goes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO

try:
    from services.trial_keeper import trial_keeper, trial_template
    from services.trial_keeper.script_imports import script_imports
except ImportError:  # on a remote machine, shipped flat beside the agent (mypy checks the imports above)
    import trial_keeper  # type: ignore[import-not-found, no-redef]
    import trial_template  # type: ignore[import-not-found, no-redef]
    from script_imports import script_imports  # type: ignore[import-not-found, no-redef]

TEMPLATE_PATH = Path(trial_template.__file__)
#: Keeper settings that differ per trial: left out of the environment that keys a template.
_PER_TRIAL = frozenset(
    (
        "TRIALBUS_TRIAL_DIR",
        "TRIALBUS_TRIAL_ID",
        "TRIALBUS_SEQUENCE_ID",
        "TRIALBUS_ATTEMPT",
        "TRIALBUS_PARAMETERS",
        "TRIALBUS_TRIAL_TOKEN",
        "TRIALBUS_GPUS",
        "TRIALBUS_CHECKPOINT_DIR",
        "TRIALBUS_ASK_TOKEN",
        "TRIALBUS_ASK_OWNER",
    )
)
ANSWER_TIMEOUT = 5.0  # seconds a ready template may take to answer a fork
#: Top-level packages of the standard library (Python 3.10+; on older ones, none is known).
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
KEYS_KEPT = 256  # (command, environment) → key found; forgotten all at once past this many,
KEYS_FOR = 10.0  # and every this many seconds (the interpreter a PATH finds may change)
PROGRESS_EVERY = 0.1  # seconds between two reads of a starting template's CPU (Template.stalled)


def read_own(trial_dir: str, folder: str, name: str) -> bytes:
    """``<trial_dir>/<folder>/<name>``, written by a trial that may run as another user: read without
    following a link it may have put there, and only a regular file of its own; b"" when it is not."""
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        inner = os.open(f"{trial_dir}/{folder}", os.O_RDONLY | os.O_DIRECTORY | nofollow)
        try:
            fd = os.open(name, os.O_RDONLY | nofollow, dir_fd=inner)
        finally:
            os.close(inner)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as file:
        found = os.fstat(fd)
        return file.read(1 << 20) if stat.S_ISREG(found.st_mode) and found.st_nlink == 1 else b""


def user_of(run_as: str | None) -> tuple[int, int, tuple[int, ...]] | None:
    """``(uid, gid, groups)`` of a ``TRIALBUS_RUN_AS`` (``uid:gid:group,…``); None: the caller's own."""
    if not run_as:
        return None
    uid, gid, groups = run_as.split(":")
    if int(uid) == os.geteuid():
        return None  # (switching to itself: nothing to do; not root, it could not set groups)
    return int(uid), int(gid), tuple(int(g) for g in groups.split(",") if g)


class Template:
    """One template process and its pipes."""

    def __init__(
        self,
        key: str,
        plan: dict,
        env: dict[bytes, bytes],
        code_dir: str,
        preload: list[str],
        folder: Path,
        reuse: bool = False,
        user: tuple[int, int, tuple[int, ...]] | None = None,
    ) -> None:
        self.key, self.plan, self.env, self.code_dir, self.preload = key, plan, env, code_dir, preload
        self.reuse = reuse  # its keepers outlive their trial, and it forks their trials (kept.Kept)
        self.user = user  # (uid, gid, groups) it runs as; None: ours
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None
        self.state = "new"  # new → starting → ready → closed, or dead (unsafe / failed)
        self.unsafe: str | None = None  # the module whose import touched a GPU
        self.used = time.monotonic()
        self.started_at = 0.0
        self.was_ready = False
        self._answer = b""
        self._cpu, self._progress_at, self._progress_read = -1, 0.0, 0.0  # for stalled()

    @property
    def stdin(self) -> IO[bytes]:
        """The template's input (fork and import requests); it has one once started."""
        assert self.process is not None and self.process.stdin is not None, "the template is not started"
        return self.process.stdin

    @property
    def stdout(self) -> IO[bytes]:
        """The template's output (its answers); it has one once started."""
        assert self.process is not None and self.process.stdout is not None, "the template is not started"
        return self.process.stdout

    def start(self, template_path: Path, keeper_path: str, shim: str | None) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        # The template binds every symbol of its libraries as it starts (glibc's dynamic linker
        # binds each on its first call otherwise): a child's first call of a function would write
        # the binding into a page it then copies, ~60 page copies a trial. The template drops the
        # variable from its environment at once (``unset``): trials and their children never see it.
        env, unset = self.env, []
        if b"LD_BIND_NOW" not in env:
            env, unset = {**env, b"LD_BIND_NOW": b"1"}, ["LD_BIND_NOW"]
        spec = self.folder / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "python": self.plan["python"],
                    "flags": self.plan["flags"],
                    "preload": self.preload,
                    "code_dir": self.code_dir,
                    "shim": shim,
                    "unset": unset,
                    "reuse": self.reuse,
                }
            )
        )
        uid = gid = groups = None
        if self.user is not None:  # it runs the trial's code: as the trial's user, who reads its spec
            uid, gid, groups = self.user[0], self.user[1], list(self.user[2])
            self.folder.chmod(0o755)
            spec.chmod(0o644)
        with open(self.folder / "template.log", "ab") as log:
            self.process = subprocess.Popen(
                [self.plan["python"], *self.plan["flags"], str(template_path), keeper_path, str(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=self.code_dir,
                env=env,
                start_new_session=True,
                user=uid,
                group=gid,
                extra_groups=groups,
            )
        os.set_blocking(self.stdout.fileno(), False)
        self.state, self.started_at = "starting", time.monotonic()
        self._progress_at = self.started_at

    def poll(self) -> str:
        """Advance ``state`` without blocking: read the ready line once it is there."""
        if self.state == "starting":
            try:
                chunk = os.read(self.stdout.fileno(), 4096)
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                self._died()
            elif chunk:
                self._answer += chunk
                if self._answer.endswith(b"\n"):
                    self._ready(self._answer.decode("utf-8", "replace").split())
        elif self.state == "ready" and self.process is not None and self.process.poll() is not None:
            self.state = "dead"
        return self.state

    def _ready(self, words: list[str]) -> None:
        if words[:1] == ["ready"]:
            os.set_blocking(self.stdout.fileno(), True)
            self.state, self.was_ready = "ready", True
        else:
            self.unsafe = words[1] if words[:1] == ["unsafe"] and len(words) > 1 else None
            self._died()

    def _died(self) -> None:
        self.state = "dead"
        self.close()

    def add(self, names: list[str]) -> None:
        """Have this ready template import ``names`` too, in place (``trial_template.import_more``):
        it is ``starting`` again until it answers, as at its start, and is then ready with them,
        or dead (an import touched a GPU: ``unsafe``). No fork meanwhile."""
        payload = trial_template.MORE + "\0".join(names).encode("utf-8", "surrogateescape")
        try:
            os.write(self.stdin.fileno(), b"%08d" % len(payload) + payload)
        except OSError:
            self._died()
            return
        self.preload = [*self.preload, *names]
        os.set_blocking(self.stdout.fileno(), False)
        self._answer, self.state = b"", "starting"
        self._cpu, self._progress_at = -1, time.monotonic()

    def stalled(self, stall: float) -> bool:
        """Whether this starting template used no CPU in the last ``stall`` seconds (an import that
        hangs: waiting for it gains nothing). One that imports is waited for however busy the
        host, since a trial that gave up would import the same modules beside it. Reads
        ``/proc/<pid>/stat`` at most every ``PROGRESS_EVERY`` seconds; without ``/proc`` never
        stalled (the caller's deadline bounds the wait)."""
        now = time.monotonic()
        if now - self._progress_read < PROGRESS_EVERY:
            return now - self._progress_at > stall
        self._progress_read = now
        if self.process is None:  # not started: nothing to read
            return False
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            cpu = int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        except (OSError, IndexError, ValueError, AttributeError):
            return False
        if cpu != self._cpu:
            self._cpu, self._progress_at = cpu, now
        return now - self._progress_at > stall

    def wait_ready(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for the template to be ready (for callers without a loop)."""
        deadline = time.monotonic() + timeout
        while self.poll() == "starting" and (left := deadline - time.monotonic()) > 0:
            select.select([self.stdout], [], [], min(left, 0.05))
        return self.state == "ready"

    def fork(self, environ: Mapping[str, str]) -> int:
        """A keeper forked for ``environ``; its pid. OSError when the template cannot answer."""
        if self.state != "ready":
            raise OSError(f"the template is {self.state}")
        payload = b"\0".join(f"{k}={v}".encode("utf-8", "surrogateescape") for k, v in environ.items())
        try:
            os.write(self.stdin.fileno(), b"%08d" % len(payload) + payload)
            answer = b""
            while not answer.endswith(b"\n"):
                if not select.select([self.stdout], [], [], ANSWER_TIMEOUT)[0]:
                    raise TimeoutError(f"no answer from the template in {ANSWER_TIMEOUT:.0f} s")
                chunk = os.read(self.stdout.fileno(), 64)
                if not chunk:
                    raise BrokenPipeError("the template closed its output")
                answer += chunk
        except OSError:
            self._died()
            raise
        if not answer[:1].isdigit():
            raise OSError(answer.decode("utf-8", "replace").strip())
        self.used = time.monotonic()
        return int(answer)

    def close(self) -> None:
        """End the template (EOF on its stdin; SIGKILL if it is not ready: an import may hang).
        Keepers and trials it forked run on: each is in its own session (a template that forked
        trials for its kept keepers ends once they ended, passing their exits on till then)."""
        if self.process is None:
            return
        if self.state != "dead" or self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.stdin.close()
            if self.state != "ready":
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.stdout.close()
        if self.state != "dead":
            self.state = "closed"

    def reaped(self) -> bool:
        return self.process is None or self.process.poll() is not None


class WarmPool:
    """Templates by key. ``template_for`` finds (or starts) the one for a trial; ``learn`` takes a
    finished trial's imports; ``sweep`` retires idle ones; ``close`` ends them all."""

    def __init__(
        self,
        folder: Path,
        keeper_path: str,
        log: Callable[[str], None],
        shim: str | None = None,
        max_templates: int = 8,
        idle: float = 900.0,
        reuse_keepers: bool = False,
    ) -> None:
        """Templates run as the user of their key's ``TRIALBUS_RUN_AS`` (they import the trials'
        code); as the caller where there is none."""
        self.folder, self.keeper_path, self.log, self.shim = folder, keeper_path, log, shim
        #: Keepers outlive their trial and keep the next (``kept.Kept``): only for a caller
        #: that learns a trial's end from the keepers' notices (``TRIALBUS_DONE_SOCKET``) and writes
        #: ``.trialbus/cancel`` before it signals a keeper to stop a trial.
        self.reuse_keepers = reuse_keepers
        self.max_templates, self.idle = max_templates, idle
        self.current: dict[str, Template] = {}  # key → the template trials fork from
        self.next: dict[str, Template] = {}  # key → a fuller one, starting
        self.known: dict[str, set[str]] = {}  # key → modules asked for or learned (preloaded or not)
        self.unsafe: dict[str, set[str]] = {}  # key → top-level packages that touched a GPU
        self.broken: dict[str, int] = {}  # key → templates that died before they were ready
        self.retired: list[Template] = []  # closed, not yet reaped
        self._keys: dict[tuple, tuple[str, dict, dict[bytes, bytes]] | None] = {}  # key_of's answers
        self.users: dict[str, tuple[int, int, tuple[int, ...]] | None] = {}  # key → (uid, gid, groups) it runs as
        self._keys_until = 0.0
        self._serial = 0

    # -- keys --------------------------------------------------------------------------------

    def key_of(self, command: str, environ: Mapping[str, str]) -> tuple[str, dict, dict[bytes, bytes]] | None:
        """(key, plan, template environment) for a trial the keeper would start with ``environ``;
        None when its command cannot start warm (not ``python X.py`` / ``python -m mod``). Found
        once per command and environment (what differs per trial left out) for ``KEYS_FOR``
        seconds: each launch asks twice, and every trial of an experiment asks the same (the
        interpreter is looked up on PATH again after that, in case it changed)."""
        memo = (command, *(item for item in environ.items() if item[0] not in _PER_TRIAL))
        if (now := time.monotonic()) > self._keys_until or len(self._keys) >= KEYS_KEPT:
            self._keys.clear()
            self._keys_until = now + KEYS_FOR
        try:
            return self._keys[memo]
        except KeyError:  # not found yet (None is an answer: it cannot start warm)
            found = self._keys[memo] = self._find_key(command, environ)
            return found

    def _find_key(self, command: str, environ: Mapping[str, str]) -> tuple[str, dict, dict[bytes, bytes]] | None:
        settings = {
            k.encode("utf-8", "surrogateescape"): v.encode("utf-8", "surrogateescape")
            for k, v in environ.items()
            if k not in _PER_TRIAL
        }
        settings.update({b"TRIALBUS_TRIAL_DIR": b"/", b"TRIALBUS_TRIAL_COMMAND": command.encode()})
        keeper = trial_keeper.Keeper(settings)
        env = trial_template.template_env(keeper.trial_env())
        plan = trial_template.parse_command(command.encode(), env.get(b"PATH"), keeper.code_dir.encode())
        if plan is None or not environ.get("TRIALBUS_CODE_DIR"):
            return None  # not Python; or run in its own trial directory, a different one each time
        run_as = environ.get("TRIALBUS_RUN_AS")
        digest = hashlib.sha256(json.dumps([plan["python"], plan["flags"], keeper.code_dir, run_as]).encode())
        for k, v in sorted(env.items()):
            digest.update(k + b"=" + v + b"\0")
        key = digest.hexdigest()[:16]
        self.users[key] = user_of(run_as)
        return key, plan, env

    # -- use ---------------------------------------------------------------------------------

    def template_for(self, command: str, environ: Mapping[str, str], preload: Iterable[str] = ()) -> Template | None:
        """The template this trial forks from (it may still be starting: see ``Template.state``),
        started here if there is none; None when the trial must start cold."""
        found = self.key_of(command, environ)
        if found is None:
            return None
        key, plan, env = found
        self._swap(key)
        template = self.current.get(key)
        if template is not None and template.poll() in ("starting", "ready"):
            return template
        if self.broken.get(key, 0) >= 2:
            return None  # failed twice before it was ready: this key starts cold
        first = key not in self.known
        known = self.known.setdefault(key, set())
        known.update(preload)
        if template is not None:  # it died: say so, start another
            self._forget(key, template)
            if template.unsafe:
                reason = f"its import of {template.unsafe} touched a GPU; it is not preloaded again"
            elif template.was_ready:
                reason = "it exited"
            else:  # it could not even start: once more with only what was asked for, then never
                self.broken[key] = self.broken.get(key, 0) + 1
                known.intersection_update(preload)
                reason = f"it failed to start (its log: {template.folder}/template.log)"
            if self.broken.get(key, 0) >= 2:
                self.log(f"warm template {key} failed to start twice: its trials start cold ({reason})")
                return None
            self.log(f"warm template {key} is gone ({reason}); starting another (trials start cold meanwhile)")
        code_dir = environ["TRIALBUS_CODE_DIR"]
        template = self._start(key, plan, env, code_dir, sorted(known))
        self.current[key] = template
        guessed = script_imports(code_dir, plan) - known if first else set()
        if guessed:  # what the script imports, read without running it: a fuller template at once
            known.update(guessed)
            self.next[key] = self._start(key, plan, env, code_dir, sorted(known))
        return template

    def waiting(self, command: str, environ: Mapping[str, str], preload: Iterable[str] = ()) -> Template | None:
        """A template for this trial still starting, which is worth waiting for before :meth:`fork`:
        the key's first (or the one importing what trials taught it, in place), or a fuller one
        on its way that brings packages the ready one lacks
        (importing them would cost each trial about what the template's start costs: seconds for
        scikit-learn or torch). A fuller one that adds only submodules of what the ready one
        has, or of the standard library (what a trial imported lazily: milliseconds), is not
        waited for: the trial forks at once. None when there is none to wait for. Starts the
        key's templates where needed."""
        template = self.template_for(command, environ, preload)
        if template is None:
            return None
        if template.poll() == "starting":
            return template
        fuller = self.next.get(template.key)
        if fuller is None or fuller.poll() != "starting":
            return None
        has = {name.partition(".")[0] for name in template.preload} | STDLIB
        return fuller if any(name.partition(".")[0] not in has for name in fuller.preload) else None

    def fork(
        self, environ: Mapping[str, str], preload: Iterable[str] = (), wait: float = 0.0
    ) -> tuple[int, str] | None:
        """The trial's keeper (settings ``environ``, its ``TRIALBUS_TRIAL_COMMAND`` included) forked
        from a warm template: (pid, the template's key, for :meth:`learn`). None when the trial
        must start cold: not a Python command, no template ready (after up to ``wait`` seconds
        for one that is starting), or the template failed, which is logged."""
        self.sweep()
        command = environ["TRIALBUS_TRIAL_COMMAND"]
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and (starting := self.waiting(command, environ, preload)):
            select.select([starting.stdout], [], [], min(deadline - time.monotonic(), 0.05))
        template = self.template_for(command, environ, preload)
        if template is None or template.poll() != "ready":
            return None
        try:
            return template.fork(environ), template.key
        except OSError as exc:
            self.log(f"{environ.get('TRIALBUS_TRIAL_DIR')}: the warm template failed ({exc}): starting the trial cold")
            return None

    def learn(self, key: str, trial_dir: str) -> None:
        """Take what a finished warm trial imported beyond its template; when that is new, the
        key's ready template imports it too, in place (:meth:`Template.add`: the cost of those
        modules alone, where a new template would import everything again). One still starting
        takes them when the next template of the key starts."""
        names = read_own(trial_dir, ".trialbus", "imports").decode("utf-8", "replace").split()
        known = self.known.setdefault(key, set())
        unsafe = self.unsafe.get(key, set())
        new = {n for n in names if n not in known and n.partition(".")[0] not in unsafe}
        if not new:
            return
        known.update(new)
        current = self.current.get(key)
        if current is None or key in self.next or current.poll() != "ready":
            return
        has = set(current.preload)
        current.add(sorted(n for n in known if n not in has and n.partition(".")[0] not in unsafe))

    def sweep(self) -> None:
        """Retire templates idle for ``idle`` seconds, and reap retired ones."""
        now = time.monotonic()
        for key, template in list(self.current.items()):
            if now - template.used > self.idle:
                self._forget(key, template)
        for template in [t for t in self.retired if t.reaped()]:
            self.retired.remove(template)
            if template.state == "closed":  # a dead one keeps its log
                shutil.rmtree(template.folder, ignore_errors=True)

    def close(self) -> None:
        for key, template in list(self.current.items()):
            self._forget(key, template)
        for template in self.retired:  # (one that relays its kept keepers' trials lives on until they end)
            if template.process is not None and not template.reuse:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    template.process.wait(2)
        self.retired = []

    # -- inside --------------------------------------------------------------------------------

    def _start(self, key: str, plan: dict, env: dict[bytes, bytes], code_dir: str, preload: list[str]) -> Template:
        self._serial += 1
        preload = [n for n in preload if n.partition(".")[0] not in self.unsafe.get(key, ())]
        template = Template(
            key,
            plan,
            env,
            code_dir,
            preload,
            self.folder / f"{key}-{self._serial}",
            self.reuse_keepers,
            self.users[key],
        )
        while len(self.current) >= self.max_templates and key not in self.current:
            oldest = min(self.current, key=lambda k: self.current[k].used)
            self._forget(oldest, self.current[oldest])
        try:
            template.start(TEMPLATE_PATH, self.keeper_path, self.shim)
        except OSError as exc:
            self.log(f"cannot start a warm template with {plan['python']} ({exc}): trials start cold")
            template.state = "dead"
        return template

    def _swap(self, key: str) -> None:
        """The fuller template replaces the current one once it is ready (or is dropped if it died)."""
        fuller = self.next.get(key)
        if fuller is None or fuller.poll() == "starting":
            return
        del self.next[key]
        if fuller.state == "ready":
            old = self.current.get(key)
            self.current[key] = fuller
            if old is not None:
                old.close()
                self.retired.append(old)
        else:
            if fuller.unsafe:
                self.unsafe.setdefault(key, set()).add(fuller.unsafe)
                self.log(f"warm template {key}: importing {fuller.unsafe} touches a GPU; it is not preloaded")
            self.retired.append(fuller)

    def _forget(self, key: str, template: Template) -> None:
        if template.unsafe:
            self.unsafe.setdefault(key, set()).add(template.unsafe)
        template.close()
        self.retired.append(template)
        self.current.pop(key, None)
        fuller = self.next.pop(key, None)
        if fuller is not None:
            fuller.close()
            self.retired.append(fuller)
