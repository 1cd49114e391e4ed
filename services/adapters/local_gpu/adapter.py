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

This module holds the adapter's state, its start and stop, and the GPUs its trials hold; the
rest are mixins, one idea each: :mod:`.launch` (launching), :mod:`.watch` (a trial's end,
cancel), :mod:`.restarts` (adoption), :mod:`.retention` (finished trials' files), over the
:class:`~.trial.Trial` record of :mod:`.trial`. Every call to the operating system is in
:mod:`.client`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from contracts import subjects
from services.adapters.base import PlatformAdapter, TrialHandle
from services.adapters.errors import PermanentError
from services.adapters.gpu.scheduler import GpuScheduler, Holding
from services.adapters.keeper import fetch_code, outcome_of
from services.adapters.local_gpu import client
from services.adapters.local_gpu.code import CodeCache
from services.adapters.local_gpu.ends import KeeperEnds
from services.adapters.local_gpu.launch import Launching
from services.adapters.local_gpu.restarts import Restarts
from services.adapters.local_gpu.retention import Retention, remove_expired, remove_stale
from services.adapters.local_gpu.settings import LocalGpuSettings
from services.adapters.local_gpu.trial import GPUS_FILE, UNBORN_GRACE, Trial
from services.adapters.local_gpu.watch import Watching
from services.common.bus import Bus
from services.trial_keeper.warm_pool import WarmPool

TEMPLATE_SWEEP = 1.0  # seconds between two sweeps of the warm templates (reaped, idle ones ended)

# Public names of this module, some defined in its parts (tests import ``outcome_of`` from here).
__all__ = ["GPUS_FILE", "UNBORN_GRACE", "LocalGpuAdapter", "Trial", "outcome_of", "remove_expired", "remove_stale"]

log = logging.getLogger(__name__)


class LocalGpuAdapter(Launching, Watching, Restarts, Retention, PlatformAdapter):
    """Trials as keeper process groups on this host (the module's docstring)."""

    name = "local-gpu"

    def __init__(self, settings: LocalGpuSettings, keeper_path: Path | None = None, shim_path: Path | None = None):
        if keeper_path is None or shim_path is None:
            from services.trial_keeper import KEEPER_PATH, SHIM_PATH

            keeper_path, shim_path = keeper_path or KEEPER_PATH, shim_path or SHIM_PATH
        self.settings = settings
        self.keeper_path, self.shim_path = str(keeper_path), str(shim_path)
        self.work_dir = settings.work_dir
        self.trials: dict[tuple[str, int], Trial] = {}
        self.code = CodeCache(self.work_dir / "code", self._fetch_code)
        self._env: dict[str, str] = {}
        self._bus: Bus | None = None
        self._zygote: client.KeeperZygote | None = None
        self._warm: WarmPool | None = None
        self._ends: KeeperEnds | None = None  # where kept keepers say their trial ended
        self.gpus = GpuScheduler(settings, self.name, self._holdings, self.capacity_freed)
        self._retention: asyncio.Task | None = None
        self._sweeps: asyncio.Task | None = None

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
        # After the zygote started: keepers forked from it, and their trials, keep the host's limit.
        before, now, enough = client.raise_fd_limit(self.settings.max_trials)
        if now != before:
            log.info("raised the soft limit of open files from %d to %d (max_trials %d)", before, now,
                     self.settings.max_trials)  # fmt: skip
        if not enough:
            log.warning("open files are limited to %d: past about %d running trials, their ends are noticed at the "
                        "next poll, not at once (raise the hard limit: ulimit -Hn)", now, now - client.FD_HEADROOM)
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
            ends = KeeperEnds(self._kept_trial_ended)
            try:  # a template's keepers then keep trial after trial (Linux: the abstract namespace)
                ends.start()
                self._ends, env["TRIALBUS_DONE_SOCKET"] = ends, ends.address
            except OSError as exc:
                log.warning("each warm trial gets a keeper of its own: no socket for their notices (%s)", exc)
            self._warm = WarmPool(self.work_dir / "templates", keeper_source, log.warning,
                                  shim=self.shim_path if shim else None, max_templates=self.settings.warm_templates,
                                  idle=self.settings.warm_idle, reuse_keepers=self._ends is not None)  # fmt: skip
        log.info("work dir %s; nni shim %s; warm start %s", self.work_dir, "on" if shim else "off",
                 "on" if self._warm else "off")  # fmt: skip
        self._env = env
        self.gpus.bus = bus
        await self.gpus.start()
        self._retention = asyncio.create_task(self._retention_loop())
        if self._warm is not None:
            self._sweeps = asyncio.create_task(self._sweep_templates())

    async def _sweep_templates(self) -> None:
        """Reap the templates that exited and end those idle for ``warm_idle``, every
        ``TEMPLATE_SWEEP`` seconds, whether trials start or not: a template the pool closed (the
        bare one a fuller one replaced, as an experiment's first trial starts) exits once its
        keepers' trials did, and stays a zombie child of this process until it is waited for.
        O(templates) a sweep."""
        while True:
            await asyncio.sleep(TEMPLATE_SWEEP)
            try:
                self._warm.sweep()
            except Exception:  # noqa: BLE001 - the next sweep tries again; trials start cold if need be
                log.exception("sweeping the warm templates failed")

    async def stop(self) -> None:
        for task in (self._retention, self._sweeps):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.gpus.stop()
        if self._zygote is not None:
            self._zygote.close()
        if self._warm is not None:
            self._warm.close()
        if self._ends is not None:
            self._ends.close()
        for trial in self.trials.values():  # stop watching; the trials run on
            if trial.kill is not None:
                trial.kill.cancel()
            if trial.keeper is not None:
                trial.keeper.close()
        await self.code.close()

    async def _fetch_code(self, digest: str) -> bytes:
        return await fetch_code(self._bus, digest)

    # ------------------------------------------------------------------ GPUs

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

    # ------------------------------------------------------------------ bookkeeping

    def _track(self, experiment_id, trial_id, attempt, trial_dir, keeper, started) -> Trial:
        handle = TrialHandle(experiment_id, trial_id, attempt, ref=trial_dir, start_time=started)
        trial = self.trials[(trial_id, attempt)] = Trial(handle, trial_dir, keeper)
        self._watch(trial)
        return trial

    def _kept_trial_ended(self, trial_dir: str) -> None:
        """A kept keeper's notice (:mod:`.ends`): poll the trial of ``<…>/<trial>-<attempt>`` now. O(1)."""
        trial_id, _, attempt = os.path.basename(trial_dir).rpartition("-")
        trial = self.trials.get((trial_id, int(attempt))) if attempt.isdigit() else None
        if trial is not None and trial.dir == trial_dir:
            trial.ended_notice = True
            self.notify(trial.handle)

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

    def _full(self) -> bool:
        """Whether ``max_trials`` trials run here. O(1) while fewer trials are tracked (running or
        ended, not yet released), O(tracked) otherwise: 250 µs at 1,000, twice per launch."""
        return len(self.trials) >= self.settings.max_trials and self._running() >= self.settings.max_trials
