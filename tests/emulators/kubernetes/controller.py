"""A simulated FrameworkController: the loop that runs every Framework through FC's states.

Every ``tick`` seconds each Framework takes at most one framework-state step, and each step that
changes anything is written as a whole-object update (a new resourceVersion, a MODIFIED event):

    AttemptCreationPending -> AttemptCreationRequested -> AttemptPreparing -> AttemptRunning
    -> AttemptDeletionPending -> AttemptDeletionRequested -> AttemptDeleting -> AttemptCompleted
    -> (AttemptCreationPending with attempt id + 1 | Completed)

``executionType: Create`` stays AttemptCreationPending; ``Stop`` completes the attempt with −210
StopFrameworkRequested and is never retried; the object stays. Tasks go AttemptCreationPending ->
AttemptPreparing (pod created; stays here while the pod cannot start) -> AttemptRunning ->
Completed, or back to AttemptCreationPending with a new pod when their task retry policy says so.
A completed task is checked against its role's completion policy (B.3, including the pitfall
that 0 and −1 disable it); when the attempt completes, the tasks still running are killed
(SIGTERM, SIGKILL after the pod's ``terminationGracePeriodSeconds`` or 2 s) and get −220
(−210 on a stop). A deleted Framework's processes are killed the same way. A pod failed or deleted
by someone else (``Kubelet.fail``) is stopped the same way too, and its task completes with the
code of its ``status.reason`` (Evicted −1000, NodeLost −1001, Preempting −1003, ...) or −101
PodExternalDeleted.
Simplifications: scaling (taskNumber or taskRoles changed during an attempt) waits for the next
attempt; retry delays for Transient+Conflict failures are 1–2 s, not 60–900 s.
"""

from __future__ import annotations

import asyncio
import copy
import sys
import time
import traceback
from typing import Any

from . import completion as codes
from .kueue import Admission
from .model import AttemptRun, FrameworkRun, RoleRun, TaskRun
from .pods import Kubelet, Pod
from .resources import FRAMEWORKS
from .store import Store, timestamp

TICK = 0.05


class Controller:
    """Runs the Frameworks of one store as local processes through one ``Kubelet``."""

    def __init__(self, store: Store, kubelet: Kubelet, tick: float = TICK, admission: Admission | None = None) -> None:
        self.store, self.kubelet, self.tick_seconds = store, kubelet, tick
        self.admission = admission  # Kueue's, when it is installed
        self.runs: dict[str, FrameworkRun] = {}
        self.orphans: list[Pod] = []  # pods of deleted Frameworks, being killed

    async def run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(self.tick_seconds)

    def tick(self) -> None:
        objects = {obj["metadata"]["uid"]: obj for obj in self.store.list(FRAMEWORKS, None, lambda _: True)}
        for uid in [uid for uid in self.runs if uid not in objects]:
            self._forget(self.runs.pop(uid))
        for uid, obj in objects.items():
            run = self.runs.get(uid)
            try:
                if run is None:
                    meta = obj["metadata"]
                    run = self.runs[uid] = FrameworkRun(
                        uid, meta["namespace"], meta["name"], AttemptRun.of(0, obj.get("spec") or {})
                    )
                elif run.state != "Completed":
                    self._step(run, obj.get("spec") or {})
                self._write(run, obj)
            except Exception:  # one broken Framework must not stop the others; the log shows it
                print(f"controller error on {obj['metadata']['namespace']}/{obj['metadata']['name']}:", file=sys.stderr)
                traceback.print_exc()
        self.orphans = [pod for pod in self.orphans if not self.kubelet.stop(pod)]
        if self.admission is not None:
            self.admission.tick(self.pods())

    def pods(self) -> list[Pod]:
        """The pods that exist: those of the tasks not completed (FC deletes a completed task's pod)."""
        tasks = [t for run in self.runs.values() for t in run.attempt.tasks()]
        return [t.pod for t in tasks if t.pod is not None and t.state != "Completed"]

    def _write(self, run: FrameworkRun, obj: dict[str, Any]) -> None:
        status = run.render()
        if obj.get("status") != status:
            updated = copy.deepcopy(obj)
            updated["status"] = status
            self.store.update(FRAMEWORKS, updated, generation=True)

    def _forget(self, run: FrameworkRun) -> None:
        self.orphans += [t.pod for t in run.attempt.tasks() if t.pod is not None and t.pod.started]

    def shutdown(self) -> None:
        self.kubelet.shutdown()

    # ------------------------------------------------------------ framework states

    def _step(self, run: FrameworkRun, spec: dict[str, Any]) -> None:
        execution = spec.get("executionType") or "Start"  # no defaulting upstream: "" runs like Start
        attempt, state = run.attempt, run.state
        if state == "AttemptCreationPending":
            if execution == "Stop":
                attempt.completion, attempt.completion_time = codes.stopped(), timestamp()
                run.move("AttemptCompleted")
            elif execution != "Create" and time.monotonic() >= run.retry_at:
                run.retry_delay = None
                run.move("AttemptCreationRequested")
        elif state == "AttemptCreationRequested":
            attempt.start_time = timestamp()  # the attempt's ConfigMap now exists
            run.move("AttemptPreparing")
        elif state in ("AttemptPreparing", "AttemptRunning"):
            if execution == "Stop":
                self._complete_attempt(run, codes.stopped())
                return
            self._step_tasks(run)
            if run.state == "AttemptPreparing" and any(t.attempt_run for t in attempt.tasks()):
                attempt.run_time = timestamp()
                run.run_time = run.run_time or attempt.run_time
                run.move("AttemptRunning")
        elif state == "AttemptDeletionPending":
            for task in self._unfinished(run):
                if task.pod is not None:
                    self.kubelet.stop(task.pod)
                task.move("AttemptDeleting")
            run.move("AttemptDeletionRequested")
        elif state == "AttemptDeletionRequested":
            run.move("AttemptDeleting")
        elif state == "AttemptDeleting":
            self._step_deleting(run)
        elif state == "AttemptCompleted":
            self._after_attempt(run, spec)

    def _unfinished(self, run: FrameworkRun) -> list[TaskRun]:
        return [t for t in run.attempt.tasks() if t.state != "Completed"]

    def _complete_attempt(self, run: FrameworkRun, completion: dict[str, Any]) -> None:
        run.attempt.completion = completion
        for task in self._unfinished(run):
            task.move("AttemptDeletionPending")
        run.move("AttemptDeletionPending")

    def _step_deleting(self, run: FrameworkRun) -> None:
        pods = [t.pod for t in self._unfinished(run) if t.pod is not None]
        if not all([self.kubelet.stop(pod) for pod in pods]):  # a list: every pod gets its signal
            return
        stopping = (run.attempt.completion or {}).get("code") == codes.STOP_FRAMEWORK_REQUESTED
        now = timestamp()
        for task in self._unfinished(run):
            task.completion = codes.killed(stopping)
            task.attempt_completion_time = task.completion_time = now
            task.move("Completed")
        run.attempt.completion_time = now
        run.move("AttemptCompleted")

    def _after_attempt(self, run: FrameworkRun, spec: dict[str, Any]) -> None:
        """Retry the Framework with a new attempt, or complete it (the final status is the last attempt's)."""
        completion = run.attempt.completion or codes.stopped()
        decision = codes.RetryDecision(False, True)
        if spec.get("executionType") != "Stop":
            decision = codes.should_retry(spec.get("retryPolicy"), run.accountable, completion)
        if not decision.retry:
            run.completion_time = timestamp()
            run.move("Completed")
            return
        run.retried += 1
        run.accountable += int(decision.accountable)
        run.retry_delay, run.retry_at = (decision.delay or None), time.monotonic() + decision.delay
        run.attempt = AttemptRun.of(run.retried, spec)
        run.move("AttemptCreationPending")

    # ------------------------------------------------------------ tasks

    def _step_tasks(self, run: FrameworkRun) -> None:
        now = time.monotonic()
        for role in run.attempt.roles:
            for task in role.tasks:
                if task.state == "AttemptCreationPending" and now >= task.retry_at:
                    task.retry_delay = None
                    task.pod = self.kubelet.create(
                        run.namespace, role.task_spec.get("pod") or {}, self._identity(run, role, task)
                    )
                    task.move("AttemptPreparing")
                if task.state == "AttemptPreparing" and task.pod is not None and self.kubelet.try_start(task.pod):
                    task.attempt_run = timestamp()
                    task.move("AttemptRunning")
                if task.state != "AttemptRunning" or task.pod is None:
                    continue
                pod = task.pod
                if not (self.kubelet.stop(pod) if pod.ending else self.kubelet.poll(pod)):
                    continue
                if pod.deleted:  # FC sees the deletion first, whatever the containers did
                    task.completion = codes.externally_deleted()
                else:
                    task.completion = codes.pod_completion(pod.exits, pod.reason, pod.message)
                task.attempt_completion_time = timestamp()
                decision = codes.should_retry(role.task_spec.get("retryPolicy"), task.accountable, task.completion)
                if decision.retry:
                    task.retry(decision.accountable, decision.delay, now)
                    continue
                task.completion_time = task.attempt_completion_time
                task.move("Completed")
                attempt_completion = self._policy(run, role, task)
                if attempt_completion is not None:
                    self._complete_attempt(run, attempt_completion)
                    return

    def _policy(self, run: FrameworkRun, role: RoleRun, task: TaskRun) -> dict[str, Any] | None:
        """The framework attempt's completion status if ``task`` completing fires a condition (B.3)."""
        assert task.completion is not None
        min_failed, min_succeeded = role.policy
        done = [t for t in role.tasks if t.state == "Completed"]
        trigger = {"taskRoleName": role.name, "taskIndex": task.index}
        inherited = {k: v for k, v in task.completion.items() if k != "pod"}
        failed = sum(t.code != 0 for t in done)
        if task.code != 0 and min_failed >= 1 and failed >= min_failed:
            message = f"FailedTaskCount {failed} has reached MinFailedTaskCount {min_failed} in the TaskRole"
            return inherited | {
                "diagnostics": f"{message}: {inherited['diagnostics']}",
                "trigger": {"message": message, **trigger},
            }
        succeeded = sum(t.code == 0 for t in done)
        if task.code == 0 and min_succeeded >= 1 and succeeded >= min_succeeded:
            message = (
                f"SucceededTaskCount {succeeded} has reached MinSucceededTaskCount {min_succeeded} in the TaskRole"
            )
            return inherited | {
                "diagnostics": f"{message}: {inherited['diagnostics']}",
                "trigger": {"message": message, **trigger},
            }
        tasks = run.attempt.tasks()
        if all(t.state == "Completed" for t in tasks):
            n = len(tasks)
            message = (
                f"CompletedTaskCount {n} has reached TotalTaskCount {n} and no user specified conditions in "
                "FrameworkAttemptCompletionPolicy have ever been triggered"
            )
            return codes.status_of(codes.SUCCEEDED, message) | {"trigger": {"message": message, **trigger}}
        return None

    @staticmethod
    def _identity(run: FrameworkRun, role: RoleRun, task: TaskRun) -> dict[str, str]:
        """The FC_* variables (and placeholder values) of one task attempt's pod (B.6)."""
        attempt = run.attempt
        return {
            "FC_FRAMEWORK_NAMESPACE": run.namespace,
            "FC_FRAMEWORK_NAME": run.name,
            "FC_TASKROLE_NAME": role.name,
            "FC_TASK_INDEX": str(task.index),
            "FC_CONFIGMAP_NAME": f"{run.name}-attempt",
            "FC_POD_NAME": f"{run.name}-{role.name}-{task.index}",
            "FC_FRAMEWORK_UID": run.uid,
            "FC_FRAMEWORK_ATTEMPT_ID": str(attempt.id),
            "FC_FRAMEWORK_ATTEMPT_INSTANCE_UID": f"{attempt.id}_{attempt.configmap_uid}",
            "FC_CONFIGMAP_UID": attempt.configmap_uid,
            "FC_TASKROLE_UID": role.uid,
            "FC_TASK_UID": task.uid,
            "FC_TASK_ATTEMPT_ID": str(task.attempt_id),
            "FC_POD_UID": task.pod_uid,
            "FC_TASK_ATTEMPT_INSTANCE_UID": f"{task.attempt_id}_{task.pod_uid}",
        }
