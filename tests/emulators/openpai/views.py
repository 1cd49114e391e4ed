"""JobDetail, JobSummary and TaskStatus as the rest-server shapes them (``frameworkConverter.js``)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from . import exitspec
from .env import HOST_IP, convert_name
from .runner import Attempt, Job, Task

_STOP_CODES = (exitspec.STOP_REQUESTED, exitspec.ATTEMPT_COMPLETION)


def job_state(fc_state: str, code: int | None) -> str:
    """``convertState``: the FC framework state and completion code as WAITING ... FAILED."""
    if fc_state in ("AttemptCreationPending", "AttemptCreationRequested", "AttemptPreparing"):
        return "WAITING"
    if fc_state == "AttemptRunning":
        return "RUNNING"
    if fc_state in ("AttemptDeletionPending", "AttemptDeletionRequested", "AttemptDeleting", "AttemptCompleted"):
        return "STOPPING" if code in _STOP_CODES else "RUNNING"
    if fc_state == "Completed":
        return "SUCCEEDED" if code == 0 else "STOPPED" if code in _STOP_CODES else "FAILED"
    return "UNKNOWN"


def attempt_state(fc_state: str, code: int | None) -> str:
    """``convertAttemptState``: like ``job_state`` but AttemptCompleted is already final."""
    return job_state("Completed" if fc_state == "AttemptCompleted" else fc_state, code)


def exit_diagnostics(diagnostics: str | None) -> dict[str, Any] | None:
    """``generateExitDiagnostics``: the summary, and the runtime's analysis out of the container message."""
    if not diagnostics:
        return None
    result: dict[str, Any] = {"diagnosticsSummary": diagnostics, "runtime": None, "launcher": diagnostics}
    match = re.search(r"matched: (.*)", diagnostics)
    if match is None:
        return result
    try:
        pod = json.loads(match.group(1))
    except ValueError:
        return result
    summary = diagnostics[: match.start() + len("matched:")] + "\n" + yaml.safe_dump(pod)
    result["diagnosticsSummary"] = result["launcher"] = summary
    for container in pod.get("containers") or []:
        found = re.search(
            r"\[PAI_RUNTIME_ERROR_START\](.*)\[PAI_RUNTIME_ERROR_END\]", container.get("message") or "", re.S
        )
        if container.get("code", 0) > 0 and found:
            result["runtime"] = {**yaml.safe_load(found.group(1).strip()), "name": container["name"]}
            result["launcher"] = None
            break
    return result


def log_path(job: Job, attempt: Attempt, task: Task) -> str:
    return (
        f"/api/v2/jobs/{job.framework_name}/attempts/{attempt.id}/taskRoles/{convert_name(task.role)}"
        f"/taskIndex/{task.index}/attempts/{task.attempt_id}/logs"
    )


def task_status(job: Job, attempt: Attempt, task: Task) -> dict[str, Any]:
    code = task.code if task.state == "Completed" else None
    state = attempt_state(task.state, code) if task.state == "Completed" else job_state(task.state, code)
    diagnostics = exit_diagnostics(task.diagnostics) if code is not None else None
    gpu = job.config["taskRoles"][task.role]["resourcePerInstance"]["gpu"]
    return {
        "taskIndex": task.index,
        "taskUid": task.uid,
        "taskState": state,
        "containerId": task.pod_uid,
        "containerIp": HOST_IP,
        "containerNodeName": "localhost",
        "containerPorts": {label: ",".join(str(p) for p in ports) for label, ports in task.ports.items()},
        "containerGpus": 2 ** max(0, int(gpu)) - 1,  # the rest-server's mock of GPU ids 0..n-1
        "containerLog": log_path(job, attempt, task),
        "containerExitCode": code,
        "containerExitSpec": exitspec.record(code),
        "containerExitDiagnostics": diagnostics["diagnosticsSummary"] if diagnostics else None,
        "retries": task.retries,
        "accountableRetries": task.accountable,
        "createdTime": task.created,
        "launchedTime": task.launched,
        "completedTime": task.completed,
        "attemptId": task.attempt_id,
        "attemptState": state,
        "currentAttemptCreatedTime": task.attempt_created,
        "currentAttemptLaunchedTime": task.launched,
        "currentAttemptCompletedTime": task.completed,
    }


def _total_gpus(job: Job) -> int:
    roles = job.config["taskRoles"].values()
    return int(sum(r["resourcePerInstance"]["gpu"] * (r.get("instances") or 1) for r in roles))


def _current(job: Job) -> tuple[str, dict[str, Any] | None]:
    """The FC state and completion status the job shows now."""
    if job.state == "Completed":
        return job.state, job.completion
    return job.state, job.attempt.completion if job.attempt else None


def job_summary(job: Job) -> dict[str, Any]:
    state, completion = _current(job)
    code = completion["code"] if completion else None
    roles = job.config["taskRoles"].values()
    return {
        "debugId": job.debug_id,
        "name": job.name,
        "jobPriority": None,
        "username": job.user,
        "tags": list(job.tags),
        "state": job_state(state, code),
        "subState": state,
        "executionType": job.execution,
        "retries": job.retries,
        "retryDetails": {"user": job.accountable, "platform": job.retries - job.accountable, "resource": 0},
        "retryDelayTime": job.retry_delay,
        "submissionTime": job.submitted,
        "createdTime": job.created,
        "launchedTime": job.launched,
        "completedTime": job.completed,
        "appExitCode": code,
        "virtualCluster": job.virtual_cluster,
        "totalGpuNumber": _total_gpus(job),
        "totalTaskNumber": sum(int(r.get("instances") or 1) for r in roles),
        "totalTaskRoleNumber": len(job.config["taskRoles"]),
    }


def job_detail(job: Job, attempt: Attempt | None = None) -> dict[str, Any]:
    """JobDetail of the current attempt, or of an older one (``.../attempts/{id}``)."""
    if attempt is None or attempt is job.attempt:
        state, completion = _current(job)
        attempt = job.attempt
        attempt_id = attempt.id if attempt else (job.retries if job.created else None)
    else:
        state, completion, attempt_id = "AttemptCompleted", attempt.completion, attempt.id
    code = completion["code"] if completion else None
    trigger = (completion or {}).get("trigger") or {}
    diagnostics = exit_diagnostics(completion["diagnostics"]) if completion else None
    status = {
        "username": job.user,
        "state": job_state(state, code),
        "subState": state,
        "executionType": job.execution,
        "retries": job.retries,
        "retryDetails": {"user": job.accountable, "platform": job.retries - job.accountable, "resource": 0},
        "retryDelayTime": job.retry_delay,
        "submissionTime": job.submitted,
        "createdTime": job.created,
        "launchedTime": job.launched,
        "completedTime": job.completed,
        "attemptId": attempt_id,
        "attemptState": attempt_state(state, code),
        "appId": attempt.uid if attempt else None,
        "appProgress": 1 if completion else 0,
        "appTrackingUrl": "",
        "appCreatedTime": attempt.created if attempt else None,
        "appLaunchedTime": attempt.launched if attempt else None,
        "appCompletedTime": attempt.completed if attempt else None,
        "appExitCode": code,
        "appExitSpec": exitspec.record(code),
        "appExitDiagnostics": diagnostics["diagnosticsSummary"] if diagnostics else None,
        "appExitMessages": {"container": None, "runtime": diagnostics["runtime"], "launcher": diagnostics["launcher"]}
        if diagnostics
        else None,
        "appExitTriggerMessage": trigger.get("message"),
        "appExitTriggerTaskRoleName": trigger.get("taskRoleName"),
        "appExitTriggerTaskIndex": trigger.get("taskIndex"),
        "appExitType": completion["type"]["name"] if completion else None,
        "virtualCluster": job.virtual_cluster,
    }
    task_roles = {}
    for role, tasks in (attempt.tasks if attempt else {}).items():
        name = convert_name(role)
        task_roles[name] = {
            "taskRoleStatus": {"name": name},
            "taskStatuses": [task_status(job, attempt, t) for t in tasks],
        }  # type: ignore[arg-type]
    return {
        "debugId": job.debug_id,
        "name": job.name,
        "jobPriority": None,
        "tags": list(job.tags),
        "jobStatus": status,
        "taskRoles": task_roles,
    }
