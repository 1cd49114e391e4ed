"""The openpai launch path: from a trial request to its OpenPAI job, or in reuse mode to a
ticket for an environment job.

``launch`` is idempotent per trial and attempt: an attempt tracked already returns its handle,
and creating the attempt's folder on the share (:func:`~services.adapters.sharefs.prepare`,
which installs the keeper's bundle and the code snapshot once per hash on the way) is the
point where a launch happens once. Submitting a job whose name OpenPAI has already (409)
adopts it when that folder existed (a restart came between submitting and tracking it), and
fails the attempt when the folder is new: the job is not ours. A request whose settings make
no valid job fails permanently.

A mixin of :class:`~services.adapters.openpai.adapter.OpenpaiAdapter`, which holds the state
it uses (settings, clients, the keeper's bundle, the jobs, the reuse pools).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import yaml

from contracts import TrialRequest
from contracts.base import utcnow
from contracts.experiment import OpenpaiConfig
from services.adapters import sharefs
from services.adapters.base import TrialHandle
from services.adapters.errors import PermanentError
from services.adapters.openpai import jobs
from services.adapters.openpai.client import JobExists
from services.adapters.openpai.trial import Job, task_count

if TYPE_CHECKING:
    from services.adapters.openpai.adapter import OpenpaiAdapter

log = logging.getLogger(__name__)


class Launching:
    """The launching part of the openpai adapter (the module's docstring)."""

    async def launch(self: OpenpaiAdapter, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (job := self.jobs.get(key)) is not None:
            return job.handle
        service = request.training_service
        if not isinstance(service, OpenpaiConfig):
            raise PermanentError(f"the openpai adapter cannot run platform {service.platform!r}")
        local, container = service.local_storage_mount_point.rstrip("/"), service.container_storage_mount_point
        try:
            report = jobs.reporting_role(service)
            name, share, job_spec = jobs.trial_job(service, request.experiment_id, request.trial_id, request.attempt,
                                                   request.trial_command, request.trial_gpu_number or 0,
                                                   self.bundle.hash)  # fmt: skip
        except ValueError as exc:
            raise PermanentError(str(exc)) from None
        root = sharefs.Share(local, container)
        keeper, fresh = await sharefs.prepare(self._bus, self.bundle, root, share, request, "pai", self.settings)
        client = self.client(service)
        if service.reuse_mode:
            env = await self.pools.place(key, service, client, request.experiment_id, share.container, fresh,
                                         request.trial_gpu_number or 0, request.trial_command, keeper)  # fmt: skip
            job = self.jobs[key] = Job(TrialHandle(request.experiment_id, request.trial_id, request.attempt,
                                                   ref=f"{client.framework(env.name)}#{share.local}"),
                                       client, env.name, share, report, env=env, tasks=task_count(service))  # fmt: skip
            return job.handle
        try:
            await client.submit(yaml.safe_dump(job_spec, sort_keys=False), name)
        except JobExists:
            if fresh:  # not ours: a name we did not submit
                raise PermanentError(f"an OpenPAI job named {client.framework(name)} exists already") from None
            log.info("job %s was submitted before a restart: adopting it", client.framework(name))
        job = self.jobs[key] = Job(TrialHandle(request.experiment_id, request.trial_id, request.attempt,
                                               ref=f"{client.framework(name)}#{share.local}", start_time=utcnow()),
                                   client, name, share, report)  # fmt: skip
        return job.handle
