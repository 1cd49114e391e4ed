"""The experiment config, in NNI's v2 shape (``nni/experiment/config``).

Keys are matched ignoring case and underscores, as NNI does (``ssh_key_file`` =
``sshKeyFile``); unknown keys are an error that names them. Units are converted
here: durations to seconds. Each platform's ``trainingService`` model is
registered in :data:`PLATFORMS`; the others come with their adapters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    Field,
    SecretStr,
    SerializationInfo,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from contracts import sealing
from contracts.base import CLEAR, SEALED_FROM_USER, Secret
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from contracts.legacy import is_legacy, to_v2
from contracts.nni import NniModel, TrainingService, _canonical, check_reporting_role
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


class RemoteConfig(TrainingService):
    """``platform: remote``: trials on a pool of SSH machines (``training_services/remote.py``)."""

    adapter: ClassVar[str] = "remote"

    platform: Literal["remote"] = "remote"
    machine_list: list[RemoteMachineConfig] = Field(min_length=1)


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
    #: With several task roles in ``openpaiConfig``: the one whose first instance reports the
    #: trial's metrics (Trialbus extension).
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
        roles = (self.openpai_config or {}).get("taskRoles")
        if isinstance(roles, dict) and roles:
            check_reporting_role(self.reporting_task_role, list(map(str, roles)), "openpaiConfig")
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
            if isinstance(p, dict) and isinstance(p.get("auth"), dict) and "password" in p["auth"] else p
            for i, p in enumerate(shown["prerequisites"])
        ]
    return shown


def secret_paths(config: ExperimentConfig) -> list[str]:
    """Where ``config`` holds platform secrets (``trainingService.token``): what the bus
    carries sealed, so what a dispatcher without ``TRIALBUS_SECRETS_KEY`` must refuse."""
    found = [path for path, _ in sealing.secret_values(config)]
    if isinstance(service := config.training_service, OpenpaiConfig):
        _job_secrets(service.openpai_config, lambda where, v: found.append(f"trainingService.openpaiConfig.{where}"))
    return found


#: platform name → its config model. A new platform registers here.
PLATFORMS: dict[str, type[TrainingService]] = {
    "local": LocalConfig, "remote": RemoteConfig, "openpai": OpenpaiConfig,
    "frameworkcontroller": FrameworkcontrollerConfig,
}  # fmt: skip


def parse_training_service(value: Any, info: ValidationInfo) -> TrainingService:
    """The platform's model of a ``trainingService`` mapping (validated in the caller's
    context: a sealed secret is accepted only from the bus)."""
    if isinstance(value, TrainingService):
        return value
    if isinstance(value, list):
        raise ValueError("a list of training services (NNI hybrid mode) is not supported: give one trainingService")
    if not isinstance(value, dict) or "platform" not in {_canonical(k) for k in value}:
        raise ValueError("trainingService must be a mapping with a 'platform' key, e.g. {platform: local}")
    platform = next(v for k, v in value.items() if _canonical(k) == "platform")
    model = PLATFORMS.get(str(platform))
    if model is None:
        raise ValueError(f"unknown platform {platform!r}; available: {', '.join(PLATFORMS)}")
    return model.model_validate(value, context=info.context)


class ExperimentConfig(NniModel):
    """An NNI v2 experiment config (``nni/experiment/config/experiment_config.py``)."""

    experiment_name: str | None = None
    trial_command: str = Field(min_length=1)
    #: Resolved against the config file's folder by :func:`load_experiment_config`.
    trial_code_directory: str = "."
    #: ``sha256:<hex>`` of a code snapshot already in the object store (Trialbus extension).
    trial_code_ref: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    trial_concurrency: int = Field(gt=0)
    max_trial_number: int | None = Field(default=None, gt=0)
    #: Seconds; NNI unit strings like ``1h`` are accepted.
    max_experiment_duration: float | None = Field(default=None, gt=0)
    #: Seconds; a trial running longer ends EARLY_STOPPED.
    max_trial_duration: float | None = Field(default=None, gt=0)
    trial_gpu_number: int | None = Field(default=None, ge=0)
    search_space: dict[str, Any] | None = None
    search_space_file: str | None = None
    tuner: dict[str, Any] | None = None
    assessor: dict[str, Any] | None = None
    advisor: dict[str, Any] | None = None
    training_service: SerializeAsAny[TrainingService]
    #: NNI v1's ``multiThread`` (Trialbus extension in v2): the tuner is called from several threads at once.
    multi_thread: bool | None = None
    # Accepted for NNI compatibility; the manager-side settings have no effect here.
    nni_manager_ip: str | None = None
    use_annotation: bool | None = None
    debug: bool | None = None
    log_level: str | None = None
    experiment_working_directory: str | None = None
    tuner_gpu_indices: Any = None
    shared_storage: dict[str, Any] | None = None
    experiment_type: str | None = None

    _durations = field_validator("max_experiment_duration", "max_trial_duration", mode="before")(
        lambda v: None if v is None else parse_seconds(v)
    )
    _service = field_validator("training_service", mode="before")(parse_training_service)

    @model_validator(mode="before")
    @classmethod
    def _role_command(cls, data: Any) -> Any:
        """``platform: frameworkcontroller`` needs no ``trialCommand`` (each role has its
        command): it is then the reporting role's, as NNI's converter makes it."""
        if isinstance(data, dict) and not any(_canonical(k) == "trialcommand" for k in data):
            service = next((v for k, v in data.items() if _canonical(k) == "trainingservice"), None)
            if isinstance(service, dict) and service.get("platform") == "frameworkcontroller":
                roles = next((v for k, v in service.items() if _canonical(k) == "taskroles"), None)
                if isinstance(roles, list) and roles and isinstance(roles[0], dict):
                    data = {**data, "trialCommand": next((v for k, v in roles[0].items()
                                                          if _canonical(k) == "command"), None)}  # fmt: skip
        return data

    @model_validator(mode="after")
    def _nni_rules(self) -> ExperimentConfig:
        service = self.training_service
        gpus = self.trial_gpu_number if service.trial_gpu_number is None else service.trial_gpu_number
        if isinstance(service, LocalConfig):
            if gpus and service.use_active_gpu is None:
                raise ValueError(
                    "trainingService.useActiveGpu must be set when trialGpuNumber > 0; "
                    "set it to true on desktops where a GUI holds the GPU"
                )
            if service.max_trial_number_per_gpu != 1 and not gpus:
                raise ValueError("maxTrialNumberPerGpu only applies when trialGpuNumber is set")
        if isinstance(service, OpenpaiConfig) and gpus is None:
            raise ValueError("trialGpuNumber must be set for platform openpai (0 for CPU-only trials)")
        if isinstance(service, RemoteConfig) and not gpus:
            for machine in service.machine_list:
                if machine.max_trial_number_per_gpu != 1:
                    raise ValueError(
                        f"machine {machine.address}: maxTrialNumberPerGpu only applies when trialGpuNumber is set"
                    )
        return self

    @property
    def platform(self) -> str:
        return self.training_service.platform

    @property
    def adapter(self) -> str:
        """The adapter service that runs this experiment's trials."""
        return self.training_service.adapter

    @property
    def optimize_mode(self) -> str:
        """``minimize`` or ``maximize`` (NNI's default), from the tuner's (else the advisor's) ``classArgs``."""
        for section in (self.tuner, self.advisor):
            args = next((v for k, v in (section or {}).items() if _canonical(str(k)) == "classargs"), None)
            mode = next((v for k, v in (args or {}).items() if _canonical(str(k)) == "optimizemode"), None)
            if isinstance(mode, str) and mode.lower() in ("maximize", "minimize"):
                return mode.lower()
        return "maximize"

    @property
    def gpus_per_trial(self) -> int | None:
        if self.training_service.trial_gpu_number is not None:
            return self.training_service.trial_gpu_number
        return self.trial_gpu_number

    def public_json(self) -> dict[str, Any]:
        """camelCase JSON with secrets masked, for API answers and logs."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def wire_json(self) -> dict[str, Any]:
        """camelCase JSON with secrets in clear, as the user wrote them: only for a user's
        request to the dispatcher (which keeps no copy of it; it seals what it stores)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, context=CLEAR)


def load_experiment_config(path: str | Path) -> ExperimentConfig:
    """Read a YAML config file; relative paths are resolved against its folder, as NNI does."""
    path = Path(path).expanduser()
    data = _read_mapping(path, "experiment config", "be a YAML mapping")
    if is_legacy(data):  # NNI's v1 layout: converted as nnictl converts it
        data = to_v2(data)
    base = path.parent.resolve()
    for key in list(data):
        if _canonical(key) in ("trialcodedirectory", "searchspacefile") and isinstance(data[key], str):
            data[key] = str((base / Path(data[key]).expanduser()).resolve())
        if _canonical(key) in ("tuner", "assessor", "advisor") and isinstance(data[key], dict):
            data[key] = {k: str((base / Path(v).expanduser()).resolve())
                         if _canonical(str(k)) == "codedirectory" and isinstance(v, str) else v
                         for k, v in data[key].items()}  # fmt: skip
    try:
        config = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, str(path))) from None
    return read_job_template(read_key_files(config, base), base)


def _read_mapping(path: Path, what: str, must: str) -> dict[str, Any]:
    """A YAML file holding a mapping, or ValueError saying what is wrong with it."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path} must {must}")
    return data


def read_job_template(config: ExperimentConfig, base: Path | None = None) -> ExperimentConfig:
    """Load ``openpaiConfigFile`` (relative to ``base``) into ``openpaiConfig`` where the user
    runs, so that the adapter needs no copy of the file (NNI only checks that it exists)."""
    service = config.training_service
    if not isinstance(service, OpenpaiConfig) or not service.openpai_config_file:
        return config
    path = Path(service.openpai_config_file).expanduser()
    path = (base or Path.cwd()) / path if not path.is_absolute() else path
    template = _read_mapping(path, "trainingService.openpaiConfigFile", "hold a job protocol mapping")
    update = {"openpai_config": template, "openpai_config_file": None}
    return config.model_copy(update={"training_service": service.model_copy(update=update)})


def read_key_files(config: ExperimentConfig, base: Path | None = None) -> ExperimentConfig:
    """Read each remote machine's ``sshKeyFile`` (relative to ``base``, ``~`` expanded) into
    ``sshKey``, where the user runs: a missing or unreadable file is an error now, as in NNI,
    not a failed trial later on whatever host runs the adapter."""
    service = config.training_service
    if not isinstance(service, RemoteConfig):
        return config
    machines = []
    for i, machine in enumerate(service.machine_list):
        if machine.ssh_key_file and machine.ssh_key is None and machine.password is None:
            path = Path(machine.ssh_key_file).expanduser()
            path = (base or Path.cwd()) / path if not path.is_absolute() else path
            try:
                key = path.read_text()
            except OSError as exc:
                why = exc.strerror or str(exc)
                raise ValueError(
                    f"trainingService.machineList.{i}.sshKeyFile: cannot read {path} ({why}) for {machine.address}"
                ) from None
            except UnicodeDecodeError:
                raise ValueError(
                    f"trainingService.machineList.{i}.sshKeyFile: {path} is not a private key file (not text)"
                ) from None
            machine = machine.model_copy(update={"ssh_key_file": str(path), "ssh_key": SecretStr(key)})
        machines.append(machine)
    return config.model_copy(update={"training_service": service.model_copy(update={"machine_list": machines})})


def format_validation_error(exc: ValidationError, where: str = "experiment config") -> str:
    """One line per problem, naming the field in the user's own words."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return f"invalid {where}: " + "; ".join(lines)
