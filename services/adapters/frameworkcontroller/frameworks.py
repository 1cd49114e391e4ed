"""The ``Framework`` of one trial attempt, and how its status reads as the trial's.

One task role per configured role, each with ``taskNumber`` and an explicit
``frameworkAttemptCompletionPolicy`` whose ``minFailedTaskCount`` is at least 1 (without it a
Framework whose tasks all fail ends Succeeded); a pod of one container ``framework`` running
the role's command under the trial keeper from the storage (see ``sharefs.wrap``), with
requests = limits (``cpu``, ``memory``, ``nvidia.com/gpu`` only when > 0), the NFS or Azure
File volume at ``containerMountPath``, and ``serviceAccountName`` when set; the framework's
and tasks' ``retryPolicy`` as the user set them (no retry by default).

Name: ``^[a-z0-9]{1,63}$`` (FrameworkController's rule) — ``tb<experiment>t<trial>a<attempt>``
lower-cased, cut to 54 characters, plus 8 hex digits of a hash of the exact ids (trial ids
are mixed-case: lower-casing alone could make two trials one name). Labels carry the exact
ids and the adapter replica.
"""

from __future__ import annotations

import copy
import hashlib
import re
from datetime import UTC, datetime
from typing import Any

from contracts import TrialStatus
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from contracts.retries import Failure
from services.adapters.base import TrialOutcome
from services.adapters.sharefs import wrap

API_VERSION = "frameworkcontroller.microsoft.com/v1"
VOLUME = "trialbus-storage"
LABEL = "trialbus.io"
#: Framework states before any task ran: the trial waits (image pulls, scheduling).
WAITING = frozenset({"AttemptCreationPending", "AttemptCreationRequested", "AttemptPreparing"})
#: Completion codes of a stop (FrameworkController's StopFrameworkRequested and the tasks'
#: FrameworkAttemptCompletion / DeleteTaskRequested).
STOP_CODE = -210
#: Completion codes of a pod stopped for someone else's reason: failure ``preempted`` (retried
#: without counting against the budgets), not ``infrastructure`` like the other Transient codes.
#: −101 PodExternalDeleted, "Possibly due to Pod Eviction or Preemption" (FrameworkController's
#: pkg/apis/frameworkcontroller/v1/completion.go): a drain, the scheduler making room for a pod
#: of higher priority, ``kubectl delete pod`` — and the pods of a node that went away, once
#: Kubernetes deletes them; the default config's podFailureSpec (example/config/default/
#: frameworkcontroller.yaml) −1000 PodEvicted (``reasonRegex: '(?i)^Evicted$'``) and −1003
#: PodPreemptedForCriticalPod (``reasonRegex: '(?i)^Preempting$'``). −1001 PodNodeLost
#: (``reasonRegex: '(?i)^NodeLost$'``) stays ``infrastructure``.
PREEMPTED = frozenset({-101, -1000, -1003})
#: Kueue's plain-Pod integration (sigs.k8s.io/kueue pkg/controller/jobs/pod/constants): the
#: LocalQueue label, the pod group's label and size, whether Kueue waits for replacement pods of
#: a failed group, and the scheduling gate its webhook puts on every pod it queues.
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_RETRIABLE = "kueue.x-k8s.io/retriable-in-group"
KUEUE_GATE = "kueue.x-k8s.io/admission"


def name_of(experiment_id: str, trial_id: str, attempt: int) -> str:
    readable = re.sub(r"[^a-z0-9]", "", f"tb{experiment_id}t{trial_id}a{attempt}".lower())[:54]
    return readable + hashlib.sha256(f"{experiment_id}/{trial_id}/{attempt}".encode()).hexdigest()[:8]


def labels(experiment_id: str, trial_id: str, attempt: int, replica: str) -> dict[str, str]:
    return {
        f"{LABEL}/experiment": experiment_id,
        f"{LABEL}/trial": trial_id,
        f"{LABEL}/attempt": str(attempt),
        f"{LABEL}/replica": label_value(replica),
    }


def replica_selector(replica: str) -> str:
    return f"{LABEL}/replica={label_value(replica)}"


def label_value(value: str) -> str:
    """A label value (63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value)[:63].strip("-._")
    return cleaned or "replica"


def secret_name(experiment_id: str) -> str:
    """The Secret holding an experiment's Azure storage account name and key."""
    return f"trialbus-{experiment_id.lower()}-azure"[:253]


def render(
    service: FrameworkcontrollerConfig,
    experiment_id: str,
    trial_id: str,
    attempt: int,
    replica: str,
    trial_dir: str,
    keeper: str,
    queue: str | None = None,
) -> dict[str, Any]:
    """The Framework of one attempt (``trial_dir``, ``keeper``: their paths in the pods); its pods
    queued in the Kueue LocalQueue ``queue`` when given (:func:`kueue_metadata`)."""
    report = service.reporting_role.name
    name = name_of(experiment_id, trial_id, attempt)
    pod_metadata: dict[str, Any] = {"labels": {f"{LABEL}/experiment": experiment_id}}
    if queue is not None:
        pod_metadata = kueue_metadata(pod_metadata, service, queue, name)
    if service.storage.storage_type == "nfs":
        volume = {"name": VOLUME, "nfs": {"server": service.storage.server, "path": service.storage.path}}
    else:
        volume = {
            "name": VOLUME,
            "azureFile": {
                "secretName": secret_name(experiment_id),
                "shareName": service.storage.azure_share,
                "readOnly": False,
            },
        }
    no_retry = {"fancyRetryPolicy": False, "maxRetryCount": 0}
    roles = []
    for role in service.task_roles:
        resources = {"cpu": str(role.cpu_number), "memory": f"{role.memory_mb}Mi"}
        if role.gpu_number > 0:
            resources["nvidia.com/gpu"] = str(role.gpu_number)
        script = wrap([role.command], role.name == report, trial_dir, keeper, "FC_TASKROLE_NAME", "FC_TASK_INDEX")
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "framework",
                    "image": role.docker_image,
                    "command": ["sh", "-c", "\n".join(script)],
                    "resources": {"requests": resources, "limits": dict(resources)},
                    "volumeMounts": [{"name": VOLUME, "mountPath": service.container_mount_path}],
                }
            ],
            "volumes": [volume],
        }
        if service.service_account_name:
            pod_spec["serviceAccountName"] = service.service_account_name
        policy = role.framework_attempt_completion_policy
        roles.append(
            {
                "name": role.name,
                "taskNumber": role.task_number,
                "frameworkAttemptCompletionPolicy": {
                    "minFailedTaskCount": max(policy.min_failed_task_count, 1),
                    "minSucceededTaskCount": policy.min_succeed_task_count,
                },
                "task": {
                    "retryPolicy": role.retry_policy.model_dump(by_alias=True) if role.retry_policy else no_retry,
                    "podGracefulDeletionTimeoutSec": 60,
                    "pod": {"metadata": copy.deepcopy(pod_metadata), "spec": pod_spec},
                },
            }
        )
    return {
        "apiVersion": API_VERSION,
        "kind": "Framework",
        "metadata": {
            "name": name,
            "namespace": service.namespace,
            "labels": labels(experiment_id, trial_id, attempt, replica),
        },
        "spec": {
            "executionType": "Start",
            "retryPolicy": service.retry_policy.model_dump(by_alias=True) if service.retry_policy else no_retry,
            "taskRoles": roles,
        },
    }


def kueue_metadata(metadata: dict[str, Any], service: FrameworkcontrollerConfig, queue: str, name: str) -> dict:
    """``metadata`` of every pod of the Framework ``name``, queued in Kueue's LocalQueue ``queue``.

    A trial of several pods is one pod group, named as its Framework (unique per attempt) and
    sized by all its tasks: Kueue admits it whole or not at all. Without a retry policy,
    ``retriable-in-group: "false"``: FrameworkController makes no replacement pod, so a failed
    group's workload finishes (its quota freed) once its pods have ended; with one, Kueue keeps
    the group's quota for the replacement pods FrameworkController makes under the same names.
    """
    labels = {**metadata.get("labels", {}), KUEUE_QUEUE: queue}
    annotations = dict(metadata.get("annotations", {}))
    total = sum(role.task_number for role in service.task_roles)
    if total > 1:
        labels[KUEUE_GROUP] = name
        annotations[KUEUE_TOTAL] = str(total)
        policies = [service.retry_policy, *(role.retry_policy for role in service.task_roles)]
        if not any(policy is not None and policy.max_retry_count != 0 for policy in policies):
            annotations[KUEUE_RETRIABLE] = "false"
    return {**metadata, "labels": labels, **({"annotations": annotations} if annotations else {})}


def queue_of(framework: dict) -> str | None:
    """The Kueue LocalQueue a Framework's pods go to (its first task role's label), if any."""
    roles = (framework.get("spec") or {}).get("taskRoles") or [{}]
    labels = ((((roles[0].get("task") or {}).get("pod") or {}).get("metadata") or {}).get("labels")) or {}
    return labels.get(KUEUE_QUEUE)


def phase(state: str) -> str:
    """What a Framework state means for its trial: ``waiting`` (no task ran yet), ``running``
    (a task ran; the attempt may be completing, or retried), ``ended`` (``Completed``: final)."""
    if state == "Completed":
        return "ended"
    return "waiting" if state in WAITING else "running"


def state_of(framework: dict | None) -> str:
    return str(((framework or {}).get("status") or {}).get("state") or "AttemptCreationPending")


def completion_of(framework: dict) -> dict:
    status = framework.get("status") or {}
    return (status.get("attemptStatus") or {}).get("completionStatus") or {}


def outcome_of(framework: dict, keeper: dict, canceled: bool) -> TrialOutcome:
    """How a ``Completed`` Framework ended, as the trial's outcome: Succeeded → SUCCEEDED;
    Failed → FAILED with the completion code, phrase, attributes and diagnostics in the message
    and the failure class from the attributes (Permanent, Transient, none: ``permanent``,
    ``infrastructure``, ``trial``) or the code (``PREEMPTED``); a stop we did not ask for →
    SYS_CANCELED.
    ``keeper``: the reporting task's ``state.json`` (the trial command's own exit code)."""
    status = framework.get("status") or {}
    completion = completion_of(framework)
    end = parse_time(status.get("completionTime"))
    exit_code = keeper.get("exitCode")
    kind = (completion.get("type") or {}).get("name")
    if kind == "Succeeded":
        return TrialOutcome(TrialStatus.SUCCEEDED, exit_code if exit_code is not None else 0, None, None, end)
    name = (framework.get("metadata") or {}).get("name")
    code, phrase = completion.get("code"), completion.get("phrase") or "unknown"
    attributes = list((completion.get("type") or {}).get("attributes") or [])
    if code == STOP_CODE and not canceled:
        return TrialOutcome(
            TrialStatus.SYS_CANCELED, exit_code, f"Framework {name} was stopped outside Trialbus", None, end
        )
    said = "permanent" if "Permanent" in attributes else "transient" if "Transient" in attributes else "unknown"
    classes: dict[str, Failure] = {"permanent": "permanent", "transient": "infrastructure"}  # retry classes
    failure = classes.get(said, "trial")
    if code in PREEMPTED:
        failure = "preempted"
    message = f"Framework {name} failed: completion code {code} ({phrase}, {said})"
    if exit_code is not None:
        message += f"; the trial command exited with {exit_code}"
    trigger = (completion.get("trigger") or {}).get("message")
    diagnostics = str(trigger or completion.get("diagnostics") or "").strip()
    if diagnostics:
        message += f": {diagnostics.splitlines()[0][:300]}"
    last = keeper.get("lastError")  # the reporting task's keeper, on the share
    return TrialOutcome(TrialStatus.FAILED, exit_code, message, failure, end, last if isinstance(last, str) else None)


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None
