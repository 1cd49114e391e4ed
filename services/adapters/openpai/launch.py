"""The openpai launch path: from a trial request to its OpenPAI job, or in reuse mode to a
ticket for an environment job.

``launch`` is idempotent per trial and attempt: an attempt tracked already returns its handle, a
second call while its launch is under way waits for that launch (:class:`~services.adapters.once.OncePerKey`),
and creating the attempt's folder on the share (:func:`~services.adapters.sharefs.prepare`,
which installs the keeper's bundle and the code snapshot once per hash on the way) is the
point where a launch happens once. Submitting a job whose name OpenPAI has already (409)
adopts it when that folder existed (a restart came between submitting and tracking it), and
fails the attempt when the folder is new: the job is not ours. A request whose settings make
no valid job fails permanently.

:class:`Launcher` is a part of :class:`~services.adapters.openpai.adapter.OpenpaiAdapter`: it
adds the attempts it launches to the :class:`~.trial.Jobs` it is given.
"""

from __future__ import annotations

import logging

import yaml

from contracts import TrialRequest
from contracts.base import utcnow
from contracts.experiment import OpenpaiConfig
from services.adapters import sharefs
from services.adapters.base import TrialHandle
from services.adapters.errors import PermanentError
from services.adapters.keeper import Bundle
from services.adapters.once import OncePerKey
from services.adapters.openpai import jobs
from services.adapters.openpai.client import Clients, JobExists
from services.adapters.openpai.reuse import Pools
from services.adapters.openpai.settings import OpenpaiSettings
from services.adapters.openpai.trial import Job, Jobs, task_count
from services.common.bus import Bus

log = logging.getLogger(__name__)


class Launcher:
    """Submits trials' jobs (the module's docstring); ``bus`` (the code store) is set when the adapter starts."""

    def __init__(
        self, settings: OpenpaiSettings, bundle: Bundle, clients: Clients, tracked: Jobs, pools: Pools
    ) -> None:
        self.settings, self.bundle = settings, bundle
        self.clients, self.tracked, self.pools = clients, tracked, pools
        self.bus: Bus | None = None
        self._launches: OncePerKey[TrialHandle | None] = OncePerKey()  # concurrent calls for one attempt: one launch

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (job := self.tracked.get(key)) is not None:
            return job.handle
        return await self._launches.run(key, lambda: self._launch(request))

    async def _launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        service = request.training_service
        if not isinstance(service, OpenpaiConfig):
            raise PermanentError(f"the openpai adapter cannot run platform {service.platform!r}")
        local, container = service.local_storage_mount_point.rstrip("/"), service.container_storage_mount_point
        try:
            report = jobs.reporting_role(service)
            name, share, job_spec = jobs.trial_job(
                service,
                request.experiment_id,
                request.trial_id,
                request.attempt,
                request.trial_command,
                request.trial_gpu_number or 0,
                self.bundle.hash,
            )
        except ValueError as exc:
            raise PermanentError(str(exc)) from None
        if self.bus is None:
            raise RuntimeError("the openpai adapter is not started")
        root = sharefs.Share(local, container)
        keeper, fresh = await sharefs.prepare(self.bus, self.bundle, root, share, request, "pai", self.settings)
        client = self.clients.get(service)
        if service.reuse_mode:
            env = await self.pools.place(
                key,
                service,
                client,
                request.experiment_id,
                share.container,
                fresh,
                request.trial_gpu_number or 0,
                request.trial_command,
                keeper,
            )
            job = self.tracked.add(
                Job(
                    TrialHandle(
                        request.experiment_id,
                        request.trial_id,
                        request.attempt,
                        ref=f"{client.framework(env.name)}#{share.local}",
                    ),
                    client,
                    env.name,
                    share,
                    report,
                    env=env,
                    tasks=task_count(service),
                )
            )
            return job.handle
        try:
            await client.submit(yaml.safe_dump(job_spec, sort_keys=False), name)
        except JobExists:
            if fresh:  # not ours: a name we did not submit
                raise PermanentError(f"an OpenPAI job named {client.framework(name)} exists already") from None
            log.info("job %s was submitted before a restart: adopting it", client.framework(name))
        job = self.tracked.add(
            Job(
                TrialHandle(
                    request.experiment_id,
                    request.trial_id,
                    request.attempt,
                    ref=f"{client.framework(name)}#{share.local}",
                    start_time=utcnow(),
                ),
                client,
                name,
                share,
                report,
            )
        )
        return job.handle
