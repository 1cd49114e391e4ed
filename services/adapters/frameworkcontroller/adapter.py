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

This module is the adapter's facade: it makes the parts, starts and stops them, checks an
experiment's settings and describes the replica's cluster; each part is one idea, given what
it needs: :class:`~.launch.Launcher` (a trial's Framework created, the storage's root),
:class:`~.watch.Watcher` (the namespaces' watches, a trial's end, cancel),
:class:`~.restarts.Restarts` (adoption, release, logs of past attempts) and
:class:`~.storage.StorageSecrets` (an Azure File share's key and the experiments' Secrets,
deleted once they are over), over the attempts tracked (:class:`~.jobs.Jobs`) and the
experiments on the bus (:class:`~.experiments.Experiments`), and :class:`~.kueue.Kueue` (the
LocalQueue of a trial, whether Kueue still holds it). The Frameworks are built in
:mod:`.frameworks`, and every request to Kubernetes is in :mod:`.client`.
"""

from __future__ import annotations

import os
from pathlib import Path

from contracts import TrainingService, TrialRequest
from contracts.frameworkcontroller import AzureStorage, FrameworkcontrollerConfig
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import Kubernetes
from services.adapters.frameworkcontroller.experiments import Experiments
from services.adapters.frameworkcontroller.jobs import Jobs
from services.adapters.frameworkcontroller.kueue import Kueue
from services.adapters.frameworkcontroller.launch import Launcher
from services.adapters.frameworkcontroller.restarts import Restarts
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings
from services.adapters.frameworkcontroller.storage import StorageSecrets
from services.adapters.frameworkcontroller.watch import Watcher
from services.adapters.keeper import Bundle
from services.common.bus import Bus


def bundle() -> Bundle:
    """The files the adapter installs on the storage: the keeper and the ``nni`` shim."""
    from services.trial_keeper import KEEPER_PATH, SHIM_PATH

    return Bundle(KEEPER_PATH, SHIM_PATH)


class FrameworkcontrollerAdapter(PlatformAdapter):
    """Trials as Kubernetes Frameworks (the module's docstring)."""

    name = "frameworkcontroller"

    def __init__(self, settings: FrameworkcontrollerSettings):
        self.settings = settings
        self.bundle = bundle()
        self._kube: Kubernetes | None = None
        self.jobs = Jobs()
        self.experiments = Experiments(self.name)
        self.secrets = StorageSecrets(settings, self.kube, self.jobs, self.experiments)
        self.watcher = Watcher(settings, self.kube, self.jobs, self.notify)
        self.kueue = Kueue(settings, self.kube)
        self.launcher = Launcher(
            settings, self.bundle, self.kube, self.jobs, self.watcher.track, self.secrets, self.kueue
        )
        self.restarts = Restarts(
            self.kube, self.jobs, self.watcher.track, self.launcher.root, self.secrets, self.experiments, self.selector
        )

    @property
    def selector(self) -> str:
        return frameworks.replica_selector(self.settings.replica)

    def kube(self) -> Kubernetes:
        """The cluster client, made on first use: an adapter without a kubeconfig starts idle."""
        if self._kube is None:
            self._kube = Kubernetes(self.settings.kubeconfig, self.settings.request_timeout)
        return self._kube

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self.launcher.bus = self.experiments.bus = bus
        self.secrets.start()

    async def stop(self) -> None:
        if self._kube is not None:
            self._kube.close()
        await self.watcher.stop()
        await self.secrets.stop()

    # ------------------------------------------------------------------ trials (delegated to the parts)

    async def adopt(self) -> list[TrialHandle]:
        return await self.restarts.adopt()

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        return await self.launcher.launch(request)

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        return await self.watcher.poll(handle)

    async def queued(self, handle: TrialHandle) -> str | None:
        return await self.kueue.queued(self.jobs.find(handle))

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
        if not isinstance(service, FrameworkcontrollerConfig):
            return [f"the frameworkcontroller adapter cannot run platform {service.platform!r}"]
        problems = []
        try:
            local = Path(self.launcher.root(service).local)
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
            problems += await self.kueue.problems(service)
        except (TransientError, PermanentError) as exc:
            problems.append(str(exc))
        return problems

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
