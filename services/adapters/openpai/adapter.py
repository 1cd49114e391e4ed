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

This module holds the adapter's state (a client per cluster, user and token; the attempts it
tracks; the reuse pools), its start and stop, the check of an experiment's settings and the
status it publishes; the rest are mixins, one idea each: :mod:`.launch` (a trial's job
submitted), :mod:`.watch` (job states, OpenPAI's own retries taken back, cancel, reuse mode's
upkeep), :mod:`.restarts` (adoption, release, logs of past attempts), over the
:class:`~.trial.Job` record of :mod:`.trial` and the readings of :mod:`.outcome`. The jobs
are built in :mod:`.jobs`, the environments kept in :mod:`.reuse`, and every request to
OpenPAI is in :mod:`.client`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from pathlib import Path

from contracts import TrainingService
from contracts.experiment import OpenpaiConfig
from services.adapters.base import PlatformAdapter, TrialHandle
from services.adapters.errors import PermanentError, TransientError
from services.adapters.keeper import Bundle
from services.adapters.openpai import jobs
from services.adapters.openpai.client import OpenpaiClient
from services.adapters.openpai.launch import Launching
from services.adapters.openpai.outcome import BEHAVIOR, PREEMPTED, failure_of, outcome_of, platform_retries
from services.adapters.openpai.restarts import Restarts
from services.adapters.openpai.reuse import Pools
from services.adapters.openpai.settings import OpenpaiSettings
from services.adapters.openpai.trial import Job
from services.adapters.openpai.watch import Watching
from services.common import platforms
from services.common.bus import Bus

# Public names of this module, some defined in its parts (tests import ``outcome_of`` and ``Job`` from here).
__all__ = ["BEHAVIOR", "PREEMPTED", "Job", "OpenpaiAdapter", "bundle", "failure_of", "outcome_of", "platform_retries"]

log = logging.getLogger(__name__)


class OpenpaiAdapter(Launching, Watching, Restarts, PlatformAdapter):
    """Trials as OpenPAI jobs, or in reuse mode on environment jobs (the module's docstring)."""

    name = "openpai"

    def __init__(self, settings: OpenpaiSettings):
        self.settings = settings
        self.bundle = bundle()
        self.clients: dict[tuple[str, str, str], OpenpaiClient] = {}
        self.jobs: dict[tuple[str, int], Job] = {}
        self.pools = Pools(settings)
        self._bus: Bus | None = None
        self._loops: list[asyncio.Task] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._loops = [asyncio.create_task(self._status_loop()), asyncio.create_task(self._reuse_loop())]

    async def stop(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self.clients.values()), return_exceptions=True)

    def client(self, service: OpenpaiConfig) -> OpenpaiClient:
        token = service.token.get_secret_value()
        key = (service.host, service.username, hashlib.sha256(token.encode()).hexdigest())
        if (found := self.clients.get(key)) is None:
            found = self.clients[key] = OpenpaiClient(
                service.host, service.username, token, self.settings.openpai_ca_bundle,
                self.settings.request_timeout, self.settings.rate_limit_backoff,
            )  # fmt: skip
        return found

    async def check(self, service: TrainingService) -> list[str]:
        if not isinstance(service, OpenpaiConfig):
            return [f"the openpai adapter cannot run platform {service.platform!r}"]
        problems = []
        share = Path(service.local_storage_mount_point)
        if not share.is_dir():
            problems.append(f"localStorageMountPoint {share} is not a directory on the adapter's host "
                            "(mount the share there)")  # fmt: skip
        elif not os.access(share, os.W_OK):
            problems.append(f"localStorageMountPoint {share} is not writable by the adapter")
        try:
            problems += await self.client(service).check(service.virtual_cluster, service.storage_config_name)
        except (TransientError, PermanentError) as exc:
            problems.append(str(exc))
        return problems

    def describe(self) -> dict:
        clusters = []
        for client in self.clients.values():
            environments, busy = self.pools.describe(client)
            jobs_ = sum(1 for j in self.jobs.values() if j.client is client and j.env is None and j.outcome is None)
            clusters.append({"name": f"{client.username}@{client.host}", "jobs": jobs_,
                             "environments": environments, "busy_environments": busy,
                             "paused_for": client.paused_for(), "error": client.error})  # fmt: skip
        return {"clusters": clusters}

    # ------------------------------------------------------------------ bookkeeping

    def _find(self, handle: TrialHandle) -> Job:
        job = self.jobs.get((handle.trial_id, handle.attempt))
        if job is None:
            raise PermanentError(f"trial {handle.trial_id} attempt {handle.attempt} is not known to this replica")
        return job

    async def _service(self, experiment_id: str) -> OpenpaiConfig | None:
        for state in await platforms.experiments(self._bus):
            service = state.config.service_for(self.name)
            if state.id == experiment_id and isinstance(service, OpenpaiConfig):
                return service
        return None


def bundle() -> Bundle:
    """The files the adapter installs on the share: the keeper, the ``nni`` shim and the
    reuse-mode runner with its warm-start files (their hash names their folder, and appears
    in every job)."""
    from services.trial_keeper import KEEPER_PATH, SHIM_PATH, WARM_FILES

    return Bundle(KEEPER_PATH, SHIM_PATH, {jobs.RUNNER: Path(__file__).with_name("runner.py"), **WARM_FILES})
