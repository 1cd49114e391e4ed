"""Completion statuses and the retry decision, as FrameworkController's ``completion.go`` and
``types.go`` define them (platform-apis.md B.3 and B.5).

A pod's code comes from the default config's ``podFailureSpec`` patterns on the pod's
``status.reason`` first (a pod the kubelet or the node controller failed: −1000 Evicted,
−1001 NodeLost, −1003 Preempting, ...), then from its containers: the patterns of a container
that cannot start (−1201…−1203), the signals 130–143 (of which 137 and 143 are Transient) and
FC's own 200, 201 and 210, else the exit code of the last failed container with phrase
``ContainerUnrecognizedFailed`` and no attributes (an unknown failure). A pod deleted by someone
else gets FC's −101 PodExternalDeleted, whatever its containers did.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

SUCCEEDED = 0
STOP_FRAMEWORK_REQUESTED = -210
FRAMEWORK_ATTEMPT_COMPLETION = -220
DELETE_TASK_REQUESTED = -230
#: A pod deleted by someone else ("Possibly due to Pod Eviction or Preemption", completion.go).
POD_EXTERNAL_DELETED = -101
EXTERNAL_DELETE_DIAGNOSTICS = "Pod is being deleted by others"
#: Codes the controller itself gives to a completion it caused: never retried.
NOT_RETRIED = {STOP_FRAMEWORK_REQUESTED, FRAMEWORK_ATTEMPT_COMPLETION, DELETE_TASK_REQUESTED}
#: FC waits 60–900 s before retrying a Transient+Conflict failure; the emulator, this many seconds.
CONFLICT_RETRY_DELAY = (1, 2)

#: code -> (phrase, attributes) for the codes FC (or its default config) knows.
CODES: dict[int, tuple[str, list[str]]] = {
    SUCCEEDED: ("Succeeded", []),
    200: ("ContainerTransientFailed", ["Transient"]),
    201: ("ContainerTransientConflictFailed", ["Transient", "Conflict"]),
    210: ("ContainerPermanentFailed", ["Permanent"]),
    130: ("ContainerSigIntReceived", ["Transient"]),
    131: ("ContainerSigQuitReceived", ["Transient"]),
    132: ("ContainerSigIllReceived", ["Permanent"]),
    134: ("ContainerSigAbrtReceived", []),
    135: ("ContainerSigBusReceived", ["Permanent"]),
    136: ("ContainerSigFpeReceived", ["Permanent"]),
    137: ("ContainerSigKillReceived", ["Transient"]),
    139: ("ContainerSigSegvReceived", ["Permanent"]),
    141: ("ContainerSigPipeReceived", ["Permanent"]),
    143: ("ContainerSigTermReceived", ["Transient"]),
    -100: ("ConfigMapExternalDeleted", ["Transient"]),
    POD_EXTERNAL_DELETED: ("PodExternalDeleted", ["Transient"]),
    -1000: ("PodEvicted", ["Transient"]),
    -1001: ("PodNodeLost", ["Transient"]),
    -1002: ("PodScheduledToInsufficientResourceNode", ["Transient"]),
    -1003: ("PodPreemptedForCriticalPod", ["Transient"]),
    -1004: ("PodDeadlineExceeded", ["Permanent"]),
    -1005: ("PodNodeAdmissionForbidden", ["Permanent"]),
    -1006: ("PodNodeAdmissionUnexpectedError", ["Transient"]),
    -300: ("PodFailedWithoutFailedContainer", []),
    -1201: ("ContainerDockerCreationError", []),
    -1202: ("ContainerDockerStartCmdPermissionDenied", ["Permanent"]),
    -1203: ("ContainerDockerStartCmdNotFound", ["Permanent"]),
    -1204: ("ContainerDockerStartUnknownError", []),
    STOP_FRAMEWORK_REQUESTED: ("StopFrameworkRequested", ["Permanent"]),
    FRAMEWORK_ATTEMPT_COMPLETION: ("FrameworkAttemptCompletion", ["Permanent"]),
    DELETE_TASK_REQUESTED: ("DeleteTaskRequested", ["Permanent"]),
}
#: The default config's pod patterns on ``status.reason`` (``podFailureSpec``, −1000…−1006), in its order.
POD_REASONS: list[tuple[re.Pattern[str], int]] = [
    (re.compile(r"(?i)^Evicted$"), -1000),
    (re.compile(r"(?i)^NodeLost$"), -1001),
    (re.compile(r"(?i)^OutOf\S+$"), -1002),
    (re.compile(r"(?i)^Preempting$"), -1003),
    (re.compile(r"(?i)^DeadlineExceeded$"), -1004),
    (re.compile(r"(?i)^Forbidden$"), -1005),
    (
        re.compile(r"(?i)^(UnexpectedAdmissionError|UnknownReason|InvalidNodeInfo|UnexpectedPredicateFailureType)$"),
        -1006,
    ),
]
STOP_DIAGNOSTICS = "User has requested to stop the Framework"
ATTEMPT_COMPLETION_DIAGNOSTICS = "Stop to complete current FrameworkAttempt"


@dataclass(frozen=True)
class ContainerExit:
    """How one container ended: its exit code, and the kubelet's reason (Completed, Error, ContainerCannotRun)."""

    name: str
    code: int
    reason: str
    message: str = ""
    signal: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reason": self.reason,
            "message": self.message,
            "signal": self.signal,
            "code": self.code,
        }


def status_of(code: int, diagnostics: str, phrase: str | None = None) -> dict[str, Any]:
    """``{code, phrase, type: {name, attributes}, diagnostics}`` for a known or unknown code."""
    known_phrase, attributes = CODES.get(code, ("ContainerUnrecognizedFailed", []))
    return {
        "code": code,
        "phrase": phrase or known_phrase,
        "type": {"name": "Succeeded" if code == SUCCEEDED else "Failed", "attributes": list(attributes)},
        "diagnostics": diagnostics,
    }


def _cannot_run_code(exit_: ContainerExit) -> int | None:
    if exit_.reason != "ContainerCannotRun":
        return None
    if exit_.code == 128:
        lowered = exit_.message.lower()
        return -1203 if any(s in lowered for s in ("not found", "cannot find", "no such")) else -1204
    return {125: -1201, 126: -1202, 127: -1203}.get(exit_.code)


def pod_completion(exits: list[ContainerExit], reason: str = "", message: str = "") -> dict[str, Any]:
    """A task attempt's completion status from its pod's ``status.reason`` and ``message`` (set
    when the kubelet or the node controller failed it) and its containers (in the order they ended)."""
    failed = [e for e in exits if e.code != 0]
    pod = {"reason": reason, "message": message, "containers": [e.as_json() for e in exits]}
    for pattern, code in POD_REASONS if reason else ():
        if pattern.match(reason):
            matched = json.dumps({"reason": reason, "message": message}, separators=(",", ":"))
            return status_of(code, f"Pod failed: PodPattern matched: {matched}") | {"pod": pod}
    summary = json.dumps(pod, separators=(",", ":"))
    if not failed and reason:  # failed by the system, no container failed: FC's −300
        return status_of(-300, f"Pod failed: PodPattern unmatched: {summary}") | {"pod": pod}
    if not failed:
        return status_of(SUCCEEDED, "Pod succeeded") | {"pod": pod}
    for exit_ in failed:
        code = _cannot_run_code(exit_)
        if code is not None:
            return status_of(code, f"Pod failed: PodPattern matched: {summary}") | {"pod": pod}
    last = failed[-1].code
    matched = "matched" if last in CODES else "unmatched"
    return status_of(last, f"Pod failed: PodPattern {matched}: {summary}") | {"pod": pod}


def externally_deleted() -> dict[str, Any]:
    """A task whose pod someone else deleted (a drain, the scheduler's preemption, ``kubectl delete pod``)."""
    return status_of(POD_EXTERNAL_DELETED, EXTERNAL_DELETE_DIAGNOSTICS) | {"pod": None}


def killed(stopping: bool) -> dict[str, Any]:
    """A task deleted because its attempt completed (−220) or its framework was stopped (−210)."""
    if stopping:
        return status_of(STOP_FRAMEWORK_REQUESTED, STOP_DIAGNOSTICS) | {"pod": None}
    return status_of(FRAMEWORK_ATTEMPT_COMPLETION, ATTEMPT_COMPLETION_DIAGNOSTICS) | {"pod": None}


def stopped() -> dict[str, Any]:
    """The framework attempt's completion status after ``executionType: Stop``."""
    return status_of(STOP_FRAMEWORK_REQUESTED, STOP_DIAGNOSTICS) | {"trigger": None}


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    accountable: bool
    delay: int = 0


def should_retry(policy: dict[str, Any] | None, accountable_retried: int, completion: dict[str, Any]) -> RetryDecision:
    """FC's ``RetryPolicySpec.ShouldRetry``: built-in no-retry codes, then fancy retry, then maxRetryCount."""
    policy = policy or {}
    code, kind = completion["code"], completion["type"]
    attributes = kind.get("attributes") or []
    if code in NOT_RETRIED:
        return RetryDecision(False, True)
    if policy.get("fancyRetryPolicy"):
        if "Transient" in attributes:
            delay = random.randint(*CONFLICT_RETRY_DELAY) if "Conflict" in attributes else 0
            return RetryDecision(True, False, delay)
        if "Permanent" in attributes:
            return RetryDecision(False, True)
    limit = policy.get("maxRetryCount") or 0
    failed = kind["name"] == "Failed"
    if limit == -2 or (failed and limit == -1) or (failed and accountable_retried < limit):
        return RetryDecision(True, True)
    return RetryDecision(False, True)
