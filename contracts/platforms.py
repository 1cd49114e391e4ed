"""The platforms of NNI's ``trainingService`` (``nni/experiment/config/training_services``):
one model per platform, registered in :data:`PLATFORMS`, and :func:`parse_training_service`,
which reads one section or a list of them (NNI's hybrid mode).

Keys are matched as everywhere in the config (:class:`~contracts.nni.NniModel`); the
frameworkcontroller model is in :mod:`contracts.frameworkcontroller`.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal, TypeAlias

from pydantic import (
    Field,
    SerializationInfo,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from contracts import sealing
from contracts.base import SEALED_FROM_USER, Secret
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from contracts.nni import NniModel, TrainingService, _canonical, choose_reporting_role, format_validation_error
from contracts.teams import POOL, POOL_RULE
from contracts.units import parse_megabytes, parse_seconds


def parse_gpu_indices(value: Any) -> list[int] | None:
    """NNI accepts a list, an int or ``"0,2"``; the result is a list without duplicates."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("gpuIndices must be a list of integers, an integer or a string like '0,2'")
    if isinstance(value, int):
        indices = [value]
    elif isinstance(value, str):
        try:
            indices = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"gpuIndices {value!r} is not a comma-separated list of integers") from None
    elif isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        indices = list(value)
    else:
        raise ValueError("gpuIndices must be a list of integers, an integer or a string like '0,2'")
    if any(i < 0 for i in indices):
        raise ValueError(f"gpuIndices {indices} contains a negative index")
    if len(set(indices)) != len(indices):
        raise ValueError(f"gpuIndices {indices} contains duplicates")
    return indices


class LocalConfig(TrainingService):
    """``platform: local``: trials as processes on the adapter's host (``training_services/local.py``)."""

    adapter: ClassVar[str] = "local-gpu"

    platform: Literal["local"] = "local"
    use_active_gpu: bool | None = None
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    gpu_indices: list[int] | None = None

    _gpu_indices = field_validator("gpu_indices", mode="before")(parse_gpu_indices)


def _string_secret(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise ValueError("must be a string: quote it in YAML (password: '12345')")
    return value


class RemoteMachineConfig(NniModel):
    """One SSH machine of ``platform: remote`` (``training_services/remote.py``)."""

    host: str = Field(min_length=1)
    port: int = Field(default=22, gt=0, lt=65536)
    user: str = Field(min_length=1)
    #: With a password, ``sshKeyFile`` is ignored (NNI's rule).
    password: Secret | None = None
    #: A private key file where the config is loaded; unset: ssh-agent and the default keys.
    ssh_key_file: str | None = None
    #: The key itself (Trialbus extension): what ``load_experiment_config`` reads
    #: ``sshKeyFile`` into, so an adapter on another host needs no copy of the file.
    ssh_key: Secret | None = None
    ssh_passphrase: Secret | None = None
    use_active_gpu: bool = False
    max_trial_number_per_gpu: int = Field(default=1, gt=0)
    gpu_indices: list[int] | None = None
    #: A directory put first on the trial's PATH (where its ``python3`` is).
    python_path: str | None = None

    _gpu_indices = field_validator("gpu_indices", mode="before")(parse_gpu_indices)
    _secrets = field_validator("password", "ssh_passphrase", "ssh_key", mode="before")(_string_secret)

    @model_validator(mode="after")
    def _password_wins(self) -> RemoteMachineConfig:
        if self.password is not None and (self.ssh_key_file or self.ssh_key):
            return self.model_copy(update={"ssh_key_file": None, "ssh_key": None})
        return self

    @property
    def address(self) -> str:
        """``user@host:port``, how people name the machine (no secret in it)."""
        return f"{self.user}@{self.host}:{self.port}"


class CheckpointSyncConfig(NniModel):
    """``checkpointSync:`` of ``platform: remote`` (a Trialbus key): each trial's checkpoint directory
    is copied from its machine to the bus (a JetStream object store) while it runs, so that a retry
    on another machine resumes from it (docs/retries.md). ``false`` turns it off; ``true``, or no key,
    keeps it on with these defaults."""

    enabled: bool = True
    #: The largest checkpoint directory copied, in MiB; NNI size strings like ``1gb`` or ``512mb``
    #: are accepted. A larger one stays on its machine (the adapter logs a warning once per attempt).
    max_size: int = Field(default=1024, gt=0)
    #: Seconds between two looks at a running trial's checkpoint directory (it is copied when it
    #: changed, and once more when the attempt ends); ``30s``, ``5m`` work. Unset: the adapter's
    #: ``TRIALBUS_CHECKPOINT_SYNC_INTERVAL`` (60 s).
    interval: float | None = Field(default=None, ge=1)

    _size = field_validator("max_size", mode="before")(parse_megabytes)
    _interval = field_validator("interval", mode="before")(lambda v: None if v is None else parse_seconds(v))


class RemoteConfig(TrainingService):
    """``platform: remote``: trials on a pool of SSH machines (``training_services/remote.py``)."""

    adapter: ClassVar[str] = "remote"

    platform: Literal["remote"] = "remote"
    machine_list: list[RemoteMachineConfig] = Field(min_length=1)
    #: Copy each trial's checkpoint directory through the bus (Trialbus extension); unset: on, with
    #: :class:`CheckpointSyncConfig`'s defaults; ``false``: off (a retry on another machine starts without it).
    checkpoint_sync: CheckpointSyncConfig | None = None
    #: The pool its machines are shared in between teams (Trialbus extension): their quotas on
    #: ``remote/<pool>`` share the GPUs of the machines every experiment naming it lists; unset:
    #: the remote adapter's whole capacity (docs/teams.md).
    pool: str | None = None

    @field_validator("checkpoint_sync", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @field_validator("pool")
    @classmethod
    def _pool(cls, value: str | None) -> str | None:
        if value is not None and not POOL.match(value):
            raise ValueError(f"pool {value!r} is not a valid name: {POOL_RULE}")
        return value

    @property
    def checkpoints(self) -> CheckpointSyncConfig | None:
        """How checkpoints are copied for this experiment; None when they are not."""
        sync = self.checkpoint_sync or CheckpointSyncConfig()
        return sync if sync.enabled else None


class OpenpaiConfig(TrainingService):
    """``platform: openpai``: each trial an OpenPAI job (``training_services/openpai.py``)."""

    adapter: ClassVar[str] = "openpai"

    platform: Literal["openpai"] = "openpai"
    #: The cluster's address; ``https://`` is put in front when it names no scheme (NNI's rule).
    host: str = Field(min_length=1)
    username: str = Field(min_length=1)
    #: A bearer token (an application token is best: it never expires).
    token: Secret
    trial_cpu_number: int = Field(gt=0)
    #: NNI unit strings (``8gb``, ``512mb``) or MiB.
    trial_memory_size: str | int
    docker_image: str = "msranni/nni:latest"
    #: NNI requires the key but allows null: the cluster's ``default`` then.
    virtual_cluster: str | None = None
    storage_config_name: str = Field(min_length=1)
    #: Where the share is mounted on the adapter's host (checked there, when the experiment is created).
    local_storage_mount_point: str = Field(min_length=1)
    #: Where the same share is mounted inside the job's containers.
    container_storage_mount_point: str = Field(min_length=1)
    #: An OpenPAI job protocol v2 document the trial's job starts from (any field the protocol allows).
    #: Left out of repr: its ``secrets`` and registry passwords are secrets.
    openpai_config: dict[str, Any] | None = Field(default=None, repr=False)
    #: The same, from a YAML file: read where the config is loaded (NNI only validates it).
    openpai_config_file: str | None = None
    #: The task role whose first instance reports the trial's metrics and exit code (Trialbus
    #: extension); the first role of ``openpaiConfig.taskRoles`` when unset. Every other task
    #: runs its commands without reporting.
    reporting_task_role: str | None = None

    @field_validator("host")
    @classmethod
    def _scheme(cls, value: str) -> str:
        return value.rstrip("/") if "://" in value else "https://" + value.rstrip("/")

    @field_validator("openpai_config")
    @classmethod
    def _unseal(cls, template: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        """The job's secrets as :data:`~contracts.base.Secret` fields are read: unsealed from
        the bus with a key, kept sealed without one, refused sealed from a user."""
        from_bus = (info.context or {}).get("from_bus")

        def unseal(where: str, value: Any) -> Any:
            if not sealing.is_sealed(value):
                return value
            if not from_bus:
                raise ValueError(f"openpaiConfig.{where}: {SEALED_FROM_USER}")
            try:
                return json.loads(sealing.unseal(value)) if sealing.installed() else value
            except sealing.SealingError:
                return value  # a wrong key: the adapter fails the trial with why (sealing.unreadable)

        return _job_secrets(template, unseal)

    @field_serializer("openpai_config", when_used="json")
    def _mask(self, template: dict[str, Any] | None, info: SerializationInfo) -> dict[str, Any] | None:
        """The job's ``secrets`` and registry passwords as OpenPAI itself shows them (``******``);
        sealed on the bus; in clear only in a user's request to the dispatcher."""
        context = info.context or {}
        if context.get("clear_secrets"):
            return template
        if context.get("reveal_secrets"):
            return _job_secrets(template, lambda _, v: v if sealing.is_sealed(v) else sealing.seal(json.dumps(v)))
        return _job_secrets(template, lambda _, v: "******")

    @field_validator("container_storage_mount_point")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path inside the container, e.g. /mnt/share, not {value!r}")
        return value.rstrip("/") or "/"

    @field_validator("trial_memory_size")
    @classmethod
    def _memory(cls, value: str | int) -> str | int:
        parse_megabytes(value)  # refuse what cannot be read, with the reason
        return value

    @model_validator(mode="after")
    def _one_job_template(self) -> OpenpaiConfig:
        if self.openpai_config is not None and self.openpai_config_file:
            raise ValueError("set openpaiConfig or openpaiConfigFile, not both")
        # The reporting role: reportingTaskRole or the first task role (a file is checked once read).
        roles = (self.openpai_config or {}).get("taskRoles")
        if isinstance(roles, dict) and roles:
            choose_reporting_role(self.reporting_task_role, list(map(str, roles)), "openpaiConfig")
        elif self.openpai_config is None and not self.openpai_config_file:  # NNI's job: one role, taskrole
            choose_reporting_role(self.reporting_task_role, ["taskrole"], "the job generated without openpaiConfig")
        return self

    @property
    def trial_memory_mb(self) -> int:
        return parse_megabytes(self.trial_memory_size)


def _job_secrets(template: dict[str, Any] | None, change: Any) -> dict[str, Any] | None:
    """``template`` with its job ``secrets`` and each prerequisite's registry password
    replaced by ``change(where, value)``; the template itself is left as it is."""
    if template is None:
        return None
    shown = dict(template)
    if "secrets" in shown:
        shown["secrets"] = change("secrets", shown["secrets"])
    if isinstance(shown.get("prerequisites"), list):
        shown["prerequisites"] = [
            {**p, "auth": {**p["auth"], "password": change(f"prerequisites.{i}.auth.password", p["auth"]["password"])}}
            if isinstance(p, dict) and isinstance(p.get("auth"), dict) and "password" in p["auth"]
            else p
            for i, p in enumerate(shown["prerequisites"])
        ]
    return shown


#: platform name → its config model. A new platform registers here.
PLATFORMS: dict[str, type[TrainingService]] = {
    "local": LocalConfig,
    "remote": RemoteConfig,
    "openpai": OpenpaiConfig,
    "frameworkcontroller": FrameworkcontrollerConfig,
}


#: NNI platforms Trialbus has no adapter for: named in the error when a config asks for one.
NOT_HERE = ("aml", "dlc", "dlts", "kubeflow", "adl", "paiYarn", "pai_yarn")


#: What :func:`parse_training_service` returns: a list nested in a hybrid list is parsed as one too, and left for
#: the field's own type (a service or a list of them) to reject.
ParsedService: TypeAlias = "TrainingService | list[ParsedService]"


def parse_training_service(value: Any, info: ValidationInfo) -> ParsedService:
    """The platform's model of a ``trainingService`` mapping, or of each in a list (NNI's
    hybrid mode), validated in the caller's context: a sealed secret is accepted only from the bus."""
    if isinstance(value, TrainingService):
        return value
    if isinstance(value, list):
        return _parse_hybrid(value, info)
    if not isinstance(value, dict) or "platform" not in {_canonical(k) for k in value}:
        raise ValueError(
            "trainingService must be a mapping with a 'platform' key, e.g. {platform: local}, "
            "or a list of them (NNI's hybrid mode)"
        )
    platform = next(v for k, v in value.items() if _canonical(k) == "platform")
    model = PLATFORMS.get(str(platform))
    if model is None:
        if str(platform) in NOT_HERE:
            raise ValueError(
                f"platform {platform!r} is not available in Trialbus; the platforms are {', '.join(PLATFORMS)}"
            )
        raise ValueError(f"unknown platform {platform!r}; available: {', '.join(PLATFORMS)}")
    return model.model_validate(value, context=info.context)


def _parse_hybrid(value: list[Any], info: ValidationInfo) -> list[ParsedService]:
    """NNI's hybrid mode: each trial runs on one of the listed platforms (the dispatcher chooses)."""
    if not value:
        raise ValueError("trainingService is an empty list: name at least one platform")
    platforms = [
        next((v for k, v in item.items() if _canonical(k) == "platform"), None)
        if isinstance(item, dict)
        else getattr(item, "platform", None)
        for item in value
    ]
    missing = [str(p) for p in platforms if p is not None and str(p) not in PLATFORMS]
    if missing:
        raise ValueError(
            f"trainingService lists platform(s) {', '.join(missing)} that Trialbus does not have; "
            f"a hybrid list may hold {', '.join(PLATFORMS)}"
        )
    twice = sorted({str(p) for p in platforms if p is not None and platforms.count(p) > 1})
    if twice:
        raise ValueError(
            f"trainingService lists platform {', '.join(twice)} more than once: give each platform one "
            "section (all SSH machines in one machineList)"
        )
    services: list[ParsedService] = []
    for i, item in enumerate(value):
        try:
            services.append(parse_training_service(item, info))
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, f"trainingService item {i} ({platforms[i]})")) from None
        except ValueError as exc:
            raise ValueError(f"item {i}: {exc}") from None
    return services
