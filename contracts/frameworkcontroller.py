"""``platform: frameworkcontroller``: each trial a Kubernetes ``Framework``
(NNI's ``training_services/frameworkcontroller.py`` and ``k8s_storage.py``, v2.5+ layout).

NNI's names and rules, plus a few Trialbus extensions, each marked: the framework's and the
tasks' ``retryPolicy``, ``reportingTaskRole`` (as for OpenPAI; the first role by default),
``containerMountPath`` (where pods see the storage; NNI fixes ``/tmp/mount``),
``preparingTimeout`` and ``kueue``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from contracts.nni import NniModel, TrainingService, choose_reporting_role
from contracts.units import parse_megabytes, parse_seconds

#: What FrameworkController accepts as a Framework's or a task role's name.
K8S_NAME = re.compile(r"^[a-z0-9]{1,63}$")


class NfsStorage(NniModel):
    storage_type: Literal["nfs"]
    server: str = Field(min_length=1)
    path: str = Field(min_length=1)

    @property
    def url(self) -> str:
        """``nfs://<server><path>``: how ``TRIALBUS_SHARE_MOUNTS`` names it."""
        return f"nfs://{self.server}{self.path if self.path.startswith('/') else '/' + self.path}"


class AzureStorage(NniModel):
    storage_type: Literal["azureStorage"]
    azure_account: str = Field(min_length=3, max_length=24)
    azure_share: str = Field(min_length=3, max_length=63)
    #: The Key Vault and secret holding the account key (read by the adapter with the Azure
    #: SDK); without them the adapter's ``TRIALBUS_AZURE_STORAGE_KEY`` is used.
    key_vault_name: str | None = None
    key_vault_key: str | None = None

    @property
    def url(self) -> str:
        return f"azurefile://{self.azure_account}/{self.azure_share}"

    @model_validator(mode="after")
    def _vault(self) -> AzureStorage:
        if (self.key_vault_name is None) != (self.key_vault_key is None):
            raise ValueError("set both keyVaultName and keyVaultKey (the secret holding the storage key), or neither")
        return self


def _storage(value: Any) -> Any:
    if isinstance(value, dict):
        kind = next((v for k, v in value.items() if k.lower().replace("_", "") == "storagetype"), None)
        if kind not in ("nfs", "azureStorage"):
            raise ValueError(f"storage.storageType must be nfs or azureStorage, not {kind!r}")
    return value


class RetryPolicy(NniModel):
    """FrameworkController's retry policy (Trialbus extension; the default retries nothing)."""

    fancy_retry_policy: bool = False
    max_retry_count: int = Field(default=0, ge=-2)


class CompletionPolicy(NniModel):
    """When a task role's tasks end the attempt. NNI's key is ``minSucceedTaskCount``; the
    resource's ``minSucceededTaskCount`` is accepted too. ``minFailedTaskCount`` is at least 1
    in the Framework whatever is written here: without it, a Framework whose tasks all fail
    ends Succeeded."""

    min_failed_task_count: int = Field(default=1, ge=-1)
    min_succeed_task_count: int = Field(default=-1, ge=-1)

    @model_validator(mode="before")
    @classmethod
    def _spelling(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {
                "minSucceedTaskCount" if k.lower().replace("_", "") == "minsucceededtaskcount" else k: v
                for k, v in data.items()
            }
        return data


class Kueue(NniModel):
    """Where Kueue queues the trials' pods (Trialbus extension): see docs/platforms.md, "Kueue"."""

    #: A Kueue ``LocalQueue`` in the experiment's namespace; its ClusterQueue admits the trials.
    local_queue: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


class FrameworkcontrollerRole(NniModel):
    name: str
    docker_image: str = "msranni/nni:latest"
    task_number: int = Field(ge=1, le=10000)
    command: str = Field(min_length=1)
    gpu_number: int = Field(default=0, ge=0)
    cpu_number: int = Field(gt=0)
    #: NNI unit strings (``8gb``) or MiB.
    memory_size: str | int
    framework_attempt_completion_policy: CompletionPolicy = CompletionPolicy()
    #: Retry policy of each task (Trialbus extension).
    retry_policy: RetryPolicy | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not K8S_NAME.match(value):
            raise ValueError(
                f"task role name {value!r} must match ^[a-z0-9]{{1,63}}$ (FrameworkController's rule: "
                "lower-case letters and digits only)"
            )
        return value

    @field_validator("memory_size")
    @classmethod
    def _memory(cls, value: str | int) -> str | int:
        parse_megabytes(value)
        return value

    @property
    def memory_mb(self) -> int:
        return parse_megabytes(self.memory_size)


class FrameworkcontrollerConfig(TrainingService):
    """``platform: frameworkcontroller``: each trial attempt one ``Framework``."""

    adapter: ClassVar[str] = "frameworkcontroller"

    platform: Literal["frameworkcontroller"] = "frameworkcontroller"
    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    #: NNI requires the key but allows null; set on every pod when given.
    service_account_name: str | None = None
    storage: Annotated[NfsStorage | AzureStorage, Field(discriminator="storage_type")]
    task_roles: list[FrameworkcontrollerRole] = Field(min_length=1)
    #: NNI's default is true; Kubernetes has no submission quota, so every trial is one
    #: Framework either way and the key is accepted for compatibility.
    reuse_mode: bool = True
    #: The framework's retry policy (Trialbus extension; default: no retry).
    retry_policy: RetryPolicy | None = None
    #: The task role whose first task reports the trial's metrics and exit code (Trialbus
    #: extension); the first of ``taskRoles`` when unset. Every other task runs its command
    #: without reporting.
    reporting_task_role: str | None = None
    #: Where the pods mount the storage (Trialbus extension; NNI's fixed path by default).
    container_mount_path: str = "/tmp/mount"
    #: Seconds a Framework may stay AttemptPreparing (an image that never pulls, no room for
    #: its pods) before its trial fails (Trialbus extension; the adapter's default when unset).
    preparing_timeout: float | None = Field(default=None, gt=0)
    #: Submit the trials' pods to this Kueue LocalQueue, which admits them (Trialbus extension);
    #: unset: the adapter's ``TRIALBUS_KUEUE_LOCAL_QUEUE``, if any.
    kueue: Kueue | None = None

    _storage = field_validator("storage", mode="before")(_storage)
    _timeout = field_validator("preparing_timeout", mode="before")(lambda v: None if v is None else parse_seconds(v))

    @field_validator("container_mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path inside the pods, e.g. /tmp/mount, not {value!r}")
        return value.rstrip("/") or "/"

    @model_validator(mode="after")
    def _roles(self) -> FrameworkcontrollerConfig:
        names = [role.name for role in self.task_roles]
        if len(set(names)) != len(names):
            raise ValueError(f"task role names must differ: {', '.join(names)}")
        choose_reporting_role(self.reporting_task_role, names, "taskRoles")
        return self

    @property
    def reporting_role(self) -> FrameworkcontrollerRole:
        """``reportingTaskRole``, or the first task role (see :func:`contracts.nni.choose_reporting_role`)."""
        name = choose_reporting_role(self.reporting_task_role, [role.name for role in self.task_roles], "taskRoles")
        return next(role for role in self.task_roles if role.name == name)
