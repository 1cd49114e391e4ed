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
import base64
import contextlib
import logging
import os
from pathlib import Path

from contracts import ExperimentStatus, TrainingService, TrialRequest
from contracts.base import utcnow
from contracts.frameworkcontroller import AzureStorage, FrameworkcontrollerConfig
from services.adapters import sharefs, trialdir
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import Conflict, Kubernetes
from services.adapters.frameworkcontroller.jobs import Jobs
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings
from services.adapters.frameworkcontroller.watch import Watcher
from services.adapters.keeper import Bundle
from services.adapters.once import OncePerKey
from services.common import platforms
from services.common.bus import Bus
from services.common.tasks import cancel_and_wait

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
        self.secrets: dict[str, str] = {}  # experiment → namespace of the Secret we made
        self._kube: Kubernetes | None = None
        self._bus: Bus | None = None
        self._cleaner: asyncio.Task | None = None
        self._launches: OncePerKey[TrialHandle] = OncePerKey()  # concurrent calls for one attempt: one launch
        self.watcher = Watcher(settings, self.kube, self.jobs, self.notify)

    @property
    def selector(self) -> str:
        return frameworks.replica_selector(self.settings.replica)

    def kube(self) -> Kubernetes:
        """The cluster client, made on first use: an adapter without a kubeconfig starts idle."""
        if self._kube is None:
            self._kube = Kubernetes(self.settings.kubeconfig, self.settings.request_timeout)
        return self._kube

    @property
    def bus(self) -> Bus:
        """The bus (the code store, the experiments), once started."""
        if self._bus is None:
            raise RuntimeError("the frameworkcontroller adapter is not started")
        return self._bus

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._cleaner = asyncio.create_task(self._clean_loop())

    async def stop(self) -> None:
        if self._kube is not None:
            self._kube.close()
        await self.watcher.stop()
        await cancel_and_wait([self._cleaner] if self._cleaner else [])

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
                await self._storage_key(service.storage)
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
        bin_hash, fresh = await sharefs.prepare(
            self.bus, self.bundle, root, share, request, "frameworkcontroller", self.settings
        )
        if isinstance(service.storage, AzureStorage):
            await self._secret(request.experiment_id, service)
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

    async def _storage_key(self, storage: AzureStorage) -> str:
        if storage.key_vault_name:
            try:
                from azure.identity import DefaultAzureCredential
                from azure.keyvault.secrets import SecretClient
            except ImportError:
                raise PermanentError(
                    "keyVaultName needs the Azure SDK on the adapter's host: pip install "
                    "'trialbus[azure]' (or set TRIALBUS_AZURE_STORAGE_KEY instead)"
                ) from None
            client = SecretClient(f"https://{storage.key_vault_name}.vault.azure.net", DefaultAzureCredential())
            try:
                secret = await asyncio.to_thread(client.get_secret, storage.key_vault_key)
            except Exception as exc:  # noqa: BLE001 - the SDK's errors are many; say which vault and key
                raise PermanentError(
                    f"cannot read secret {storage.key_vault_key!r} from Key Vault "
                    f"{storage.key_vault_name!r}: {type(exc).__name__}"
                ) from None
            return str(secret.value)
        if self.settings.azure_storage_key is None:
            raise PermanentError(
                "storageType azureStorage needs the storage account key: set keyVaultName and "
                "keyVaultKey, or TRIALBUS_AZURE_STORAGE_KEY on the adapter"
            )
        return self.settings.azure_storage_key.get_secret_value()

    async def _secret(self, experiment_id: str, service: FrameworkcontrollerConfig) -> None:
        """The experiment's Secret for its Azure File volume (made once; deleted when it is over)."""
        if experiment_id in self.secrets:
            return
        storage = service.storage
        assert isinstance(storage, AzureStorage)
        key = await self._storage_key(storage)
        encoded = {"azurestorageaccountname": storage.azure_account, "azurestorageaccountkey": key}
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": frameworks.secret_name(experiment_id),
                "namespace": service.namespace,
                "labels": {
                    f"{frameworks.LABEL}/experiment": experiment_id,
                    f"{frameworks.LABEL}/replica": frameworks.label_value(self.settings.replica),
                },
            },
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in encoded.items()},
        }
        await self.kube().create_secret(service.namespace, body)
        self.secrets[experiment_id] = service.namespace

    # ------------------------------------------------------------------ watching

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        return await self.watcher.poll(handle)

    async def cancel(self, handle: TrialHandle) -> None:
        await self.watcher.cancel(handle)

    # ------------------------------------------------------------------ restarts and cleaning

    async def adopt(self) -> list[TrialHandle]:
        """This replica's Frameworks of the frameworkcontroller experiments on the bus."""
        handles = []
        for state in await platforms.experiments(self.bus):
            service = state.config.service_for(self.name)
            if not isinstance(service, FrameworkcontrollerConfig):
                continue
            try:
                root = self.root(service)
                selector = f"{self.selector},{frameworks.LABEL}/experiment={state.id}"
                items, _ = await self.kube().list(service.namespace, selector)
            except (TransientError, PermanentError) as exc:
                log.warning("cannot adopt the Frameworks of experiment %s: %s", state.id, exc)
                continue
            if isinstance(service.storage, AzureStorage):
                self.secrets[state.id] = service.namespace
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

    async def _clean_loop(self) -> None:
        """Delete the Secret of each experiment that is over and has no trial running here."""
        while True:
            await asyncio.sleep(10.0)
            if not self.secrets:
                continue
            with contextlib.suppress(Exception):
                states = {s.id: s.status for s in await platforms.experiments(self.bus)}
                for experiment_id, namespace in list(self.secrets.items()):
                    running = any(j.handle.experiment_id == experiment_id for j in self.jobs)
                    if not running and states.get(experiment_id, ExperimentStatus.DONE) != ExperimentStatus.RUNNING:
                        await self.kube().delete_secret(namespace, frameworks.secret_name(experiment_id))
                        del self.secrets[experiment_id]
                        log.info("deleted the storage Secret of experiment %s", experiment_id)

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        for state in await platforms.experiments(self.bus):
            service = state.config.service_for(self.name)
            if state.id == experiment_id and isinstance(service, FrameworkcontrollerConfig):
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
