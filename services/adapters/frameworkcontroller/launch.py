"""The frameworkcontroller launch path: from a trial request to its ``Framework``.

Files go through the experiment's storage (NFS or an Azure File share), mounted on the
adapter's host where ``TRIALBUS_SHARE_MOUNTS`` says and in the pods at ``containerMountPath``
(:meth:`Launcher.root`), with the layout of :mod:`services.adapters.sharefs`. ``launch`` is
idempotent per trial and attempt: an attempt tracked already returns its handle, a second call
while its launch is under way waits for that launch (:class:`~services.adapters.once.OncePerKey`),
and creating the attempt's folder on the storage (:func:`~services.adapters.sharefs.prepare`,
which installs the keeper's bundle and the code snapshot once per hash on the way) is the
point where a launch happens once. A Framework whose name exists (409) is adopted when that
folder existed (a restart came between creating and tracking it), and fails the attempt when
the folder is new: the Framework is not ours. On an Azure File share the experiment's Secret
is made first (:class:`~.storage.StorageSecrets`). With Kueue (:class:`~.kueue.Kueue`) the
LocalQueue is checked before anything is written, and the pods carry its labels.

:class:`Launcher` is a part of
:class:`~services.adapters.frameworkcontroller.adapter.FrameworkcontrollerAdapter`: it hands each
attempt it launches to ``track`` (the watcher's), which adds it to the :class:`~.jobs.Jobs` it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from contracts import TrialRequest
from contracts.base import utcnow
from contracts.frameworkcontroller import AzureStorage, FrameworkcontrollerConfig
from services.adapters import sharefs
from services.adapters.base import TrialHandle
from services.adapters.errors import PermanentError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import Conflict, Kubernetes
from services.adapters.frameworkcontroller.jobs import Job, Jobs
from services.adapters.frameworkcontroller.kueue import Kueue
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings
from services.adapters.frameworkcontroller.storage import StorageSecrets
from services.adapters.keeper import Bundle
from services.adapters.once import OncePerKey
from services.common.bus import Bus

log = logging.getLogger(__name__)


class Launcher:
    """Creates trials' Frameworks (the module's docstring); ``kube``: the cluster client (made
    on first use), ``track``: tracks a launched attempt; ``bus`` (the code store) is set when
    the adapter starts."""

    def __init__(
        self,
        settings: FrameworkcontrollerSettings,
        bundle: Bundle,
        kube: Callable[[], Kubernetes],
        tracked: Jobs,
        track: Callable[[TrialHandle, FrameworkcontrollerConfig], Job],
        secrets: StorageSecrets,
        kueue: Kueue,
    ) -> None:
        self.settings, self.bundle, self.kube = settings, bundle, kube
        self.tracked, self.track, self.secrets, self.kueue = tracked, track, secrets, kueue
        self.bus: Bus | None = None
        self._launches: OncePerKey[TrialHandle] = OncePerKey()  # concurrent calls for one attempt: one launch

    def root(self, service: FrameworkcontrollerConfig) -> sharefs.Share:
        """The experiment's storage: where it is mounted here and in the pods."""
        local = self.settings.share_mounts.get(service.storage.url)
        if local is None:
            raise PermanentError(
                f"storage {service.storage.url} is not mounted on the adapter's host: mount it and "
                "name the folder in TRIALBUS_SHARE_MOUNTS"
            )
        return sharefs.Share(str(local), service.container_mount_path)

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (job := self.tracked.get(key)) is not None:
            return job.handle
        return await self._launches.run(key, lambda: self._launch(request))

    async def _launch(self, request: TrialRequest) -> TrialHandle:
        service = request.training_service
        if not isinstance(service, FrameworkcontrollerConfig):
            raise PermanentError(f"the frameworkcontroller adapter cannot run platform {service.platform!r}")
        root = self.root(service)
        queue = self.kueue.queue_for(service, request.team, request.experiment_id)
        if queue is not None:
            await self.kueue.ensure(service.namespace, queue)
        share = sharefs.trial_share(root, request.experiment_id, request.trial_id, request.attempt)
        if self.bus is None:
            raise RuntimeError("the frameworkcontroller adapter is not started")
        bin_hash, fresh = await sharefs.prepare(
            self.bus, self.bundle, root, share, request, "frameworkcontroller", self.settings
        )
        if isinstance(service.storage, AzureStorage):
            await self.secrets.ensure(request.experiment_id, service)
        body = frameworks.render(
            service,
            request.experiment_id,
            request.trial_id,
            request.attempt,
            self.settings.replica,
            share.container,
            f"{root.container}/trialbus/bin/{bin_hash}/trial_keeper.py",
            queue,
        )
        name = body["metadata"]["name"]
        try:
            await self.kube().create(service.namespace, body)
        except Conflict:
            if fresh:  # not ours: a name we did not create
                raise PermanentError(f"a Framework named {service.namespace}/{name} exists already") from None
            log.info("Framework %s/%s was created before a restart: adopting it", service.namespace, name)
        job = self.track(
            TrialHandle(
                request.experiment_id,
                request.trial_id,
                request.attempt,
                ref=f"{service.namespace}/{name}#{share.local}",
                start_time=utcnow(),
            ),
            service,
        )
        job.queue = queue
        return job.handle
