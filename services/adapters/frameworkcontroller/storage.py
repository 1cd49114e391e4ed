"""An Azure File share's credentials on the cluster: the storage account key, and the Secret
of each experiment that mounts the share (``storageType: azureStorage``).

The key comes from the experiment's Key Vault (``keyVaultName``/``keyVaultKey``, through the
Azure SDK on the adapter's host) or from ``TRIALBUS_AZURE_STORAGE_KEY``. The Secret is made
once per experiment, before its first Framework, labelled with the experiment and this
replica; every 10 seconds the Secret of each experiment that is over and has no trial
tracked here any more is deleted. After a restart the Secrets of the experiments adopted are
known again (:meth:`StorageSecrets.adopted`), so they are deleted in their turn.

:class:`StorageSecrets` is a part of
:class:`~services.adapters.frameworkcontroller.adapter.FrameworkcontrollerAdapter`: it owns the
Secrets made and their cleaner, and reads the :class:`~.jobs.Jobs` it is given.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable

from contracts import ExperimentStatus
from contracts.frameworkcontroller import AzureStorage, FrameworkcontrollerConfig
from services.adapters.errors import PermanentError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import Kubernetes
from services.adapters.frameworkcontroller.experiments import Experiments
from services.adapters.frameworkcontroller.jobs import Jobs
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class StorageSecrets:
    """The storage key and the experiments' Secrets (the module's docstring); ``kube``: the
    cluster client (made on first use)."""

    def __init__(
        self,
        settings: FrameworkcontrollerSettings,
        kube: Callable[[], Kubernetes],
        tracked: Jobs,
        experiments: Experiments,
    ) -> None:
        self.settings, self.kube, self.tracked, self.experiments = settings, kube, tracked, experiments
        self.made: dict[str, str] = {}  # experiment → namespace of the Secret we made
        self._cleaner: asyncio.Task | None = None

    def start(self) -> None:
        self._cleaner = asyncio.create_task(self._clean_loop())

    async def stop(self) -> None:
        await cancel_and_wait([self._cleaner] if self._cleaner else [])

    async def key(self, storage: AzureStorage) -> str:
        """The storage account key; PermanentError when the adapter cannot have it."""
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

    async def ensure(self, experiment_id: str, service: FrameworkcontrollerConfig) -> None:
        """The experiment's Secret for its Azure File volume (made once; deleted when it is over)."""
        if experiment_id in self.made:
            return
        storage = service.storage
        assert isinstance(storage, AzureStorage)
        key = await self.key(storage)
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
        self.made[experiment_id] = service.namespace

    def adopted(self, experiment_id: str, namespace: str) -> None:
        """An experiment adopted after a restart has its Secret in ``namespace``."""
        self.made[experiment_id] = namespace

    async def _clean_loop(self) -> None:
        """Delete the Secret of each experiment that is over and has no trial running here."""
        while True:
            await asyncio.sleep(10.0)
            if not self.made:
                continue
            with contextlib.suppress(Exception):
                states = await self.experiments.statuses()
                for experiment_id, namespace in list(self.made.items()):
                    running = any(j.handle.experiment_id == experiment_id for j in self.tracked)
                    if not running and states.get(experiment_id, ExperimentStatus.DONE) != ExperimentStatus.RUNNING:
                        await self.kube().delete_secret(namespace, frameworks.secret_name(experiment_id))
                        del self.made[experiment_id]
                        log.info("deleted the storage Secret of experiment %s", experiment_id)
