"""The openpai adapter: each trial attempt is one OpenPAI job (NNI's ``platform: openpai``).

Files go through the share that the cluster mounts (``localStorageMountPoint`` here,
``containerStorageMountPoint`` in the containers), under ``trialbus/``: the keeper and the
``nni`` shim once per content hash (``bin/<hash>/``), the code snapshot once per hash
(``code/<sha256>/``), and per attempt a trial directory (``trials/<exp>/<trial>-<attempt>/``)
with the keeper's settings (0600; the trial's token never goes into the job spec). Creating
that directory is the idempotency point; submitting a job whose name exists (409, after a
crash) adopts it.

Status comes from one job-list request per cluster and user every ``status_poll`` seconds;
``jobStatus.state`` and the exit spec of a job that ended make the trial's outcome. OpenPAI
retries a job by itself after every failure its exit spec calls transient; once the trial has
started, the adapter stops such a retry, and Trialbus retries the trial as its next attempt,
as the experiment's ``retry:`` says.

In reuse mode (``reuseMode: true``, ``reuse.py``) trials are handed to a pool of long-running
environment jobs instead, through tickets on the share; a trial's end is then the keeper's
``state.json``, watched every ``reuse_poll`` seconds.

This module is the adapter's facade: it makes the parts, starts and stops them, checks an
experiment's settings and describes the replica's clusters; each part is one idea, given
what it needs: :class:`~.launch.Launcher` (a trial's job submitted), :class:`~.watch.Watcher`
(job states, OpenPAI's own retries taken back, cancel, reuse mode's upkeep) and
:class:`~.restarts.Restarts` (adoption, release, logs of past attempts), over the attempts
tracked (:class:`~.trial.Jobs`), the clients (:class:`~.client.Clients`), the reuse pools
(:class:`~.reuse.Pools`) and the experiments on the bus (:class:`~.experiments.Experiments`),
with the readings of :mod:`.outcome`. The jobs are built in :mod:`.jobs`, and every request to
OpenPAI is in :mod:`.client`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from contracts import TrainingService, TrialRequest
from contracts.experiment import OpenpaiConfig
from services.adapters import trialdir
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.adapters.keeper import Bundle
from services.adapters.openpai import jobs
from services.adapters.openpai.client import Clients
from services.adapters.openpai.experiments import Experiments
from services.adapters.openpai.launch import Launcher
from services.adapters.openpai.outcome import BEHAVIOR, PREEMPTED, failure_of, outcome_of, platform_retries
from services.adapters.openpai.restarts import Restarts
from services.adapters.openpai.reuse import Pools
from services.adapters.openpai.settings import OpenpaiSettings
from services.adapters.openpai.trial import Job, Jobs
from services.adapters.openpai.watch import Watcher
from services.common.bus import Bus

# Public names of this module, some defined in its parts (tests import ``outcome_of`` and ``Job`` from here).
__all__ = ["BEHAVIOR", "PREEMPTED", "Job", "OpenpaiAdapter", "bundle", "failure_of", "outcome_of", "platform_retries"]

log = logging.getLogger(__name__)


class OpenpaiAdapter(PlatformAdapter):
    """Trials as OpenPAI jobs, or in reuse mode on environment jobs (the module's docstring)."""

    name = "openpai"

    def __init__(self, settings: OpenpaiSettings):
        self.settings = settings
        self.bundle = bundle()
        self.clients = Clients(settings.openpai_ca_bundle, settings.request_timeout, settings.rate_limit_backoff)
        self.jobs = Jobs()
        self.pools = Pools(settings)
        self.experiments = Experiments(self.name)
        self.launcher = Launcher(settings, self.bundle, self.clients, self.jobs, self.pools)
        self.watcher = Watcher(
            settings, self.clients, self.jobs, self.pools, self.experiments, self.bundle.hash, self.notify
        )
        self.restarts = Restarts(settings.replica, self.clients, self.jobs, self.pools, self.experiments)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self.launcher.bus = self.experiments.bus = bus
        self.watcher.start()

    async def stop(self) -> None:
        await self.watcher.stop()
        await self.clients.close()

    # ------------------------------------------------------------------ trials (delegated to the parts)

    async def adopt(self) -> list[TrialHandle]:
        return await self.restarts.adopt()

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        return await self.launcher.launch(request)

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        return await self.watcher.poll(handle)

    async def cancel(self, handle: TrialHandle) -> None:
        await self.watcher.cancel(handle)

    async def release(self, handle: TrialHandle) -> None:
        await self.restarts.release(handle)

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        return await self.restarts.past(experiment_id, trial_id, attempt)

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        return await self.restarts.log_tail(handle, max_bytes)

    # ------------------------------------------------------------------ the platform

    async def check(self, service: TrainingService) -> list[str]:
        if not isinstance(service, OpenpaiConfig):
            return [f"the openpai adapter cannot run platform {service.platform!r}"]
        problems = []
        share = Path(service.local_storage_mount_point)
        if not share.is_dir():
            problems.append(
                f"localStorageMountPoint {share} is not a directory on the adapter's host (mount the share there)"
            )
        elif not os.access(share, os.W_OK):
            problems.append(f"localStorageMountPoint {share} is not writable by the adapter")
        try:
            problems += await self.clients.get(service).check(service.virtual_cluster, service.storage_config_name)
        except (TransientError, PermanentError) as exc:
            problems.append(str(exc))
        return problems

    def describe(self) -> dict:
        clusters = []
        for client in self.clients:
            environments, busy = self.pools.describe(client)
            jobs_ = sum(1 for j in self.jobs if j.client is client and j.env is None and j.outcome is None)
            clusters.append(
                {
                    "name": f"{client.username}@{client.host}",
                    "jobs": jobs_,
                    "environments": environments,
                    "busy_environments": busy,
                    "paused_for": client.paused_for(),
                    "error": client.error,
                    "virtual_clusters": client.virtual_clusters,
                }
            )
        return {"clusters": clusters}


def bundle() -> Bundle:
    """The files the adapter installs on the share: the keeper, the ``nni`` shim and the
    reuse-mode runner with the trial directory's layout and its warm-start files (their hash
    names their folder, and appears in every job)."""
    from services.trial_keeper import KEEPER_PATH, SHIM_PATH, WARM_FILES

    runner = {jobs.RUNNER: Path(__file__).with_name("runner.py"), "trialdir.py": Path(trialdir.__file__)}
    return Bundle(KEEPER_PATH, SHIM_PATH, {**runner, **WARM_FILES})
