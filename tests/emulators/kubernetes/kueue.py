"""Enough of Kueue (``kueue.x-k8s.io/v1beta1``) to queue plain pods, when the emulator runs with
``kueue=True`` (``--kueue``).

Objects: ``LocalQueue`` (namespaced; ``spec.clusterQueue``) and ``ClusterQueue`` (cluster-wide;
``spec.resourceGroups[].coveredResources`` and ``flavors[].resources[].{name, nominalQuota}``),
served with the verbs of the other resources (``api.py``) and announced by discovery, so a client
finds Kueue installed the way ``kubectl api-resources`` does.

Kueue's plain-Pod integration, as a simple honest model (:class:`Admission`):

- The webhook: a pod created with the label ``kueue.x-k8s.io/queue-name`` gets the scheduling
  gate ``kueue.x-k8s.io/admission`` and the label ``kueue.x-k8s.io/managed: "true"``, whether
  the LocalQueue exists or not (as in Kueue, where a workload of a missing LocalQueue stays
  inadmissible and its pods gated). A gated pod does not start (its FC task stays
  AttemptPreparing) and is listed with ``status.phase: Pending`` and the condition
  ``PodScheduled: False, reason SchedulingGated``.
- A workload is a pod group (the label ``kueue.x-k8s.io/pod-group-name`` in a namespace, sized by
  the annotation ``kueue.x-k8s.io/pod-group-total-count``) or a lone pod; a group is considered
  once that many pods exist. What it asks for: the sum of its pods' container requests
  (``cpu``, ``memory``, ``nvidia.com/gpu``, any other name; a limit without its request counts as
  the request, as Kubernetes defaults it) plus ``pods``, one per pod, where the ClusterQueue
  covers ``pods``.
- Every controller tick the pending workloads are considered oldest first (BestEffortFIFO: one
  that does not fit does not block a later one). One is admitted when its LocalQueue and that
  queue's ClusterQueue exist, the ClusterQueue covers every resource it asks for, and for each
  covered resource what the admitted workloads hold plus what it asks stays within the sum of
  the resource's ``nominalQuota`` over the flavors. Admitting removes the gate from all its pods.
- A workload holds its quota until none of its pods runs or waits any more (each exited, or
  gone: its Framework stopped, deleted or completed). A pod that joins an admitted group
  (FrameworkController replacing a failed task's pod under the same name) is ungated at once,
  within the group's quota; once every pod of a group has ended, a new pod of that group
  starts a new workload.
- Not modelled: cohorts and borrowing, preemption, priorities, flavor assignment (the flavors'
  quotas are summed), namespace selectors, admission checks, ``retriable-in-group`` (a group
  here always ends with its last pod).

The ClusterQueue's ``status`` says ``pendingWorkloads`` and ``admittedWorkloads`` (written when
they change).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from . import status
from .pods import Pod
from .resources import VERBS, Resource
from .store import Obj, Store

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
LOCALQUEUES = Resource(GROUP, VERSION, "localqueues", "localqueue", "LocalQueue", VERBS, ("queue", "queues", "lq"))
CLUSTERQUEUES = Resource(
    GROUP, VERSION, "clusterqueues", "clusterqueue", "ClusterQueue", VERBS, ("cq",), namespaced=False
)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
GATE = "kueue.x-k8s.io/admission"

_QUANTITY = re.compile(r"^([0-9.]+)(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_FACTOR |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: Any) -> float:
    """A Kubernetes quantity (``2``, ``500m``, ``8Gi``) as a number."""
    m = _QUANTITY.match(str(value).strip())
    if m is None:
        raise ValueError(f"quantities must match the regular expression {_QUANTITY.pattern!r}: {value!r}")
    return float(m[1]) * _FACTOR[m[2]]


def check(res: Resource, obj: Obj) -> None:
    """The validation a LocalQueue or ClusterQueue gets (422 with the field that is wrong)."""
    spec = obj.get("spec") or {}
    name = obj["metadata"].get("name", "")
    if res is LOCALQUEUES and not isinstance(spec.get("clusterQueue"), str):
        raise status.invalid(res, name, [status.cause("spec.clusterQueue", "Required value", "FieldValueRequired")])
    if res is CLUSTERQUEUES:
        for group in spec.get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for resource in flavor.get("resources") or []:
                    try:
                        quantity(resource.get("nominalQuota"))
                    except ValueError as exc:
                        cause = status.cause("spec.resourceGroups.flavors.resources.nominalQuota", str(exc))
                        raise status.invalid(res, name, [cause]) from None


def gate(pod: Pod) -> None:
    """Kueue's pod webhook, at creation: a pod with the queue label is gated and marked managed."""
    labels = pod.metadata.setdefault("labels", {})
    if QUEUE_LABEL in labels:
        labels[MANAGED_LABEL] = "true"
        pod.spec.setdefault("schedulingGates", []).append({"name": GATE})


def ungate(pod: Pod) -> None:
    pod.spec["schedulingGates"] = [g for g in pod.spec.get("schedulingGates") or [] if g.get("name") != GATE]
    if not pod.spec["schedulingGates"]:
        del pod.spec["schedulingGates"]


def gated(pod: Pod) -> bool:
    return any(g.get("name") == GATE for g in pod.spec.get("schedulingGates") or [])


@dataclass
class Workload:
    """A pod group or a lone pod, in its namespace's LocalQueue."""

    namespace: str
    queue: str
    total: int
    pods: dict[str, Pod] = field(default_factory=dict)  # by uid
    admitted_to: str | None = None  # the ClusterQueue whose quota it holds
    asks: dict[str, float] = field(default_factory=dict)  # fixed at admission

    def requests(self) -> dict[str, float]:
        asked: dict[str, float] = {"pods": float(len(self.pods))}
        for pod in self.pods.values():
            for container in pod.spec.get("containers") or []:
                resources = container.get("resources") or {}
                # Kubernetes defaults a request missing beside its limit to the limit.
                wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
                for name, value in wanted.items():
                    asked[name] = asked.get(name, 0.0) + quantity(value)
        return asked


class Admission:
    """Kueue's scheduler over the pods that exist (the module's docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.workloads: dict[tuple[str, str], Workload] = {}  # (namespace, group or pod uid), oldest first

    def tick(self, pods: list[Pod]) -> None:
        """Gather the queued pods into workloads, release the finished ones, admit what fits."""
        existing = {pod.uid: pod for pod in pods}
        for pod in pods:
            labels = pod.metadata.get("labels") or {}
            if QUEUE_LABEL not in labels or any(pod.uid in w.pods for w in self.workloads.values()):
                continue
            group = labels.get(GROUP_LABEL)
            total = int((pod.metadata.get("annotations") or {}).get(TOTAL_ANNOTATION) or 1) if group else 1
            key = (pod.namespace, group or pod.uid)
            workload = self.workloads.setdefault(key, Workload(pod.namespace, labels[QUEUE_LABEL], total))
            workload.pods[pod.uid] = pod
            if workload.admitted_to is not None:  # a replacement pod: within the group's admission
                ungate(pod)
        for key, workload in list(self.workloads.items()):
            holding = [p for uid, p in workload.pods.items() if uid in existing and (p.alive or not p.started)]
            if not holding:
                del self.workloads[key]
        usage: dict[str, dict[str, float]] = {}
        for workload in self.workloads.values():
            if workload.admitted_to is not None:
                held = usage.setdefault(workload.admitted_to, {})
                for name, amount in workload.asks.items():
                    held[name] = held.get(name, 0.0) + amount
        for workload in self.workloads.values():
            if workload.admitted_to is None and len(workload.pods) >= workload.total:
                self._try_admit(workload, usage)
        self._write_status(usage)

    def _try_admit(self, workload: Workload, usage: dict[str, dict[str, float]]) -> None:
        local = self.store.get(LOCALQUEUES, workload.namespace, workload.queue)
        if local is None:
            return
        name = (local.get("spec") or {}).get("clusterQueue", "")
        cluster = self.store.get(CLUSTERQUEUES, "", name)
        if cluster is None:
            return
        quota = nominal_quota(cluster)
        asks = workload.requests()
        if "pods" not in quota:  # Kueue counts pods only in a ClusterQueue that covers them
            del asks["pods"]
        held = usage.setdefault(name, {})
        for resource, amount in asks.items():
            if amount and (resource not in quota or held.get(resource, 0.0) + amount > quota[resource] + 1e-9):
                return
        for resource, amount in asks.items():
            held[resource] = held.get(resource, 0.0) + amount
        workload.admitted_to, workload.asks = name, asks
        for pod in workload.pods.values():
            ungate(pod)

    def _write_status(self, usage: dict[str, dict[str, float]]) -> None:
        for cluster in self.store.list(CLUSTERQUEUES, None, lambda _: True):
            name = cluster["metadata"]["name"]
            admitted = sum(1 for w in self.workloads.values() if w.admitted_to == name)
            pending = sum(1 for w in self.workloads.values() if w.admitted_to is None and self._cluster_of(w) == name)
            wanted = {"admittedWorkloads": admitted, "pendingWorkloads": pending}
            if (cluster.get("status") or {}) != wanted:
                updated = copy.deepcopy(cluster)
                updated["status"] = wanted
                self.store.update(CLUSTERQUEUES, updated, generation=False)

    def _cluster_of(self, workload: Workload) -> str | None:
        local = self.store.get(LOCALQUEUES, workload.namespace, workload.queue)
        return None if local is None else (local.get("spec") or {}).get("clusterQueue")


def nominal_quota(cluster: Obj) -> dict[str, float]:
    """Each covered resource's nominal quota, summed over the ClusterQueue's flavors."""
    quota: dict[str, float] = {}
    for group in (cluster.get("spec") or {}).get("resourceGroups") or []:
        for name in group.get("coveredResources") or []:
            quota.setdefault(name, 0.0)
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                name = resource.get("name", "")
                quota[name] = quota.get(name, 0.0) + quantity(resource.get("nominalQuota", 0))
    return quota


def group() -> dict[str, Any]:
    """``GET /apis/kueue.x-k8s.io``."""
    version = {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version], "preferredVersion": version}
