"""The OpenPAI job (protocol v2) of one trial attempt, and where its files live on the share.

The job starts from the user's ``openpaiConfig`` (every field the protocol allows reaches
the cluster as written) or, without one, from the job NNI generates: one task role
``taskrole``, one instance, ``trialCpuNumber`` / ``trialMemorySize`` / ``trialGpuNumber``,
``dockerImage``, the ``storageConfigName`` storage and ``virtualCluster``. Trialbus changes
only what the trial needs: the job's ``name``, ``defaults.virtualCluster`` when the
trainingService names one and the user's job does not (NNI drops ``virtualCluster`` once there
is an ``openpaiConfig``: the job then went to the cluster's ``default``, which the adapter's
check had not looked at), and each task role's ``commands``, which
are kept (so OpenPAI still renders ``<% $parameters.x %>`` and ``<% $secrets.x %>`` in
them) but written by the task into a script that the trial keeper then runs::

    T=<container share>/trialbus/trials/<exp>/<trial>-<attempt>/$PAI_CURRENT_TASK_ROLE_NAME-<index>
    mkdir -p $T/.trialbus && C=$(mktemp) && cat > $C <<'TRIALBUS_COMMAND'
    <the role's commands, one per line>
    TRIALBUS_COMMAND
    TRIALBUS_TRIAL_DIR=$T TRIALBUS_TRIAL_COMMAND="sh $C" \\
        python3 -S -I <container share>/trialbus/bin/<hash>/trial_keeper.py --env <settings file>; \\
        S=$?; rm -f "$C"; exit $S

The script is a private temporary file of the container (``mktemp``: mode 0600), never on
the share: once OpenPAI has rendered them, the commands may hold the job's secrets.

Only the reporting role's first instance gets the settings file with the gateway and the
trial's token (``.trialbus/report.env``, 0600, never in the job spec): it alone reports the
trial's metrics, and its keeper's exit code is the trial's. Every other task runs the same
way without them (``.trialbus/quiet.env``). The reporting role is
``trainingService.reportingTaskRole`` when set, else the first of ``openpaiConfig.taskRoles``
in the order written (NNI's multi-role configs have no such key and run unchanged).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from contracts.experiment import OpenpaiConfig
from contracts.nni import choose_reporting_role
from services.adapters import sharefs, trialdir
from services.adapters.sharefs import MARK, Share

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,255}$")
_ROLE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: The reuse-mode environment runner's file name on the share (``runner.py`` here).
RUNNER = "openpai_runner.py"


def job_name(experiment_id: str, trial_id: str, attempt: int) -> str:
    """``trialbus_<experiment>_<trial>`` (``_<attempt>`` after the first: names are never freed)."""
    return _checked(f"trialbus_{experiment_id}_{trial_id}" + (f"_{attempt}" if attempt else ""))


def environment_name(experiment_id: str, environment: str) -> str:
    """``trialbus_<experiment>_env_<id>``: a reuse-mode environment's job."""
    return _checked(f"trialbus_{experiment_id}_env_{environment}")


def _checked(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"job name {name!r} does not match OpenPAI's ^[a-zA-Z0-9_-]+$ (255 characters at most)")
    return name


def reporting_role(service: OpenpaiConfig) -> str:
    """The task role whose first instance reports the trial's metrics and exit code:
    ``reportingTaskRole``, else the job's first task role; ValueError if it names no role."""
    roles = (service.openpai_config or {}).get("taskRoles")
    if isinstance(roles, dict) and roles:
        return choose_reporting_role(service.reporting_task_role, list(map(str, roles)), "openpaiConfig")
    return choose_reporting_role(service.reporting_task_role, ["taskrole"], "the job generated without openpaiConfig")


def trial_job(
    service: OpenpaiConfig,
    experiment_id: str,
    trial_id: str,
    attempt: int,
    trial_command: str,
    gpus: int,
    bin_hash: str,
) -> tuple[str, Share, dict]:
    """The name, the folders and the job of one trial attempt, with the keeper installed on the
    share under ``trialbus/bin/<bin_hash>/`` (secrets in clear: what the cluster receives)."""
    name = job_name(experiment_id, trial_id, attempt)
    local, container = service.local_storage_mount_point.rstrip("/"), service.container_storage_mount_point
    where = trialdir.attempt_dir("trialbus/trials", experiment_id, trial_id, attempt)
    share = Share(f"{local}/{where}", f"{container}/{where}")
    keeper = f"{container}/trialbus/bin/{bin_hash}/trial_keeper.py"
    return name, share, render(service, name, trial_command, gpus, share, keeper)


def environment_job(
    service: OpenpaiConfig,
    experiment_id: str,
    env_id: str,
    trial_command: str,
    gpus: int,
    bin_hash: str,
    poll: float,
    orphan: float,
) -> tuple[str, Share, dict]:
    """The name, the folders and the job of one reuse-mode environment, whose runner is
    installed on the share under ``trialbus/bin/<bin_hash>/`` (``poll``, ``orphan``: its
    ``--poll`` and ``--orphan``)."""
    name = environment_name(experiment_id, env_id)
    local, container = service.local_storage_mount_point.rstrip("/"), service.container_storage_mount_point
    where = f"trialbus/envs/{experiment_id}/{env_id}"
    share = Share(f"{local}/{where}", f"{container}/{where}")
    runner = [
        "python3",
        "-S",
        "-I",
        f"{container}/trialbus/bin/{bin_hash}/{RUNNER}",
        "--env",
        share.container,
        "--poll",
        str(poll),
        "--orphan",
        str(orphan),
    ]
    return name, share, render_environment(service, name, trial_command, gpus, share.container, runner)


def render(service: OpenpaiConfig, name: str, trial_command: str, gpus: int, share: Share, keeper: str) -> dict:
    """The job for one attempt (see the module docstring). ``keeper``: its path in the container."""
    report = reporting_role(service)
    return _job(
        service,
        name,
        trial_command,
        gpus,
        lambda role, commands: wrap(commands, role == report, share.container, keeper),
    )


def render_environment(
    service: OpenpaiConfig, name: str, trial_command: str, gpus: int, env_dir: str, runner: list[str]
) -> dict:
    """The job of one reuse-mode environment: each task writes its role's commands to a script
    and runs the environment runner (``runner``: its command line, without ``--task``), which
    runs the trials handed to the environment one after another through the keeper."""
    report = reporting_role(service)

    def run(role: str, commands: list[str]) -> list[str]:
        task = f'{env_dir}/"$PAI_CURRENT_TASK_ROLE_NAME"-"$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"'
        return [
            f'E={task} && mkdir -p "$E" && C=$(mktemp) && cat > "$C" <<\'{MARK}\'',
            *(command.strip() for command in commands),
            MARK,
            " ".join([*runner, '--task "$E" --command "$C"', *(["--reports"] if role == report else [])]),
        ]

    return _job(service, name, trial_command, gpus, run)


def _job(
    service: OpenpaiConfig, name: str, trial_command: str, gpus: int, commands_of: Callable[[str, list[str]], list[str]]
) -> dict:
    """The user's ``openpaiConfig`` (or NNI's default job) named ``name``, each task role's
    commands replaced by ``commands_of(role, commands)``."""
    if service.openpai_config is not None:
        job = copy.deepcopy(service.openpai_config)
    else:
        job = default_job(service, trial_command, gpus)
    job["name"] = name
    defaults = job.get("defaults") or {}
    if service.virtual_cluster and isinstance(defaults, dict):  # not a mapping: the server says what is wrong
        job["defaults"] = {"virtualCluster": service.virtual_cluster, **defaults}  # the job's own wins
    job.setdefault("protocolVersion", 2)
    job.setdefault("type", "job")
    roles = job.get("taskRoles") or {}
    for role, spec in roles.items():
        if not _ROLE.match(str(role)) or not isinstance(spec, dict):
            continue  # the server says what is wrong with it
        # A new mapping per role: roles written as YAML aliases of one another share one.
        commands = list(map(str, spec.get("commands") or [trial_command]))
        roles[role] = {**spec, "commands": commands_of(str(role), commands)}
    return job


def default_job(service: OpenpaiConfig, trial_command: str, gpus: int) -> dict[str, Any]:
    """The job NNI generates when there is no ``openpaiConfig`` (``paiTrainingService.ts``)."""
    job: dict[str, Any] = {
        "protocolVersion": 2,
        "type": "job",
        "jobRetryCount": 0,
        "prerequisites": [{"name": "docker_image_0", "type": "dockerimage", "uri": service.docker_image}],
        "taskRoles": {
            "taskrole": {
                "instances": 1,
                "completion": {"minFailedInstances": 1, "minSucceededInstances": -1},
                "taskRetryCount": 0,
                "dockerImage": "docker_image_0",
                "resourcePerInstance": {
                    "gpu": gpus,
                    "cpu": service.trial_cpu_number,
                    "memoryMB": service.trial_memory_mb,
                },
                "commands": [trial_command],
            }
        },
        "extras": {"storages": [{"name": service.storage_config_name}], "submitFrom": "trialbus"},
    }
    return job  # defaults.virtualCluster: added by _job, as to the user's job


def wrap(commands: list[str], reports: bool, trial_dir: str, keeper: str) -> list[str]:
    """The task's commands run under the keeper (see the module docstring)."""
    return sharefs.wrap(
        commands, reports, trial_dir, keeper, "PAI_CURRENT_TASK_ROLE_NAME", "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"
    )
