"""OpenPAI attempts across an adapter restart and after their end: adoption, release, logs.

Nothing about an attempt lives only in memory: its folder on the share
(``trials/<exp>/<trial>-<attempt>/``, made by this replica) names it, and its job's name
follows from the trial and attempt; in reuse mode the environments' tickets say which
environment holds it. ``adopt`` rebuilds the jobs of the openpai experiments on the bus from
the folders whose end was never published, so the jobs run on while the adapter restarts;
``release`` marks a folder reported once the service has published the attempt's end, so it
is not adopted again. The share keeps the folders, so ``past`` and ``log_tail`` serve the
logs of any attempt, also of trials that ended before this run of the adapter.

A mixin of :class:`~services.adapters.openpai.adapter.OpenpaiAdapter`, which holds the state
it uses.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from contracts import sealing
from contracts.experiment import OpenpaiConfig
from services.adapters import sharefs
from services.adapters.base import TrialHandle
from services.adapters.openpai import jobs
from services.adapters.openpai.trial import Job, task_count
from services.common import platforms

if TYPE_CHECKING:
    from services.adapters.openpai.adapter import OpenpaiAdapter

log = logging.getLogger(__name__)


class Restarts:
    """The restart part of the openpai adapter (the module's docstring)."""

    async def adopt(self: OpenpaiAdapter) -> list[TrialHandle]:
        """Jobs (or, in reuse mode, environments' trials) of the openpai experiments on the bus
        whose trials were never reported."""
        handles = []
        for state in await platforms.experiments(self._bus):
            service = state.config.service_for(self.name)
            if not isinstance(service, OpenpaiConfig):
                continue
            if (unreadable := sealing.unreadable(service)) is not None:
                log.warning("cannot adopt the jobs of experiment %s: %s", state.id, unreadable)
                continue
            client, report = self.client(service), jobs.reporting_role(service)
            held = {}
            if service.reuse_mode:
                gpus = state.config.gpus_for(service)
                held = self.pools.adopt(state.id, service.local_storage_mount_point, client, gpus or 0,
                                        state.config.command_for(service), self.settings.replica)  # fmt: skip
            attempts = sharefs.unreported(service.local_storage_mount_point, state.id, self.settings.replica)
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
                handle = TrialHandle(state.id, trial_id, key[1], ref=f"{client.framework(name)}#{entry}",
                                     start_time=started)  # fmt: skip
                self.jobs[key] = Job(handle, client, name, share, report, env=env, tasks=task_count(service))
                handles.append(handle)
        return handles

    async def past(
        self: OpenpaiAdapter, experiment_id: str, trial_id: str, attempt: int | None = None
    ) -> TrialHandle | None:
        """An attempt (the newest by default) of a finished trial whose folder the share keeps (its logs)."""
        service = await self._service(experiment_id)
        root = service.local_storage_mount_point if service else None
        found = sharefs.newest_attempt(root, experiment_id, trial_id, attempt) if root else None
        if not found:
            return None
        return TrialHandle(experiment_id, trial_id, found[0], ref=f"{self.client(service).username}#{found[1]}")

    async def release(self: OpenpaiAdapter, handle: TrialHandle) -> None:
        job = self.jobs.pop((handle.trial_id, handle.attempt), None)
        if job is not None and job.env is not None:
            job.env.drop((handle.trial_id, handle.attempt))
        sharefs.mark_reported(job.share.local if job else handle.ref.split("#", 1)[1])

    async def log_tail(self: OpenpaiAdapter, handle: TrialHandle, max_bytes: int) -> str:
        job = self.jobs.get((handle.trial_id, handle.attempt))
        return await asyncio.to_thread(sharefs.log_tail, job.share.local if job else handle.ref.split("#", 1)[1],
                                       max_bytes)  # fmt: skip
