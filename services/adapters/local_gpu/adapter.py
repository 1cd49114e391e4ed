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
read every ``gpu_refresh`` seconds; :meth:`~.launch.Launcher.place` applies NNI's rules
(``placement.py``) to it and to the GPUs our running trials hold, and sets
``CUDA_VISIBLE_DEVICES``. A trial that cannot be placed now raises ``Waiting`` (the service
holds it and retries the moment a trial ends); one no replica can ever place fails at once.
The GPUs a trial holds are written to ``.trialbus/gpus.json`` in its directory, so an
adopted trial keeps them. ``trialGpuNumber: 0`` hides every GPU (``CUDA_VISIBLE_DEVICES=""``);
unset, the trial sees what the host has, as in NNI.

Finished trials' directories stay for ``trial_retention`` (their logs are served from
there, also after a restart), then are removed; so are checkpoint directories
(``<checkpoint_root>/<experiment>/<trial>/``, shared by the replicas of a host) unchanged as long.

Trials run as an unprivileged Unix user when the adapter runs as root (``trial_user``:
:class:`~.users.TrialUsers`, docs/security.md): the stack's credentials, the services'
environments and finished trials' files are out of their reach.

This module is a facade: it wires the parts, each a plain class that owns its state —
:class:`~.table.TrialTable` (the trials, tracked and adopted), :class:`~.launch.Launcher`,
:class:`~.watch.Watcher` (a trial's end, cancel), :class:`~.keepers.KeeperSpawner` (keeper
environment, zygote, warm templates, kept keepers' notices), :class:`~.code.CodeCache` (code
snapshots), :class:`~.retention.Retention` (finished trials' files), :class:`~.users.TrialUsers`
(who trials run as, and who owns their files) and the shared
:class:`~services.adapters.gpu.scheduler.GpuScheduler` — over the :class:`~.trial.Trial` record
of :mod:`.trial`. Every call to the operating system is in :mod:`.client`.
"""

from __future__ import annotations

from pathlib import Path

from contracts import TrialRequest
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.gpu.scheduler import GpuScheduler
from services.adapters.keeper import fetch_code, outcome_of
from services.adapters.local_gpu.code import CodeCache
from services.adapters.local_gpu.keepers import KeeperSpawner
from services.adapters.local_gpu.launch import Launcher
from services.adapters.local_gpu.retention import Retention, log_tail, remove_expired, remove_stale
from services.adapters.local_gpu.settings import LocalGpuSettings
from services.adapters.local_gpu.table import TrialTable
from services.adapters.local_gpu.trial import GPUS_FILE, UNBORN_GRACE, Trial
from services.adapters.local_gpu.users import TrialUsers
from services.adapters.local_gpu.watch import Watcher
from services.common.bus import Bus

# Public names of this module, some defined in its parts (tests import ``outcome_of`` from here).
__all__ = ["GPUS_FILE", "UNBORN_GRACE", "LocalGpuAdapter", "Trial", "outcome_of", "remove_expired", "remove_stale"]


class LocalGpuAdapter(PlatformAdapter):
    """Trials as keeper process groups on this host (the module's docstring)."""

    name = "local-gpu"

    def __init__(self, settings: LocalGpuSettings, keeper_path: Path | None = None, shim_path: Path | None = None):
        if keeper_path is None or shim_path is None:
            from services.trial_keeper import KEEPER_PATH, SHIM_PATH

            keeper_path, shim_path = keeper_path or KEEPER_PATH, shim_path or SHIM_PATH
        self.settings = settings
        assert settings.work_dir is not None  # the settings' validator fills in its default
        self.work_dir = settings.work_dir
        self._bus: Bus | None = None
        trials_dir = f"{self.work_dir}/trials"
        self.users = TrialUsers(settings.trial_user)
        self.table = TrialTable(trials_dir, settings.max_trials, self.notify, self.users.uid_of)
        self.keepers = KeeperSpawner(
            settings, str(keeper_path), str(shim_path), self.table.ended_notice, users=self.users
        )
        self.code = CodeCache(self.work_dir / "code", self._fetch_code, self.users.share)
        self.gpus = GpuScheduler(settings, self.name, self.table.holdings, self.capacity_freed)
        self.launcher = Launcher(
            settings, table=self.table, code=self.code, keepers=self.keepers, gpus=self.gpus, users=self.users
        )
        self.watcher = Watcher(self.table, settings.kill_grace, self.keepers.learn, self.users.uid_of)
        self.retention = Retention(
            trials_dir, str(settings.checkpoint_root), settings.trial_retention, self.table.running_ids
        )

    async def _fetch_code(self, digest: str) -> bytes:
        assert self._bus is not None  # code is fetched for launches, which come after the start
        return await fetch_code(self._bus, digest)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await self.users.start()  # first: who the keepers, the zygote and the templates run as
        for folder in ("", "trials", "code"):  # the trial user passes through them, lists none
            self.users.folder(str(self.work_dir / folder))
        self.users.folder(str(self.settings.checkpoint_root))
        for path in (self.work_dir, self.settings.checkpoint_root):
            self.users.check_reachable(str(path))
        await self.keepers.start()
        self.gpus.bus = bus
        await self.gpus.start()
        self.retention.start()

    async def stop(self) -> None:
        await self.retention.stop()
        await self.keepers.stop()
        await self.gpus.stop()
        self.table.close()  # stop watching; the trials run on
        await self.code.close()

    # ------------------------------------------------------------------ trials

    async def adopt(self) -> list[TrialHandle]:
        return self.table.adopt()

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        return await self.launcher.launch(request)

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        return await self.watcher.poll(handle)

    async def cancel(self, handle: TrialHandle) -> None:
        await self.watcher.cancel(handle)

    async def release(self, handle: TrialHandle) -> None:
        self.table.release(handle)
        self.users.take_back(handle.ref)  # no later trial reads a finished trial's files

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        return self.retention.past(experiment_id, trial_id, attempt)

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        return log_tail(handle.ref, max_bytes)

    def describe(self) -> dict:
        return {"max_trials": self.settings.max_trials, **self.gpus.describe()}
