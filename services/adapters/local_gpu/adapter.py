"""The local-gpu adapter: each trial is a trial keeper process group on this host.

A launch creates ``<work_dir>/trials/<experiment>/<trial>-<attempt>/`` — ``mkdir`` is the
idempotency point: a directory that exists means the attempt was launched already, and its
handle is returned instead of a second run — and spawns the keeper there, which runs the
command and relays metrics (docs/internals.md §1). The keeper's exit reaches the event loop
through a pidfd, so the end of a trial is reported at once, not at the next poll.

Everything survives an adapter restart: the trial directory holds the keeper's pid and its
``state.json``; :meth:`LocalGpuAdapter.adopt` rebuilds the picture from them, and
:meth:`~LocalGpuAdapter.release` marks a trial ``reported`` once its end is published.

GPUs (``trialGpuNumber`` ≥ 1): the inventory (``gpus.py``: NVML, else ``nvidia-smi``) is
read every ``gpu_refresh`` seconds; :meth:`LocalGpuAdapter.place` applies NNI's rules
(``placement.py``) to it and to the GPUs our running trials hold, and sets
``CUDA_VISIBLE_DEVICES``. A trial that cannot be placed now raises ``Waiting`` (the service
holds it and retries the moment a trial ends); one no replica can ever place fails at once.
The GPUs a trial holds are written to ``.trialbus/gpus.json`` in its directory, so an
adopted trial keeps them. ``trialGpuNumber: 0`` hides every GPU (``CUDA_VISIBLE_DEVICES=""``);
unset, the trial sees what the host has, as in NNI.

Finished trials' directories stay for ``trial_retention`` (their logs are served from
there, also after a restart), then are removed; so are checkpoint directories
(``<checkpoint_root>/<experiment>/<trial>/``, shared by the replicas of a host) unchanged as long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from contracts import TrialRequest, subjects
from contracts.base import utcnow
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, TransientError, Waiting
from services.adapters.gpu.placement import GpuAsk
from services.adapters.gpu.scheduler import GpuScheduler, Holding
from services.adapters.keeper import fetch_code, outcome_of
from services.adapters.local_gpu import client
from services.adapters.local_gpu.settings import LocalGpuSettings
from services.common.bus import Bus
from services.common.code_archive import UnsafeArchive, extract_code
from services.trial_keeper.warm_pool import WarmPool

log = logging.getLogger(__name__)

#: Seconds a trial directory may wait for its keeper's first ``state.json`` before the trial
#: counts as failed: a restart caught the keeper starting (~15 ms), or it died starting.
UNBORN_GRACE = 10.0
_CODE_REF = re.compile(r"^sha256:([0-9a-f]{64})$")
#: Experiment and trial ids name directories: no separators, no dot-only names.
_SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
#: The GPUs a trial holds, in its directory: ``{"indices": [0, 2], "perGpu": 1}``.
GPUS_FILE = ".trialbus/gpus.json"


@dataclass(eq=False)
class Trial:
    """One attempt on this host: its directory, its keeper, and its outcome once known."""

    handle: TrialHandle
    dir: str
    keeper: client.Keeper | None  # None: the keeper's pid is not known (yet)
    outcome: TrialOutcome | None = None
    kill: asyncio.TimerHandle | None = field(default=None, repr=False)
    gpus: tuple[int, ...] = ()  # the GPU indices it holds while it runs
    per_gpu: int = 1  # its maxTrialNumberPerGpu
    sid: int | None = None  # its session: processes on a GPU in it are ours
    template: str | None = None  # the key of the warm template it was forked from
    grace: float | None = None  # its seconds from SIGTERM to SIGKILL (None: the adapter's kill_grace)

    @property
    def running(self) -> bool:
        return self.outcome is None and (self.keeper is None or self.keeper.alive)


class LocalGpuAdapter(PlatformAdapter):
    name = "local-gpu"

    def __init__(self, settings: LocalGpuSettings, keeper_path: Path | None = None, shim_path: Path | None = None):
        if keeper_path is None or shim_path is None:
            from services.trial_keeper import KEEPER_PATH, SHIM_PATH

            keeper_path, shim_path = keeper_path or KEEPER_PATH, shim_path or SHIM_PATH
        self.settings = settings
        self.keeper_path, self.shim_path = str(keeper_path), str(shim_path)
        self.work_dir = settings.work_dir
        self.trials: dict[tuple[str, int], Trial] = {}
        self._code: dict[str, str] = {}  # sha256 hex → unpacked directory
        self._downloads: dict[str, asyncio.Task] = {}
        self._env: dict[str, str] = {}
        self._bus: Bus | None = None
        self._zygote: client.KeeperZygote | None = None
        self._warm: WarmPool | None = None
        self.gpus = GpuScheduler(settings, self.name, self._holdings, self.capacity_freed)
        self._retention: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        (self.work_dir / "trials").mkdir(parents=True, exist_ok=True)
        keeper_source = self.keeper_path
        self.keeper_path = await asyncio.to_thread(
            client.compile_keeper, self.settings.keeper_python, self.keeper_path, self.work_dir / "trial_keeper.pyc"
        )
        if self.settings.keeper_zygote:
            zygote = client.KeeperZygote(self.settings.keeper_python, self.keeper_path, self.work_dir / "zygote.log")
            try:
                zygote.start()
                self._zygote = zygote
            except OSError as exc:  # each launch will say what is wrong
                log.warning("cannot start the keeper zygote with %s (%s)", self.settings.keeper_python, exc)
        # The trial sees the keeper's environment minus TRIALBUS_*: never pass ours (NATS secrets) on.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
        env.update(
            TRIALBUS_GATEWAY_URL=self.settings.gateway_url,
            TRIALBUS_KILL_GRACE=str(self.settings.kill_grace),
            TRIALBUS_FLUSH_TIMEOUT=str(self.settings.flush_timeout),
        )
        shim = self.settings.nni_shim != "never"
        if shim:
            env["TRIALBUS_PYTHONPATH_PREPEND"] = self.shim_path
        if self.settings.warm_start:
            self._warm = WarmPool(self.work_dir / "templates", keeper_source, log.warning,
                                  shim=self.shim_path if shim else None, max_templates=self.settings.warm_templates,
                                  idle=self.settings.warm_idle)  # fmt: skip
        log.info("work dir %s; nni shim %s; warm start %s", self.work_dir, "on" if shim else "off",
                 "on" if self._warm else "off")  # fmt: skip
        self._env = env
        self.gpus.bus = bus
        await self.gpus.start()
        self._retention = asyncio.create_task(self._retention_loop())

    async def stop(self) -> None:
        if self._retention is not None:
            self._retention.cancel()
            await asyncio.gather(self._retention, return_exceptions=True)
        await self.gpus.stop()
        if self._zygote is not None:
            self._zygote.close()
        if self._warm is not None:
            self._warm.close()
        for trial in self.trials.values():  # stop watching; the trials run on
            if trial.kill is not None:
                trial.kill.cancel()
            if trial.keeper is not None:
                trial.keeper.close()
        downloads = list(self._downloads.values())
        for task in downloads:
            task.cancel()
        await asyncio.gather(*downloads, return_exceptions=True)

    # ------------------------------------------------------------------ launch

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (trial := self.trials.get(key)) is not None:
            return trial.handle
        if not (_SAFE_ID.match(request.experiment_id) and _SAFE_ID.match(request.trial_id)):
            raise PermanentError(f"ids {request.experiment_id!r}/{request.trial_id!r} cannot name a trial directory")
        trial_dir = f"{self.work_dir}/trials/{request.experiment_id}/{request.trial_id}-{request.attempt}"
        if self._running() >= self.settings.max_trials:
            return self._existing(trial_dir, request)
        code_dir = await self._code_dir(request.code_ref) if request.code_ref else None
        ask = self.gpus.ask(request)
        if ask is not None:
            await self.gpus.check_fits(ask, self._bus)
        await self._warm_wait(request, code_dir)
        # No await from here on: the checks and the spawn happen as one step of the event loop.
        if (trial := self.trials.get(key)) is not None:
            return trial.handle
        if self._running() >= self.settings.max_trials:  # filled up during the download
            return self._existing(trial_dir, request)
        if os.path.isdir(trial_dir) and not self._unborn(trial_dir):  # launched before a restart: never twice
            return self._adopt(trial_dir, *key, request.experiment_id).handle
        try:
            where, held, per_gpu = self.place(request, ask)
        except Waiting as exc:  # a replica that can place it now should have it
            if (peer := self.gpus.room_elsewhere(ask)) is not None:
                raise TransientError(f"{exc}; offered to replica {peer}, which has idle GPUs", delay=0.2) from None
            raise
        try:
            os.mkdir(trial_dir)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(trial_dir), exist_ok=True)
            os.mkdir(trial_dir)
        except FileExistsError:  # launched before (a redelivery after a restart): never twice
            return self._adopt(trial_dir, *key, request.experiment_id).handle
        os.mkdir(f"{trial_dir}/.trialbus")
        if held:
            with open(f"{trial_dir}/{GPUS_FILE}", "w") as f:
                json.dump({"indices": list(held), "perGpu": per_gpu}, f)
        env = dict(self._env)
        env.update(
            TRIALBUS_TRIAL_DIR=trial_dir,
            TRIALBUS_TRIAL_COMMAND=request.trial_command,
            TRIALBUS_EXPERIMENT_ID=request.experiment_id,
            TRIALBUS_TRIAL_ID=request.trial_id,
            TRIALBUS_SEQUENCE_ID=str(request.sequence_id),
            TRIALBUS_ATTEMPT=str(request.attempt),
            TRIALBUS_CHECKPOINT_DIR=f"{self.settings.checkpoint_root}/{request.experiment_id}/{request.trial_id}",
            TRIALBUS_PARAMETERS=request.parameter_record,
            TRIALBUS_TRIAL_TOKEN=request.token.get_secret_value(),
            **where,
        )
        if code_dir is not None:
            env["TRIALBUS_CODE_DIR"] = code_dir
        if request.heartbeat:
            env["TRIALBUS_HEARTBEAT"] = str(request.heartbeat)
        if request.grace_period is not None:
            env["TRIALBUS_KILL_GRACE"] = str(request.grace_period)
        forked = self._warm.fork(env, request.warm_preload) if self._warm and request.warm_start else None
        pid, template = forked or (None, None)
        try:
            if pid is None and self._zygote is not None:
                pid = self._zygote.spawn(env)
            elif pid is None:
                pid = client.spawn_keeper(self.settings.keeper_python, self.keeper_path, env, trial_dir)
        except OSError as exc:
            shutil.rmtree(trial_dir, ignore_errors=True)  # never launched: nothing to adopt later
            raise PermanentError(f"cannot start the trial keeper with {self.settings.keeper_python}: {exc}") from exc
        trial = self._track(request.experiment_id, *key, trial_dir, client.Keeper(pid), utcnow())
        trial.gpus, trial.per_gpu = held, per_gpu
        trial.template, trial.grace = template, request.grace_period
        return trial.handle

    async def _warm_wait(self, request: TrialRequest, code_dir: str | None) -> None:
        """Wait, up to ``warm_wait`` seconds, while the trial's warm template is still starting
        (an experiment's first, ~50 ms bare; a fuller one learned from the trials): the launch
        then forks from what is ready, or starts the trial cold."""
        if self._warm is None or not request.warm_start:
            return
        env = dict(self._env, TRIALBUS_EXPERIMENT_ID=request.experiment_id)
        if code_dir is not None:
            env["TRIALBUS_CODE_DIR"] = code_dir
        deadline = time.monotonic() + self.settings.warm_wait
        while self._warm.waiting(request.trial_command, env, request.warm_preload) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def _unborn(self, trial_dir: str) -> bool:
        """Whether ``trial_dir`` is a launch an earlier run of this adapter began but died before
        it started the keeper (so the request was never acked, and here it is again): then the
        directory is removed, to launch afresh. A keeper spawned in the instant before that
        death may still be on its way: for :data:`UNBORN_GRACE` seconds the launch is retried
        later instead."""
        if client.keeper_born(trial_dir):
            return False
        age = time.time() - os.path.getmtime(trial_dir)
        if age < UNBORN_GRACE:
            raise TransientError("an earlier launch of this trial may still be starting its keeper",
                                 delay=UNBORN_GRACE - age)  # fmt: skip
        log.info("%s: an earlier launch died before starting the trial keeper; launching it afresh", trial_dir)
        shutil.rmtree(trial_dir, ignore_errors=True)
        return True

    def _existing(self, trial_dir: str, request: TrialRequest) -> TrialHandle | None:
        """No room for a new trial: only an attempt launched before can be returned."""
        if not os.path.isdir(trial_dir) or not client.keeper_born(trial_dir):
            return None
        return self._adopt(trial_dir, request.trial_id, request.attempt, request.experiment_id).handle

    # ------------------------------------------------------------------ GPUs

    def place(self, request: TrialRequest, ask: GpuAsk | None) -> tuple[dict[str, str], tuple[int, ...], int]:
        """Where the trial runs on this host: keeper environment, GPUs held, maxTrialNumberPerGpu.

        ``trialGpuNumber`` unset: nothing (the trial sees what the host has); ``0``: no GPU
        (``CUDA_VISIBLE_DEVICES=""``, as NNI v3); ≥ 1: GPUs from the scheduler, numbered as
        nvidia-smi does (``CUDA_DEVICE_ORDER=PCI_BUS_ID``). Raises Waiting with the reason
        when they are not free now. ``ask`` is ``self.gpus.ask(request)``.
        """
        if ask is None:
            return ({} if request.trial_gpu_number is None else {"TRIALBUS_GPUS": ""}), (), 1
        held = self.gpus.place(ask)
        return {"TRIALBUS_GPUS": ",".join(map(str, held)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, held, ask.per_gpu

    def _holdings(self) -> list[Holding]:
        return [
            Holding(subjects.dispatch_id(t.handle.trial_id, t.handle.attempt), t.gpus, t.per_gpu, self._session(t))
            for t in self.trials.values()
            if t.gpus and t.running
        ]

    def _session(self, trial: Trial) -> int | None:
        if trial.sid is None:
            trial.sid = client.read_state(trial.dir).get("pgid")
        return trial.sid

    def describe(self) -> dict:
        return {"max_trials": self.settings.max_trials, **self.gpus.describe()}

    async def _code_dir(self, code_ref: str) -> str:
        """The unpacked snapshot for ``code_ref``: downloaded once per hash, shared by every trial."""
        match = _CODE_REF.match(code_ref)
        if match is None:
            raise PermanentError(f"code reference {code_ref!r} is not sha256:<64 hex digits>")
        digest = match.group(1)
        if (path := self._code.get(digest)) is not None:
            return path
        dest = self.work_dir / "code" / digest
        if not dest.is_dir():
            task = self._downloads.get(digest)
            if task is None:
                task = self._downloads[digest] = asyncio.create_task(self._download(digest, dest))
                task.add_done_callback(lambda _: self._downloads.pop(digest, None))
            await asyncio.shield(task)  # one launch giving up must not abort the others' download
        self._code[digest] = str(dest)
        return str(dest)

    async def _download(self, digest: str, dest: Path) -> None:
        archive = await fetch_code(self._bus, digest)
        try:
            await asyncio.to_thread(extract_code, archive, dest)
        except UnsafeArchive as exc:
            raise PermanentError(f"code snapshot sha256:{digest}: {exc}") from exc

    # ------------------------------------------------------------------ watching

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        trial = self._find(handle)
        if trial.outcome is not None:
            return trial.outcome
        if trial.keeper is None and not self._find_keeper(trial):
            if time.time() - os.path.getmtime(trial.dir) < UNBORN_GRACE:
                return None
            return self._ended(trial)
        if trial.keeper.check():
            return None
        return self._ended(trial)

    def _ended(self, trial: Trial) -> TrialOutcome:
        if trial.kill is not None:
            trial.kill.cancel()
        if trial.template is not None and self._warm is not None:
            self._warm.learn(trial.template, trial.dir)
        state = client.read_state(trial.dir)
        if state.get("pgid") and "exitCode" not in state:  # the keeper died first: leave no orphans
            client.kill_group(state["pgid"], signal.SIGKILL)
        status = trial.keeper.status if trial.keeper else None
        if not state and trial.keeper is not None:
            client.record_early_death(trial.dir, trial.keeper.pid, status)
        status = status if status is not None else state.get("keeperExit")
        keeper_out = None if state.get("exitCode") is not None else client.tail(f"{trial.dir}/{client.KEEPER_OUT}", 300)
        trial.outcome = outcome_of(state, status, keeper_out)
        return trial.outcome

    async def cancel(self, handle: TrialHandle) -> None:
        """SIGTERM the keeper (it stops the trial's group); SIGKILL everything if it lingers."""
        trial = self._find(handle)
        if not trial.running:
            return
        if trial.keeper is None and not self._find_keeper(trial):
            raise TransientError("the trial keeper has not started yet", delay=0.2)
        trial.keeper.signal(signal.SIGTERM)
        if trial.kill is None:
            loop = asyncio.get_running_loop()
            trial.kill = loop.call_later(self._grace(trial) + 1.0, self._force_stop, trial)

    def _grace(self, trial: Trial) -> float:
        return self.settings.kill_grace if trial.grace is None else trial.grace

    def _find_keeper(self, trial: Trial) -> bool:
        """For a trial adopted before its keeper wrote ``state.json``: is its pid known now?"""
        if pid := client.read_state(trial.dir).get("keeperPid"):
            trial.keeper = client.Keeper.adopt(pid) or _dead(pid)
            self._watch(trial)
        return trial.keeper is not None

    def _force_stop(self, trial: Trial) -> None:
        if trial.running and trial.keeper is not None:
            grace = self._grace(trial) + 1
            log.warning("trial %s still running %.1fs after cancel: SIGKILL", trial.handle.trial_id, grace)
            if pgid := client.read_state(trial.dir).get("pgid"):
                client.kill_group(pgid, signal.SIGKILL)
            trial.keeper.signal(signal.SIGKILL)

    # ------------------------------------------------------------------ restarts

    async def adopt(self) -> list[TrialHandle]:
        handles = []
        for experiment in sorted(os.scandir(f"{self.work_dir}/trials"), key=lambda e: e.name):
            for entry in os.scandir(experiment.path) if experiment.is_dir() else ():
                trial_id, _, attempt = entry.name.rpartition("-")
                if not (entry.is_dir() and trial_id and attempt.isdigit()) or client.is_reported(entry.path):
                    continue
                if not client.keeper_born(entry.path):  # died mid-launch: its request comes again
                    log.info("%s: its launch never started a keeper; it starts when its request comes again",
                             entry.path)  # fmt: skip
                    continue
                handles.append(self._adopt(entry.path, trial_id, int(attempt), experiment.name).handle)
        return handles

    def _adopt(self, trial_dir: str, trial_id: str, attempt: int, experiment_id: str) -> Trial:
        """A trial directory left by an earlier launch: watch its keeper if it still runs."""
        if (trial := self.trials.get((trial_id, attempt))) is not None:
            return trial
        state = client.read_state(trial_dir)
        pid = state.get("keeperPid")
        keeper = (client.Keeper.adopt(pid) or _dead(pid)) if pid else None
        started = state.get("startTime") or os.path.getmtime(trial_dir)
        trial = self._track(experiment_id, trial_id, attempt, trial_dir, keeper, datetime.fromtimestamp(started, UTC))
        try:  # the GPUs it was given stay held while it runs
            with open(f"{trial_dir}/{GPUS_FILE}", "rb") as f:
                held = json.loads(f.read())
            trial.gpus, trial.per_gpu = tuple(held["indices"]), int(held["perGpu"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable %s in %s (%s): its GPUs count as free", GPUS_FILE, trial_dir, exc)
        return trial

    async def release(self, handle: TrialHandle) -> None:
        trial = self.trials.pop((handle.trial_id, handle.attempt), None)
        client.mark_reported(trial.dir if trial else handle.ref)
        if trial is not None and trial.keeper is not None:
            trial.keeper.close()

    async def past(self, experiment_id: str, trial_id: str) -> TrialHandle | None:
        """The newest attempt of a trial whose directory is still here (kept ``trial_retention``)."""
        if not (_SAFE_ID.match(experiment_id) and _SAFE_ID.match(trial_id)):
            return None
        attempts = []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(f"{self.work_dir}/trials/{experiment_id}"):
                name, _, attempt = entry.name.rpartition("-")
                if name == trial_id and attempt.isdigit() and entry.is_dir():
                    attempts.append((int(attempt), entry.path))
        if not attempts:
            return None
        attempt, path = max(attempts)
        return TrialHandle(experiment_id, trial_id, attempt, ref=path)

    async def _retention_loop(self) -> None:
        """Remove reported trials' directories ``trial_retention`` seconds after their end."""
        retention = self.settings.trial_retention
        if not retention:
            return
        while True:
            try:
                removed = await asyncio.to_thread(remove_expired, f"{self.work_dir}/trials", retention)
                if removed:
                    log.info("removed %d finished trial director%s older than %.0fs", removed,
                             "y" if removed == 1 else "ies", retention)
                running = {(t.handle.experiment_id, t.handle.trial_id) for t in self.trials.values() if t.running}
                stale = await asyncio.to_thread(remove_stale, str(self.settings.checkpoint_root), retention, running)
                if stale:
                    log.info("removed %d checkpoint director%s unchanged for %.0fs", stale,
                             "y" if stale == 1 else "ies", retention)
            except Exception:
                log.exception("cannot clean up old trial directories")
            await asyncio.sleep(min(3600.0, max(1.0, retention / 4)))

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        parts = []
        for name in ("stdout", "stderr", "trial.log"):
            text = client.tail(f"{handle.ref}/{name}", max_bytes)
            if text is not None:
                parts.append(f"==> {name} <==\n{text}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ bookkeeping

    def _track(self, experiment_id, trial_id, attempt, trial_dir, keeper, started) -> Trial:
        handle = TrialHandle(experiment_id, trial_id, attempt, ref=trial_dir, start_time=started)
        trial = self.trials[(trial_id, attempt)] = Trial(handle, trial_dir, keeper)
        self._watch(trial)
        return trial

    def _watch(self, trial: Trial) -> None:
        if trial.keeper is not None and trial.keeper.alive:
            trial.keeper.watch(lambda: self.notify(trial.handle))

    def _find(self, handle: TrialHandle) -> Trial:
        """The trial of a handle, from memory or, for one this instance never saw, from its directory."""
        trial = self.trials.get((handle.trial_id, handle.attempt))
        if trial is None:
            if not os.path.isdir(handle.ref):
                raise PermanentError(f"trial directory {handle.ref} is gone")
            trial = self._adopt(handle.ref, handle.trial_id, handle.attempt, handle.experiment_id)
        return trial

    def _running(self) -> int:
        return sum(1 for trial in self.trials.values() if trial.running)


def remove_expired(trials_dir: str, retention: float) -> int:
    """Delete trial directories reported more than ``retention`` seconds ago; the count."""
    deadline, removed = time.time() - retention, 0
    for experiment in os.scandir(trials_dir):
        if not experiment.is_dir():
            continue
        for entry in os.scandir(experiment.path):
            try:
                if entry.is_dir() and os.path.getmtime(f"{entry.path}/{client.REPORTED}") < deadline:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
            except FileNotFoundError:  # running, or never reported
                continue
        with contextlib.suppress(OSError):  # only when empty
            os.rmdir(experiment.path)
    return removed


def remove_stale(root: str, retention: float, running: set[tuple[str, str]]) -> int:
    """Delete checkpoint directories (``<root>/<experiment>/<trial>``) unchanged for ``retention``
    seconds, but those of ``running`` trials; the count. O(checkpoint directories)."""
    deadline, removed = time.time() - retention, 0
    with contextlib.suppress(FileNotFoundError):
        for experiment in os.scandir(root):
            if not experiment.is_dir():
                continue
            for entry in os.scandir(experiment.path):
                with contextlib.suppress(FileNotFoundError):
                    if (experiment.name, entry.name) not in running and entry.stat().st_mtime < deadline:
                        shutil.rmtree(entry.path, ignore_errors=True)
                        removed += 1
            with contextlib.suppress(OSError):  # only when empty
                os.rmdir(experiment.path)
    return removed


def _dead(pid: int) -> client.Keeper:
    keeper = client.Keeper(pid)
    keeper.alive = False
    return keeper
