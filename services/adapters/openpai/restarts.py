"""OpenPAI attempts across an adapter restart and after their end: adoption, release, logs.

Nothing about an attempt lives only in memory: its folder on the share
(``trials/<exp>/<trial>-<attempt>/``, made by this replica) names it, and its job's name
follows from the trial and attempt; in reuse mode the environments' tickets say which
environment holds it. ``adopt`` rebuilds the jobs of the openpai experiments on the bus from
the folders whose end was never published, so the jobs run on while the adapter restarts;
``release`` marks a folder reported once the service has published the attempt's end, so it
is not adopted again. The share keeps the folders, so ``past`` and ``log_tail`` serve the
logs of any attempt, also of trials that ended before this run of the adapter.

:class:`Restarts` is a part of :class:`~services.adapters.openpai.adapter.OpenpaiAdapter`: it
adds the attempts it adopts to the :class:`~.trial.Jobs` it is given, and removes them once
released.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from contracts import sealing
from services.adapters import sharefs
from services.adapters.base import TrialHandle
from services.adapters.openpai import jobs
from services.adapters.openpai.client import Clients
from services.adapters.openpai.experiments import Experiments
from services.adapters.openpai.reuse import Pools
from services.adapters.openpai.trial import Job, Jobs, task_count

log = logging.getLogger(__name__)


class Restarts:
    """Adoption, release and past attempts' logs (the module's docstring); ``replica``: this one's id."""

    def __init__(self, replica: str, clients: Clients, tracked: Jobs, pools: Pools, experiments: Experiments) -> None:
        self.replica, self.clients, self.tracked = replica, clients, tracked
        self.pools, self.experiments = pools, experiments

    async def adopt(self) -> list[TrialHandle]:
        """Jobs (or, in reuse mode, environments' trials) of the openpai experiments on the bus
        whose trials were never reported."""
        handles = []
        for state, service in await self.experiments.all():
            if (unreadable := sealing.unreadable(service)) is not None:
                log.warning("cannot adopt the jobs of experiment %s: %s", state.id, unreadable)
                continue
            client, report = self.clients.get(service), jobs.reporting_role(service)
            held = {}
            if service.reuse_mode:
                gpus = state.config.gpus_for(service)
                held = self.pools.adopt(
                    state.id,
                    service.local_storage_mount_point,
                    client,
                    gpus or 0,
                    state.config.command_for(service),
                    self.replica,
                )
            attempts = sharefs.unreported(service.local_storage_mount_point, state.id, self.replica)
            for key in set(held) - {(t, a) for t, a, _ in attempts}:  # released before its ticket was removed
                held.pop(key).drop(key)
            for trial_id, attempt, entry in attempts:
                key = (trial_id, attempt)
                if service.reuse_mode and key not in held:
                    continue  # never handed over: its request comes again
                where = f"trialbus/trials/{state.id}/{entry.name}"
                share = sharefs.Share(str(entry), f"{service.container_storage_mount_point}/{where}")
                env = held.get(key)
                name = env.name if env else jobs.job_name(state.id, trial_id, key[1])
                started = datetime.fromtimestamp(entry.stat().st_mtime, UTC)
                handle = TrialHandle(
                    state.id, trial_id, key[1], ref=f"{client.framework(name)}#{entry}", start_time=started
                )
                self.tracked.add(Job(handle, client, name, share, report, env=env, tasks=task_count(service)))
                handles.append(handle)
        return handles

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        """An attempt (the newest by default) of a finished trial whose folder the share keeps (its logs)."""
        if (service := await self.experiments.service(experiment_id)) is None:
            return None
        root = service.local_storage_mount_point
        found = sharefs.newest_attempt(root, experiment_id, trial_id, attempt) if root else None
        if not found:
            return None
        return TrialHandle(experiment_id, trial_id, found[0], ref=f"{self.clients.get(service).username}#{found[1]}")

    async def release(self, handle: TrialHandle) -> None:
        job = self.tracked.pop((handle.trial_id, handle.attempt))
        if job is not None and job.env is not None:
            job.env.drop((handle.trial_id, handle.attempt))
        sharefs.mark_reported(job.share.local if job else handle.ref.split("#", 1)[1])

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        job = self.tracked.get((handle.trial_id, handle.attempt))
        return await asyncio.to_thread(
            sharefs.log_tail, job.share.local if job else handle.ref.split("#", 1)[1], max_bytes
        )
