"""The frameworkcontroller adapter: each trial attempt is one Kubernetes ``Framework``
(NNI's ``platform: frameworkcontroller``), created through the official client.

Files go through the experiment's storage (NFS or an Azure File share), mounted on the
adapter's host where ``TRIALBUS_SHARE_MOUNTS`` says and in the pods at
``containerMountPath``, with the layout of :mod:`services.adapters.sharefs`. Creating the
attempt's folder there is the idempotency point; a Framework whose name exists (409, after
a crash) is adopted.

Status comes from a **watch** per namespace (resumed from its resourceVersion, relisted every
``relist_interval`` seconds and after a 410, so a missed event heals), not from polling each
trial: ``AttemptCreationPending/Requested/Preparing`` wait (the trial says so after
``queue_note_after`` seconds and fails after the preparing timeout: an image that never
pulls), ``AttemptRunning`` runs, ``Completed`` ends SUCCEEDED or FAILED by its completion
status. Cancel patches ``executionType: Stop``; every Framework is deleted once its trial's
end is published, and an experiment's Secret once the experiment is over. A Framework
deleted by someone else ends its trial SYS_CANCELED. After a restart the adapter lists its
Frameworks by label (its replica) and adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from contracts import TrainingService, TrialRequest
from contracts.base import utcnow
from contracts.frameworkcontroller import AzureStorage, FrameworkcontrollerConfig
from services.adapters import sharefs, trialdir
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import Conflict, Kubernetes
from services.adapters.frameworkcontroller.experiments import Experiments
from services.adapters.frameworkcontroller.jobs import Jobs
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings
from services.adapters.frameworkcontroller.storage import StorageSecrets
from services.adapters.frameworkcontroller.watch import Watcher
from services.adapters.keeper import Bundle
from services.adapters.once import OncePerKey
from services.common.bus import Bus

log = logging.getLogger(__name__)


def bundle() -> Bundle:
    """The files the adapter installs on the storage: the keeper and the ``nni`` shim."""
    from services.trial_keeper import KEEPER_PATH, SHIM_PATH

    return Bundle(KEEPER_PATH, SHIM_PATH)


class FrameworkcontrollerAdapter(PlatformAdapter):
    name = "frameworkcontroller"

    def __init__(self, settings: FrameworkcontrollerSettings):
        self.settings = settings
        self.bundle = bundle()
        self.jobs = Jobs()
        self._kube: Kubernetes | None = None
        self._launches: OncePerKey[TrialHandle] = OncePerKey()  # concurrent calls for one attempt: one launch
        self.experiments = Experiments(self.name)
        self.secrets = StorageSecrets(settings, self.kube, self.jobs, self.experiments)
        self.watcher = Watcher(settings, self.kube, self.jobs, self.notify)

    @property
    def selector(self) -> str:
        return frameworks.replica_selector(self.settings.replica)

    def kube(self) -> Kubernetes:
        """The cluster client, made on first use: an adapter without a kubeconfig starts idle."""
        if self._kube is None:
            self._kube = Kubernetes(self.settings.kubeconfig, self.settings.request_timeout)
        return self._kube

    async def start(self, bus: Bus) -> None:
        self.experiments.bus = bus
        self.secrets.start()

    async def stop(self) -> None:
        if self._kube is not None:
            self._kube.close()
        await self.watcher.stop()
        await self.secrets.stop()

    def root(self, service: FrameworkcontrollerConfig) -> sharefs.Share:
        local = self.settings.share_mounts.get(service.storage.url)
        if local is None:
            raise PermanentError(
                f"storage {service.storage.url} is not mounted on the adapter's host: mount it and "
                "name the folder in TRIALBUS_SHARE_MOUNTS"
            )
        return sharefs.Share(str(local), service.container_mount_path)

    async def check(self, service: TrainingService) -> list[str]:
        if not isinstance(service, FrameworkcontrollerConfig):
            return [f"the frameworkcontroller adapter cannot run platform {service.platform!r}"]
        problems = []
        try:
            local = Path(self.root(service).local)
            if not local.is_dir() or not os.access(local, os.W_OK):
                problems.append(
                    f"storage {service.storage.url} is mounted at {local} on the adapter's host, but that "
                    "is not a writable folder"
                )
        except PermanentError as exc:
            problems.append(str(exc))
        if isinstance(service.storage, AzureStorage):
            try:
                await self.secrets.key(service.storage)
            except PermanentError as exc:
                problems.append(str(exc))
        try:
            problems += await self.kube().check(service.namespace, self.selector)
        except PermanentError as exc:
            problems.append(str(exc))
        return problems

    # ------------------------------------------------------------------ launch

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (job := self.jobs.get(key)) is not None:
            return job.handle
        return await self._launches.run(key, lambda: self._launch(request))

    async def _launch(self, request: TrialRequest) -> TrialHandle:
        service = request.training_service
        if not isinstance(service, FrameworkcontrollerConfig):
            raise PermanentError(f"the frameworkcontroller adapter cannot run platform {service.platform!r}")
        root = self.root(service)
        share = sharefs.trial_share(root, request.experiment_id, request.trial_id, request.attempt)
        if self.experiments.bus is None:
            raise RuntimeError("the frameworkcontroller adapter is not started")
        bin_hash, fresh = await sharefs.prepare(
            self.experiments.bus, self.bundle, root, share, request, "frameworkcontroller", self.settings
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
        )
        name = body["metadata"]["name"]
        try:
            await self.kube().create(service.namespace, body)
        except Conflict:
            if fresh:  # not ours: a name we did not create
                raise PermanentError(f"a Framework named {service.namespace}/{name} exists already") from None
            log.info("Framework %s/%s was created before a restart: adopting it", service.namespace, name)
        job = self.watcher.track(
            TrialHandle(
                request.experiment_id,
                request.trial_id,
                request.attempt,
                ref=f"{service.namespace}/{name}#{share.local}",
                start_time=utcnow(),
            ),
            service,
        )
        return job.handle

    # ------------------------------------------------------------------ watching

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        return await self.watcher.poll(handle)

    async def cancel(self, handle: TrialHandle) -> None:
        await self.watcher.cancel(handle)

    # ------------------------------------------------------------------ restarts and cleaning

    async def adopt(self) -> list[TrialHandle]:
        """This replica's Frameworks of the frameworkcontroller experiments on the bus."""
        handles = []
        for state, service in await self.experiments.all():
            try:
                root = self.root(service)
                selector = f"{self.selector},{frameworks.LABEL}/experiment={state.id}"
                items, _ = await self.kube().list(service.namespace, selector)
            except (TransientError, PermanentError) as exc:
                log.warning("cannot adopt the Frameworks of experiment %s: %s", state.id, exc)
                continue
            if isinstance(service.storage, AzureStorage):
                self.secrets.adopted(state.id, service.namespace)
            for obj in items:
                meta = obj["metadata"]
                trial_id, attempt = meta["labels"]["trialbus.io/trial"], int(meta["labels"]["trialbus.io/attempt"])
                folder = sharefs.trial_share(root, state.id, trial_id, attempt).local
                if trialdir.is_reported(folder):
                    continue
                started = frameworks.parse_time((obj.get("status") or {}).get("startTime")) or utcnow()
                handle = TrialHandle(
                    state.id, trial_id, attempt, ref=f"{service.namespace}/{meta['name']}#{folder}", start_time=started
                )
                self.watcher.track(handle, service).framework = obj
                handles.append(handle)
        return handles

    async def release(self, handle: TrialHandle) -> None:
        job = self.jobs.pop((handle.trial_id, handle.attempt))
        folder = job.folder if job else handle.ref.split("#", 1)[1]
        sharefs.mark_reported(folder)
        if job is not None:
            try:  # its end is published and its files are on the storage: the object goes
                await self.kube().delete(job.namespace, job.name)
            except (TransientError, PermanentError) as exc:
                log.warning("cannot delete Framework %s/%s: %s", job.namespace, job.name, exc)

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        for state, service in await self.experiments.all():
            if state.id == experiment_id:
                with contextlib.suppress(PermanentError):
                    found = sharefs.newest_attempt(self.root(service).local, experiment_id, trial_id, attempt)
                    if found:
                        return TrialHandle(experiment_id, trial_id, found[0], ref=f"{service.namespace}/-#{found[1]}")
        return None

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        return await asyncio.to_thread(sharefs.log_tail, handle.ref.split("#", 1)[1], max_bytes)

    def health(self) -> dict:
        if self._kube is not None:
            return {"cluster": self._kube.server}
        found = [self.settings.kubeconfig, os.environ.get("KUBECONFIG"), os.environ.get("KUBERNETES_SERVICE_HOST")]
        if any(found) or Path("~/.kube/config").expanduser().is_file():
            return {"cluster": "connects on first use"}
        return {"cluster": "not configured: set KUBECONFIG (or TRIALBUS_KUBECONFIG) to run Kubernetes experiments"}

    def describe(self) -> dict:
        if self._kube is None:
            return {"clusters": []}
        running = sum(1 for j in self.jobs if j.outcome is None)
        return {"clusters": [{"name": self._kube.server, "jobs": running, "error": self.watcher.error}]}
