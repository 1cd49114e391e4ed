"""The experiment config, in NNI's v2 shape (``nni/experiment/config``).

Keys are matched ignoring case and underscores, as NNI does (``ssh_key_file`` =
``sshKeyFile``); unknown keys are an error that names them. Units are converted
here: durations to seconds. Each platform's ``trainingService`` model is in
:mod:`contracts.platforms`, registered in :data:`PLATFORMS`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, SecretStr, SerializeAsAny, ValidationError, field_validator, model_validator

from contracts import sealing
from contracts.base import CLEAR
from contracts.legacy import is_legacy, to_v2
from contracts.nni import NniModel, TrainingService, _canonical, format_validation_error
from contracts.platforms import (
    NOT_HERE,
    PLATFORMS,
    LocalConfig,
    OpenpaiConfig,
    RemoteConfig,
    RemoteMachineConfig,
    _job_secrets,
    parse_gpu_indices,
    parse_training_service,
)
from contracts.retries import RetryPolicy
from contracts.units import parse_seconds

__all__ = [
    "NOT_HERE",
    "PLATFORMS",
    "ExperimentConfig",
    "LocalConfig",
    "OpenpaiConfig",
    "RemoteConfig",
    "RemoteMachineConfig",
    "RetryPolicy",
    "TrainingService",
    "WarmStart",
    "format_validation_error",
    "load_experiment_config",
    "parse_gpu_indices",
    "parse_training_service",
    "read_job_template",
    "read_key_files",
    "secret_paths",
]


def secret_paths(config: ExperimentConfig) -> list[str]:
    """Where ``config`` holds platform secrets (``trainingService.token``): what the bus
    carries sealed, so what a dispatcher without ``TRIALBUS_SECRETS_KEY`` must refuse."""
    found = [path for path, _ in sealing.secret_values(config)]
    for i, service in enumerate(config.training_services):
        if isinstance(service, OpenpaiConfig):
            where = f"trainingService.{i}" if config.hybrid else "trainingService"
            _job_secrets(service.openpai_config, lambda at, v, w=where: found.append(f"{w}.openpaiConfig.{at}"))
    return found


def _each_service(config: ExperimentConfig, change: Any) -> ExperimentConfig:
    """``config`` with every platform section replaced by ``change(section)``."""
    services = [change(s) for s in config.training_services]
    return config.model_copy(update={"training_service": services if config.hybrid else services[0]})


class WarmStart(NniModel):
    """``warmStart: {preload: […]}`` (Trialbus extension): modules a trial's template imports
    ahead of time, beside those it learns from the trials themselves."""

    preload: list[str] = Field(default_factory=list, max_length=1000)

    @field_validator("preload")
    @classmethod
    def _module_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not _MODULE_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"not a Python module name: {bad[0]!r} (write it as an import names it, e.g. torch.nn)")
        return value


#: ``failFast``'s default: the first 3 ended trials failing the same way stop the experiment.
FAIL_FAST = 3

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


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
    #: One platform, or a list of them (NNI's hybrid mode: each trial runs on one of them).
    training_service: SerializeAsAny[TrainingService] | list[SerializeAsAny[TrainingService]]
    #: NNI v1's ``multiThread`` (Trialbus extension in v2): the tuner is called from several threads at once.
    multi_thread: bool | None = None
    #: Trialbus extension: start Python trials by forking a template process that has imported their
    #: modules already (default on; ``false`` starts every trial as a new interpreter; ``{preload: […]}``
    #: names modules to import ahead beside the ones learned from the trials). docs/warm-start.md.
    warm_start: bool | WarmStart | None = None
    #: Trialbus extension: how often a trial runs again after its attempt failed, by why it failed
    #: (docs/retries.md). Without it, infrastructure failures are retried up to 3 times, the
    #: trial's own failures are not.
    retry: RetryPolicy | None = None
    #: Trialbus extension: seconds a trial has, after SIGTERM, to save a checkpoint and exit before
    #: SIGKILL, whoever stops it (a cancel, an assessor, ``maxTrialDuration``, a drain); default:
    #: the adapter's ``killGrace`` (5 s). NNI unit strings accepted.
    trial_grace_period: float | None = Field(default=None, ge=0, le=86400)
    #: Trialbus extension: stop the experiment when its first this many ended trials all FAILED with
    #: the same last stderr line (a missing module, a typo in the command): it says why at once instead
    #: of running ``maxTrialNumber`` trials that fail alike. Default :data:`FAIL_FAST`; ``0`` or
    #: ``false`` turns it off (NNI's behaviour); a trial that succeeds turns it off for the experiment.
    #: docs/fail-fast.md.
    fail_fast: int | None = Field(default=None, ge=0, le=1000)
    #: Trialbus extension: the experiment's priority within its team (higher runs first, and may
    #: preempt the trials of the team's lower-priority experiments; docs/teams.md). NNI ignores it.
    priority: int = Field(default=0, ge=-1000, le=1000)
    # Accepted for NNI compatibility; the manager-side settings have no effect here (useAnnotation
    # and sharedStorage only unset: what they ask for is refused).
    nni_manager_ip: str | None = None
    use_annotation: bool | None = None
    debug: bool | None = None
    log_level: str | None = None
    experiment_working_directory: str | None = None
    tuner_gpu_indices: Any = None
    shared_storage: dict[str, Any] | None = None
    experiment_type: str | None = None

    _durations = field_validator("max_experiment_duration", "max_trial_duration", "trial_grace_period", mode="before")(
        lambda v: None if v is None else parse_seconds(v)
    )

    @field_validator("fail_fast", mode="before")
    @classmethod
    def _fail_fast(cls, value: object) -> object:
        if isinstance(value, bool):  # ``false`` turns it off, ``true`` is the default
            return None if value else 0
        return value

    @property
    def fail_fast_trials(self) -> int:
        """How many first ended trials failing alike stop the experiment (0: never)."""
        return FAIL_FAST if self.fail_fast is None else self.fail_fast

    @field_validator("use_annotation")
    @classmethod
    def _no_annotation(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(
                "NNI's annotation of trial code (useAnnotation: true) is not supported: read the "
                "parameters with nni.get_next_parameter() in the trial instead"
            )
        return value

    @field_validator("shared_storage")
    @classmethod
    def _no_shared_storage(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value:
            raise ValueError(
                "sharedStorage (storage NNI mounts on every machine) is not supported: mount it on the "
                "machines yourself and point the trials at it"
            )
        return value

    _service = field_validator("training_service", mode="before")(parse_training_service)

    @model_validator(mode="before")
    @classmethod
    def _role_command(cls, data: Any) -> Any:
        """``platform: frameworkcontroller`` needs no ``trialCommand`` (each role has its
        command): it is then the first role's, as NNI's converter makes it."""
        if isinstance(data, dict) and not any(_canonical(k) == "trialcommand" for k in data):
            service = next((v for k, v in data.items() if _canonical(k) == "trainingservice"), None)
            if isinstance(service, dict) and service.get("platform") == "frameworkcontroller":
                roles = next((v for k, v in service.items() if _canonical(k) == "taskroles"), None)
                if isinstance(roles, list) and roles and isinstance(roles[0], dict):
                    data = {
                        **data,
                        "trialCommand": next((v for k, v in roles[0].items() if _canonical(k) == "command"), None),
                    }
        return data

    @model_validator(mode="after")
    def _nni_rules(self) -> ExperimentConfig:
        for service in self.training_services:
            where = f"trainingService ({service.platform})" if self.hybrid else "trainingService"
            gpus = self.gpus_for(service)
            if isinstance(service, LocalConfig):
                if gpus and service.use_active_gpu is None:
                    raise ValueError(
                        f"{where}.useActiveGpu must be set when trialGpuNumber > 0; "
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
            if self.hybrid and service.trial_code_directory not in (None, self.trial_code_directory):
                raise ValueError(
                    f"{where}.trialCodeDirectory differs from trialCodeDirectory: an experiment has "
                    "one code snapshot for all its platforms; set it at the top level only"
                )
        return self

    @property
    def training_services(self) -> list[TrainingService]:
        """The platforms trials may run on: one, or those of a hybrid list in the config's order."""
        service = self.training_service
        return list(service) if isinstance(service, list) else [service]

    @property
    def hybrid(self) -> bool:
        """NNI's hybrid mode: ``trainingService`` is a list (of one platform or more)."""
        return isinstance(self.training_service, list)

    @property
    def platform(self) -> str:
        """The platform's name; a hybrid experiment's are joined with ``+`` (``local+remote``)."""
        return "+".join(s.platform for s in self.training_services)

    @property
    def adapter(self) -> str:
        """The adapter service that runs this experiment's trials; for a hybrid experiment, the
        first platform's (each trial's own is :attr:`TrialState.platform`)."""
        return self.training_services[0].adapter

    @property
    def adapters(self) -> list[str]:
        """The adapter services that may run this experiment's trials, in the config's order."""
        return [s.adapter for s in self.training_services]

    def service_for(self, adapter: str) -> TrainingService | None:
        """The section of the platform ``adapter`` runs; None when the experiment does not use it."""
        return next((s for s in self.training_services if s.adapter == adapter), None)

    def command_for(self, service: TrainingService) -> str:
        """The trial command on ``service``: its own ``trialCommand`` if it sets one (NNI's rule)."""
        return service.trial_command or self.trial_command

    def gpus_for(self, service: TrainingService) -> int | None:
        """GPUs per trial on ``service``: its own ``trialGpuNumber``, else the top-level one (NNI's rule)."""
        return self.trial_gpu_number if service.trial_gpu_number is None else service.trial_gpu_number

    @property
    def retry_policy(self) -> RetryPolicy:
        """``retry:``, or the defaults without it."""
        return self.retry or RetryPolicy()

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
        """GPUs per trial on the (first) platform."""
        return self.gpus_for(self.training_services[0])

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
        try:
            data = to_v2(data)
        except ValueError as exc:
            raise ValueError(f"invalid {path}: {exc}") from None
    base = path.parent.resolve()
    for key in list(data):
        if _canonical(key) in ("trialcodedirectory", "searchspacefile") and isinstance(data[key], str):
            data[key] = str((base / Path(data[key]).expanduser()).resolve())
        if _canonical(key) in ("tuner", "assessor", "advisor") and isinstance(data[key], dict):
            data[key] = {
                k: str((base / Path(v).expanduser()).resolve())
                if _canonical(str(k)) == "codedirectory" and isinstance(v, str)
                else v
                for k, v in data[key].items()
            }
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

    def read(service: TrainingService) -> TrainingService:
        if not isinstance(service, OpenpaiConfig) or not service.openpai_config_file:
            return service
        path = Path(service.openpai_config_file).expanduser()
        path = (base or Path.cwd()) / path if not path.is_absolute() else path
        template = _read_mapping(path, "trainingService.openpaiConfigFile", "hold a job protocol mapping")
        return service.model_copy(update={"openpai_config": template, "openpai_config_file": None})

    return _each_service(config, read)


def read_key_files(config: ExperimentConfig, base: Path | None = None) -> ExperimentConfig:
    """Read each remote machine's ``sshKeyFile`` (relative to ``base``, ``~`` expanded) into
    ``sshKey``, where the user runs: a missing or unreadable file is an error now, as in NNI,
    not a failed trial later on whatever host runs the adapter."""

    def read(service: TrainingService) -> TrainingService:
        if not isinstance(service, RemoteConfig):
            return service
        return service.model_copy(
            update={"machine_list": [_read_key(i, m, base) for i, m in enumerate(service.machine_list)]}
        )

    return _each_service(config, read)


def _read_key(i: int, machine: RemoteMachineConfig, base: Path | None) -> RemoteMachineConfig:
    if not machine.ssh_key_file or machine.ssh_key is not None or machine.password is not None:
        return machine
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
    return machine.model_copy(update={"ssh_key_file": str(path), "ssh_key": SecretStr(key)})
