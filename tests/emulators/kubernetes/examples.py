"""Framework (and Kueue queue) bodies for tests: small builders, so a test states only what it
cares about.

Everything the CRD leaves to Go zero values is spelled out where it matters: ``task_role`` sets
``minFailedTaskCount: 1`` unless told otherwise (without it a Framework whose tasks all fail
still succeeds, B.3).
"""

from __future__ import annotations

from typing import Any

from .kueue import CLUSTERQUEUES, LOCALQUEUES
from .resources import FRAMEWORKS


def task_role(
    name: str,
    command: str,
    count: int = 1,
    policy: tuple[int, int] | None = (1, -1),
    retry: dict[str, Any] | None = None,
    image: str = "busybox",
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A task role of ``count`` tasks whose one container runs ``sh -c command``.

    As in Kubernetes, ``$(VAR)`` in the command is expanded and ``$$`` means ``$``: the shell's own
    pid is ``$$$$``. ``policy`` is (minFailedTaskCount, minSucceededTaskCount), None to leave it out;
    ``retry`` the task's retryPolicy.
    """
    container = {
        "name": "main",
        "image": image,
        "command": ["sh", "-c", command],
        "volumeMounts": mounts or [],
        "resources": {"limits": {"cpu": "1", "memory": "512Mi", "nvidia.com/gpu": 1}},
    }
    spec: dict[str, Any] = {
        "name": name,
        "taskNumber": count,
        "task": {"pod": {"spec": {"restartPolicy": "Never", "volumes": volumes or [], "containers": [container]}}},
    }
    if policy is not None:
        spec["frameworkAttemptCompletionPolicy"] = {"minFailedTaskCount": policy[0], "minSucceededTaskCount": policy[1]}
    if retry is not None:
        spec["task"]["retryPolicy"] = retry
    return spec


def framework(
    name: str,
    *roles: dict[str, Any],
    execution: str = "Start",
    retry: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Framework with these task roles; ``retry`` is the framework's retryPolicy."""
    spec: dict[str, Any] = {"executionType": execution, "taskRoles": list(roles)}
    if retry is not None:
        spec["retryPolicy"] = retry
    return {
        "apiVersion": FRAMEWORKS.api_version,
        "kind": FRAMEWORKS.kind,
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def cluster_queue(name: str, **quota: int | str) -> dict[str, Any]:
    """A Kueue ClusterQueue with one flavor (``default-flavor``) and a nominal quota per resource:
    ``cluster_queue("cq", cpu=4, memory="8Gi", gpu=1)`` (``gpu`` is ``nvidia.com/gpu``)."""
    names = {k: "nvidia.com/gpu" if k == "gpu" else k for k in quota}
    resources = [{"name": names[k], "nominalQuota": str(v)} for k, v in quota.items()]
    flavor = {"name": "default-flavor", "resources": resources}
    return {
        "apiVersion": CLUSTERQUEUES.api_version,
        "kind": CLUSTERQUEUES.kind,
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": list(names.values()), "flavors": [flavor]}],
        },
    }


def local_queue(name: str, cluster_queue: str) -> dict[str, Any]:
    """A Kueue LocalQueue that sends its workloads to ``cluster_queue``."""
    return {
        "apiVersion": LOCALQUEUES.api_version,
        "kind": LOCALQUEUES.kind,
        "metadata": {"name": name},
        "spec": {"clusterQueue": cluster_queue},
    }
