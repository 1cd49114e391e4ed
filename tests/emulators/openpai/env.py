"""The environment of a task, as OpenPAI builds it (reference A.7).

Three sources, kept apart because they name task roles differently:

* the rest-server (``models/v2/job/runtime-env.js``) uses the task role names as written in
  the job: PAI_TASK_ROLE_LIST, PAI_TASK_ROLE_TASK_COUNT_<role>, PAI_RESOURCE_<role>, ...;
* FrameworkController only knows the converted names (lower case, alphanumerics only), and the
  pod annotations give PAI_CURRENT_TASK_ROLE_NAME and the FC_* variables from them;
* openpai-runtime's ``framework_parser.py`` (after the barrier) also uses the converted names:
  PAI_HOST_IP_<role>_<i>, PAI_PORT_LIST_<role>_<i>_<label>, PAI_TASK_ROLE_<role>_HOST_LIST, ...

Ports are real free ports on 127.0.0.1 rather than PAI's hashed ones, so a task can listen on
them. PAI_WORK_DIR is the task's own directory (``/usr/local/pai`` in a container).
"""

from __future__ import annotations

import re
import socket
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from .render import js_str

if TYPE_CHECKING:
    from .runner import Attempt, Job, Task

HOST_IP = "127.0.0.1"


def convert_name(name: str) -> str:
    """``k8s.js`` ``convertName``: the task role name FrameworkController sees."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def allocate_ports(labels: dict[str, int]) -> dict[str, list[int]]:
    """``count`` distinct free ports per label (all sockets held open until every port is chosen)."""
    with ExitStack() as stack:
        ports: dict[str, list[int]] = {}
        for label, count in labels.items():
            ports[label] = []
            for _ in range(count):
                s = stack.enter_context(socket.socket())
                s.bind((HOST_IP, 0))
                ports[label].append(s.getsockname()[1])
        return ports


def _join(ports: list[int]) -> str:
    return ",".join(str(p) for p in ports)


def completion_policy(role: dict[str, Any]) -> tuple[int, int]:
    """(minFailedTaskCount, minSucceededTaskCount) as ``k8s.js`` fills them: falsy values take the default."""
    completion = role.get("completion") or {}
    instances = role.get("instances") or 1
    return completion.get("minFailedInstances") or 1, completion.get("minSucceededInstances") or instances


def _rest_server_env(job: Job) -> dict[str, str]:
    roles = job.config["taskRoles"]
    env = {
        "PAI_FRAMEWORK_NAME": job.framework_name,
        "PAI_JOB_NAME": job.framework_name,
        "PAI_USER_NAME": job.user,
        "PAI_DEFAULT_FS_URI": "",
        "PAI_TASK_ROLE_COUNT": str(len(roles)),
        "PAI_TASK_ROLE_LIST": ",".join(roles),
        "PAI_VIRTUAL_CLUSTER": job.virtual_cluster,
    }
    for name, role in roles.items():
        resources = role["resourcePerInstance"]
        shm = (role.get("extraContainerOptions") or {}).get("shmMB", 0)
        min_failed, min_succeeded = completion_policy(role)
        env[f"PAI_TASK_ROLE_TASK_COUNT_{name}"] = js_str(role.get("instances") or 1)
        resource = (resources["gpu"], resources["cpu"], resources["memoryMB"], shm)
        env[f"PAI_RESOURCE_{name}"] = ",".join("" if v is None else js_str(v) for v in resource)  # Array.join
        env[f"PAI_MIN_FAILED_TASK_COUNT_{name}"] = js_str(min_failed)
        env[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{name}"] = js_str(min_succeeded)
    total = sum(int(role.get("instances") or 1) for role in roles.values())
    env |= {
        "PAI_USERNAME": job.user,
        "PAI_TASKS_NUM": str(total),
        "PAI_JOB_TASK_COUNT": str(total),
        "PAI_TASK_ROLES_NUM": str(len(roles)),
        "PAI_JOB_TASK_ROLE_COUNT": str(len(roles)),
        "PAI_JOB_TASK_ROLE_LIST": ",".join(roles),
    }
    return env


def _runtime_env(attempt: Attempt, current: Task) -> dict[str, str]:
    env: dict[str, str] = {}
    instances = []
    for role, tasks in attempt.tasks.items():
        fc_role = convert_name(role)
        hosts = []
        for task in tasks:
            instances.append(f"{fc_role}:{task.index}")
            for label, ports in task.ports.items():
                env[f"PAI_PORT_LIST_{fc_role}_{task.index}_{label}"] = _join(ports)
                env[f"PAI_{fc_role}_{task.index}_{label}_PORT"] = _join(ports)
            env[f"PAI_HOST_IP_{fc_role}_{task.index}"] = HOST_IP
            hosts.append(f"{HOST_IP}:{task.ports['http'][0]}")
        env[f"PAI_TASK_ROLE_{fc_role}_HOST_LIST"] = ",".join(hosts)
    env["PAI_TASK_ROLE_INSTANCES"] = ",".join(instances)
    env |= {
        "PAI_CURRENT_CONTAINER_IP": HOST_IP,
        "PAI_CURRENT_CONTAINER_PORT": str(current.ports["http"][0]),
        "PAI_CONTAINER_HOST_IP": HOST_IP,
        "PAI_CONTAINER_HOST_PORT": str(current.ports["http"][0]),
        "PAI_CONTAINER_SSH_PORT": str(current.ports["ssh"][0]),
        "PAI_CONTAINER_HOST_PORT_LIST": "".join(f"{label}:{_join(p)};" for label, p in current.ports.items()),
    }
    for label, ports in current.ports.items():
        env[f"PAI_CONTAINER_HOST_{label}_PORT_LIST"] = _join(ports)
    return env


def task_env(job: Job, attempt: Attempt, task: Task) -> dict[str, str]:
    """Every variable OpenPAI sets in this task's container (on top of the emulator's own environment)."""
    fc_role = convert_name(task.role)
    env = _rest_server_env(job)
    env |= {
        "PAI_CURRENT_TASK_ROLE_NAME": fc_role,
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(task.index),
        "PAI_TASK_INDEX": str(task.index),
        "FC_FRAMEWORK_NAMESPACE": "default",
        "FC_FRAMEWORK_NAME": job.debug_id,
        "FC_TASKROLE_NAME": fc_role,
        "FC_TASK_INDEX": str(task.index),
        "FC_CONFIGMAP_NAME": f"{job.debug_id}-attempt",
        "FC_POD_NAME": f"{job.debug_id}-{fc_role}-{task.index}",
        "FC_FRAMEWORK_ATTEMPT_ID": str(attempt.id),
        "FC_FRAMEWORK_ATTEMPT_INSTANCE_UID": attempt.uid,
        "FC_TASK_UID": task.uid,
        "FC_TASK_ATTEMPT_ID": str(task.attempt_id),
        "FC_POD_UID": task.pod_uid,
        "FC_TASK_ATTEMPT_INSTANCE_UID": f"{task.attempt_id}_{task.pod_uid}",
    }
    env |= _runtime_env(attempt, task)
    env["PAI_WORK_DIR"] = str(task.dir)
    if job.config["taskRoles"][task.role]["resourcePerInstance"]["gpu"] == 0:
        env["NVIDIA_VISIBLE_DEVICES"] = "none"
    return env
