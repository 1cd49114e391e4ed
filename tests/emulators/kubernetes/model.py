"""What the simulated FrameworkController remembers about each Framework, and the ``status`` it writes.

The controller keeps this in memory (as FC keeps its status cache) and writes the rendered
``status`` with a plain update of the whole object after every step that changed it; a client
that writes ``status`` itself is overwritten at the next step, as with the real controller.
Field names and meanings follow platform-apis.md B.4.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from .pods import Pod
from .store import timestamp

HOST = socket.gethostname()


def new_uid() -> str:
    return str(uuid.uuid4())


@dataclass
class TaskRun:
    """One task (a task role's instance) across its task attempts, in one framework attempt."""

    role: str
    index: int
    uid: str = field(default_factory=new_uid)
    state: str = "AttemptCreationPending"
    attempt_id: int = 0
    retried: int = 0
    accountable: int = 0
    retry_delay: int | None = None
    retry_at: float = 0.0
    pod_uid: str = field(default_factory=new_uid)
    pod: Pod | None = None
    start_time: str = field(default_factory=timestamp)
    transition_time: str = field(default_factory=timestamp)
    completion_time: str | None = None
    attempt_start: str = field(default_factory=timestamp)
    attempt_run: str | None = None
    attempt_completion_time: str | None = None
    completion: dict[str, Any] | None = None  # the current task attempt's completion status

    def move(self, state: str) -> None:
        if state != self.state:
            self.state, self.transition_time = state, timestamp()

    def retry(self, accountable: bool, delay: int, now: float) -> None:
        """A new task attempt: a new pod (same name, new uid), back to AttemptCreationPending."""
        self.retried += 1
        self.accountable += int(accountable)
        self.attempt_id += 1
        self.retry_delay, self.retry_at = (delay or None), now + delay
        self.pod_uid, self.pod = new_uid(), None
        self.attempt_start, self.attempt_run, self.attempt_completion_time = timestamp(), None, None
        self.completion = None
        self.move("AttemptCreationPending")

    @property
    def code(self) -> int | None:
        return None if self.completion is None else self.completion["code"]

    def render(self, framework: str) -> dict[str, Any]:
        return {
            "index": self.index,
            "instanceUID": self.uid,
            "startTime": self.start_time,
            "runTime": self.attempt_run,
            "completionTime": self.completion_time,
            "state": self.state,
            "transitionTime": self.transition_time,
            "deletionPending": False,
            "retryPolicyStatus": {
                "totalRetriedCount": self.retried,
                "accountableRetriedCount": self.accountable,
                "retryDelaySec": self.retry_delay,
            },
            "attemptStatus": {
                "id": self.attempt_id,
                "startTime": self.attempt_start,
                "runTime": self.attempt_run,
                "completionTime": self.attempt_completion_time,
                "instanceUID": f"{self.attempt_id}_{self.pod_uid}",
                "podName": f"{framework}-{self.role}-{self.index}",
                "podUID": self.pod_uid,
                "podNodeName": HOST if self.attempt_run else None,
                "podIP": "127.0.0.1" if self.attempt_run else None,
                "podHostIP": "127.0.0.1" if self.attempt_run else None,
                "completionStatus": self.completion,
            },
        }


@dataclass
class RoleRun:
    """A task role as the attempt saw it when it was created (later spec changes wait for the next attempt)."""

    name: str
    spec: dict[str, Any]
    tasks: list[TaskRun]
    uid: str = field(default_factory=new_uid)

    @property
    def policy(self) -> tuple[int, int]:
        """(minFailedTaskCount, minSucceededTaskCount); absent is 0, which like −1 means disabled."""
        p = self.spec.get("frameworkAttemptCompletionPolicy") or {}
        return int(p.get("minFailedTaskCount") or 0), int(p.get("minSucceededTaskCount") or 0)

    @property
    def task_spec(self) -> dict[str, Any]:
        return self.spec.get("task") or {}


@dataclass
class AttemptRun:
    """One framework attempt: a ConfigMap instance and one pod per task."""

    id: int
    roles: list[RoleRun]
    configmap_uid: str = field(default_factory=new_uid)
    start_time: str = field(default_factory=timestamp)
    run_time: str | None = None
    completion_time: str | None = None
    completion: dict[str, Any] | None = None

    @classmethod
    def of(cls, attempt_id: int, spec: dict[str, Any]) -> AttemptRun:
        roles = [
            RoleRun(r.get("name", ""), r, [TaskRun(r.get("name", ""), i) for i in range(r.get("taskNumber") or 0)])
            for r in spec.get("taskRoles") or []
        ]
        return cls(attempt_id, roles)

    def tasks(self) -> list[TaskRun]:
        return [t for role in self.roles for t in role.tasks]


@dataclass
class FrameworkRun:
    """A Framework as the controller tracks it (by uid: a re-created name is a new run)."""

    uid: str
    namespace: str
    name: str
    attempt: AttemptRun
    state: str = "AttemptCreationPending"
    start_time: str = field(default_factory=timestamp)
    run_time: str | None = None
    completion_time: str | None = None
    transition_time: str = field(default_factory=timestamp)
    retried: int = 0
    accountable: int = 0
    retry_delay: int | None = None
    retry_at: float = 0.0

    def move(self, state: str) -> None:
        if state != self.state:
            self.state, self.transition_time = state, timestamp()

    def render(self) -> dict[str, Any]:
        a = self.attempt
        return {
            "startTime": self.start_time,
            "runTime": self.run_time,
            "completionTime": self.completion_time,
            "transitionTime": self.transition_time,
            "state": self.state,
            "retryPolicyStatus": {
                "totalRetriedCount": self.retried,
                "accountableRetriedCount": self.accountable,
                "retryDelaySec": self.retry_delay,
            },
            "attemptStatus": {
                "id": a.id,
                "startTime": a.start_time,
                "runTime": a.run_time,
                "completionTime": a.completion_time,
                "instanceUID": f"{a.id}_{a.configmap_uid}",
                "configMapName": f"{self.name}-attempt",
                "configMapUID": a.configmap_uid,
                "completionStatus": a.completion,
                "taskRoleStatuses": [
                    {
                        "name": r.name,
                        "instanceUID": r.uid,
                        "podGracefulDeletionTimeoutSec": r.task_spec.get("podGracefulDeletionTimeoutSec"),
                        "taskStatuses": [t.render(self.name) for t in r.tasks],
                    }
                    for r in a.roles
                ],
                "taskRoleStatusesCompressed": None,
            },
        }
