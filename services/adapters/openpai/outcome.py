"""How what OpenPAI reports reads for the trial: an ended job as the trial's outcome
(:func:`outcome_of`), an exit spec as a failure class (:func:`failure_of`), and a job's retry
details as OpenPAI's own retries after failures of the platform (:func:`platform_retries`).

``jobStatus.state`` maps to the trial's status; FAILED carries ``appExitCode`` and the exit
spec (its ``behavior``: transient, permanent or unknown) into the trial's message and failure
class; STOPPED after our cancel takes the cancel's status, after OpenPAI's own retry was taken
back (:mod:`.watch`) FAILED with the failure class of the platform attempt that failed, after
anyone else's SYS_CANCELED. The trial's own exit code comes from the keeper's ``state.json``
on the share. Pure functions of the records (the share's ``state.json`` aside).
"""

from __future__ import annotations

from datetime import UTC, datetime

from contracts import TrialStatus
from contracts.retries import Failure
from services.adapters import sharefs
from services.adapters.base import TrialOutcome
from services.adapters.openpai.trial import Job

#: ``failure`` of a trial from the exit spec's ``behavior``.
BEHAVIOR: dict[str, Failure] = {
    "TRANSIENT": "infrastructure",
    "TRANSIENT_CONFLICT": "infrastructure",
    "PERMANENT": "permanent",
}
#: Exit codes of a task stopped for someone else's reason, failure ``preempted`` rather than the
#: TRANSIENT behavior's ``infrastructure`` (OpenPAI's k8s-job-exit-spec.yaml): −101
#: PodExternalDeleted ("Pod is deleted by external unexpectedly": a drain, a preemption),
#: −1000 PodEvicted ("Pod is evicted by K8S, maybe its node is out of resource"), −1003
#: PodPreemptedForCriticalPod ("Pod is preempted by the kubelet of its node for the admission
#: of other more critical platform Pod"). −1001 PodNodeLost stays ``infrastructure``.
PREEMPTED = frozenset({-101, -1000, -1003})


def outcome_of(job: Job) -> TrialOutcome:
    """How the job ended: its state and exit spec, with the keeper's exit code when it wrote one."""
    status = job.detail.get("jobStatus") or {}
    end = status.get("completedTime") or status.get("appCompletedTime")
    end_time = datetime.fromtimestamp(end / 1000, UTC) if isinstance(end, int | float) else None
    keeper = _keeper_state(job)
    exit_code = keeper.get("exitCode")
    if job.state == "SUCCEEDED":
        return TrialOutcome(TrialStatus.SUCCEEDED, exit_code if exit_code is not None else 0, None, None, end_time)
    if job.state == "STOPPED" and job.taken_back is not None:  # the trial's exit code is the retry's, if any
        return TrialOutcome(TrialStatus.FAILED, None, job.taken_back, job.taken_failure, end_time)
    if job.state == "STOPPED":
        return TrialOutcome(
            TrialStatus.SYS_CANCELED,
            exit_code,
            f"job {job.client.framework(job.name)} was stopped outside Trialbus",
            None,
            end_time,
        )
    spec = status.get("appExitSpec") or {}
    code = status.get("appExitCode")
    phrase = spec.get("phrase") or "unknown"
    behavior = spec.get("behavior") or "UNKNOWN"
    message = f"OpenPAI job {job.client.framework(job.name)} failed: exit code {code} ({phrase}, {behavior.lower()})"
    if exit_code is not None:
        message += f"; the trial command exited with {exit_code}"
    if diagnostics := str(status.get("appExitDiagnostics") or "").strip():
        message += f": {diagnostics.splitlines()[0][:200]}"
    last = keeper.get("lastError")
    return TrialOutcome(
        TrialStatus.FAILED, exit_code, message, failure_of(spec), end_time, last if isinstance(last, str) else None
    )


def failure_of(spec: dict) -> Failure:
    """The failure class of an exit spec record (``appExitSpec``)."""
    if spec.get("code") in PREEMPTED:
        return "preempted"
    return BEHAVIOR.get(spec.get("behavior") or "UNKNOWN", "trial")


def platform_retries(summary: dict) -> int:
    """How many times OpenPAI retried a job by itself after failures of the platform: its
    ``retryDetails.platform`` (the retries ``jobRetryCount`` asked for are ``user``); without
    it, every retry (the job NNI generates says ``jobRetryCount: 0``)."""
    details = summary.get("retryDetails")
    if isinstance(details, dict) and isinstance(details.get("platform"), int):
        return details["platform"]
    retries = summary.get("retries")
    return retries if isinstance(retries, int) else 0


def _keeper_state(job: Job) -> dict:
    return sharefs.keeper_state(job.share.local, f"{job.report}-0")
