"""Jobs run as real local processes and driven through FrameworkController's states.

Each task (task role x instance) is ``bash -c <USER_CMD>`` in its own process group and its
own directory under ``<state>/jobs``, with the environment OpenPAI gives a task container
(``env.py``). ``Runner.tick`` is the controller: every ``TICK`` seconds it moves each job one
step through

    AttemptCreationPending -> AttemptPreparing -> AttemptRunning -> AttemptDeletionPending
    -> AttemptCompleted -> (AttemptCreationPending with attemptId+1 | Completed)

applying the framework attempt completion policy (minFailed/minSucceeded per task role, as
PAI defaults them), the retry policy (fancy retry with ``jobRetryCount``; task retries only
with ``extras.gangAllocation: false``) and the exit spec's reactions. When an attempt
completes, the tasks still running are killed (SIGTERM, then SIGKILL after ``KILL_GRACE``)
and get code -220; a stop gives -210. Every process group is also recorded as a file under
``<state>/pgids`` until it is gone, so a launcher can kill what a crashed server left behind.

``Runner.fail`` ends a running task for a reason of the platform, as a test asks: its pod
deleted by someone (-101), evicted (-1000), preempted by its kubelet (-1003) — SIGTERM, SIGKILL
after ``KILL_GRACE`` — or lost with its node (-1001): every process of the task dies at once,
also those that left its process group. The task then completes with that code, and the exit
spec's reaction (ALWAYS_RETRY for all four) decides the rest, as for any other code.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import exitspec
from .env import allocate_ports, completion_policy, convert_name, task_env
from .render import render_secrets

TICK = 0.05
KILL_GRACE = 2.0
LOG_TAIL = 10 * 1024 * 1024


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Task:
    """One instance of a task role in one job attempt (a pod in OpenPAI)."""

    role: str
    index: int
    dir: Path
    ports: dict[str, list[int]]
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    pod_uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    state: str = "AttemptPreparing"
    attempt_id: int = 0
    retries: int = 0
    accountable: int = 0
    proc: subprocess.Popen[bytes] | None = None
    kill_sent: float | None = None
    code: int | None = None
    diagnostics: str | None = None
    created: int = field(default_factory=now_ms)
    launched: int | None = None
    completed: int | None = None
    attempt_created: int = field(default_factory=now_ms)
    failing: tuple[int, str] | None = None  # (code, diagnostics) it ends with: set by ``Runner.fail``


@dataclass
class Attempt:
    """One framework attempt: its tasks by task role (original names) and how it completed."""

    id: int
    tasks: dict[str, list[Task]]
    uid: str = ""
    created: int = field(default_factory=now_ms)
    launched: int | None = None
    completed: int | None = None
    completion: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.uid = f"{self.id}_{uuid.uuid4()}"

    def all_tasks(self) -> list[Task]:
        return [t for tasks in self.tasks.values() for t in tasks]


@dataclass
class Job:
    """A submitted job: its stored config, rendered commands and FrameworkController status."""

    user: str
    name: str
    virtual_cluster: str
    config: dict[str, Any]
    entrypoints: dict[str, str]
    submitted: int = field(default_factory=now_ms)
    state: str = "AttemptCreationPending"
    execution: str = "START"
    retries: int = 0
    accountable: int = 0
    retry_delay: int | None = None
    created: int | None = None
    launched: int | None = None
    completed: int | None = None
    attempt: Attempt | None = None
    history: list[Attempt] = field(default_factory=list)
    completion: dict[str, Any] | None = None
    tags: list[str] = field(default_factory=list)
    next_attempt_at: float = 0.0

    @property
    def framework_name(self) -> str:
        return f"{self.user}~{self.name}"

    @property
    def debug_id(self) -> str:
        return hashlib.md5(self.framework_name.encode()).hexdigest()  # noqa: S324 - PAI's naming, not security


def _completion(code: int, diagnostics: str, trigger: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = exitspec.record(code) or {}
    return {
        "code": code,
        "phrase": spec.get("phrase"),
        "type": {"name": "Succeeded" if code == 0 else "Failed", "attributes": []},
        "diagnostics": diagnostics,
        "trigger": trigger,
    }


def _stopped() -> dict[str, Any]:
    return _completion(exitspec.STOP_REQUESTED, "User has requested to stop the Framework")


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _kill_all(pid: int) -> None:
    """SIGKILL to a task's process group and to every process its main process started."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    _signal_group(pid, signal.SIGKILL)
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _tail(path: Path) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL))
        return f.read().decode(errors="replace")


class Runner:
    """All jobs of one emulator, and the controller loop that runs them."""

    def __init__(self, state_dir: Path, lag: float = 0.0) -> None:
        self.state_dir = state_dir
        self.lag = lag
        self.jobs: dict[str, Job] = {}
        self.pgid_dir = state_dir / "pgids"
        self.pgid_dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ requests

    def submit(self, user: str, name: str, vc: str, config: dict[str, Any], entrypoints: dict[str, str]) -> Job:
        job = Job(user=user, name=name, virtual_cluster=vc, config=config, entrypoints=entrypoints)
        job.next_attempt_at = time.monotonic() + self.lag
        self.jobs[job.framework_name] = job
        return job

    def stop(self, job: Job) -> None:
        """``executionType: STOP``; the controller loop does the rest."""
        job.execution = "STOP"

    def fail(self, job: Job, role: str, index: int, code: int) -> bool:
        """End a running task of ``job`` for a reason of the platform (see the module docstring);
        False when no such task runs."""
        tasks = (job.attempt.tasks.get(role) or []) if job.attempt and job.state == "AttemptRunning" else []
        task = tasks[index] if 0 <= index < len(tasks) else None
        if task is None or task.proc is None or task.failing is not None:
            return False
        if code == exitspec.POD_EXTERNAL_DELETED:
            diagnostics = "Pod is being deleted by others"
        else:
            pod = {"reason": exitspec.POD_REASONS.get(code, ""), "message": exitspec.record(code)["reason"]}  # type: ignore[index]
            diagnostics = f"Pod failed: PodPattern matched: {json.dumps(pod)}"
        task.failing = (code, diagnostics)
        if code == exitspec.NODE_LOST:  # the node is gone, with every process on it
            _kill_all(task.proc.pid)
        else:
            task.kill_sent = time.monotonic()
            _signal_group(task.proc.pid, signal.SIGTERM)
        return True

    # ------------------------------------------------------------ the controller

    async def run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(TICK)

    def tick(self) -> None:
        for job in list(self.jobs.values()):
            if job.state != "Completed":
                try:
                    self._advance(job)
                except Exception:  # one broken job must not stop the others; the log shows it
                    print(f"controller error on {job.framework_name}:", file=sys.stderr)
                    traceback.print_exc()

    def _advance(self, job: Job) -> None:
        attempt = job.attempt
        if job.state == "AttemptCreationPending":
            if job.execution == "STOP":
                job.completion = _stopped()
                job.state, job.completed = "Completed", now_ms()
            elif time.monotonic() >= job.next_attempt_at:
                self._create_attempt(job)
        elif attempt is None:
            raise RuntimeError(f"{job.framework_name} is {job.state} without an attempt")
        elif job.state == "AttemptPreparing":
            if job.execution == "STOP":
                self._begin_deletion(job, _stopped())
                return
            for task in attempt.all_tasks():
                self._spawn(job, attempt, task)
            attempt.launched = now_ms()
            job.launched = job.launched or attempt.launched
            job.state = "AttemptRunning"
        elif job.state == "AttemptRunning":
            if job.execution == "STOP":
                self._begin_deletion(job, _stopped())
            else:
                self._poll_running(job, attempt)
        elif job.state == "AttemptDeletionPending":
            self._poll_deleting(job, attempt)
        elif job.state == "AttemptCompleted":
            self._after_attempt(job, attempt)

    def _create_attempt(self, job: Job) -> None:
        attempt_id = job.retries
        root = self.state_dir / "jobs" / job.framework_name / f"attempt-{attempt_id}"
        tasks: dict[str, list[Task]] = {}
        for role, spec in job.config["taskRoles"].items():
            labels = {k: int(v) for k, v in (spec["resourcePerInstance"].get("ports") or {}).items()}
            for label in ("ssh", "http"):
                labels.setdefault(label, 1)
            tasks[role] = []
            for index in range(int(spec.get("instances") or 1)):
                task_dir = root / convert_name(role) / str(index)
                task_dir.mkdir(parents=True, exist_ok=True)
                tasks[role].append(Task(role=role, index=index, dir=task_dir, ports=allocate_ports(labels)))
        job.attempt = Attempt(id=attempt_id, tasks=tasks)
        job.created = job.created or job.attempt.created
        job.retry_delay = None
        job.state = "AttemptPreparing"

    def _spawn(self, job: Job, attempt: Attempt, task: Task) -> None:
        env = {**os.environ, **task_env(job, attempt, task)}
        command = render_secrets(job.entrypoints[task.role], job.config.get("secrets"))
        (task.dir / "user.sh").write_text(command + "\n")
        with (task.dir / "user.pai.stdout").open("ab") as out, (task.dir / "user.pai.stderr").open("ab") as err:
            task.proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=task.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        (self.pgid_dir / str(task.proc.pid)).touch()
        task.state, task.launched = "AttemptRunning", now_ms()
        task.kill_sent = None

    def _reap(self, task: Task) -> int | None:
        """The task's user exit status once its process is gone (its whole group killed then)."""
        if task.proc is None:
            return 0
        rc = task.proc.poll()
        if rc is None:
            return None
        _signal_group(task.proc.pid, signal.SIGKILL)  # a container ends with its main process
        (self.pgid_dir / str(task.proc.pid)).unlink(missing_ok=True)
        task.proc = None
        return 128 - rc if rc < 0 else rc

    def _poll_running(self, job: Job, attempt: Attempt) -> None:
        for task in attempt.all_tasks():
            if task.state != "AttemptRunning":
                continue
            if (
                task.failing is not None
                and task.proc is not None
                and task.kill_sent is not None
                and time.monotonic() - task.kill_sent > KILL_GRACE
            ):
                _kill_all(task.proc.pid)
            user_exit = self._reap(task)
            if user_exit is None:
                continue
            if task.failing is not None:  # the platform's reason, whatever the processes did
                (code, task.diagnostics), task.failing = task.failing, None
                task.code = code
            else:
                log = _tail(task.dir / "user.pai.stdout") + _tail(task.dir / "user.pai.stderr")
                code, matched = exitspec.classify(user_exit, log)
                task.code, task.diagnostics = code, _pod_diagnostics(code, user_exit, matched, log)
            if code != 0 and self._task_retries(job, task, code):
                task.retries += 1
                task.attempt_id += 1
                task.pod_uid, task.attempt_created = str(uuid.uuid4()), now_ms()
                task.code = task.diagnostics = None
                self._spawn(job, attempt, task)
                continue
            task.state, task.completed = "Completed", now_ms()
            completion = self._policy_triggered(job, attempt, task)
            if completion is not None:
                self._begin_deletion(job, completion)
                return

    def _task_retries(self, job: Job, task: Task, code: int) -> bool:
        if (job.config.get("extras") or {}).get("gangAllocation") is not False:
            return False  # taskRetryCount is ignored unless gang allocation is off (PAI issue #5004)
        reaction = exitspec.reaction(code)
        if reaction in (exitspec.RETRY_ALWAYS, exitspec.RETRY_BACKOFF):
            return True
        limit = job.config["taskRoles"][task.role].get("taskRetryCount") or 0
        if reaction == exitspec.RETRY_TO_MAX and task.accountable < limit:
            task.accountable += 1
            return True
        return False

    def _policy_triggered(self, job: Job, attempt: Attempt, task: Task) -> dict[str, Any] | None:
        role = job.config["taskRoles"][task.role]
        min_failed, min_succeeded = completion_policy(role)
        done = [t for t in attempt.tasks[task.role] if t.state == "Completed"]
        trigger = {"taskRoleName": convert_name(task.role), "taskIndex": task.index}
        failed = sum(t.code != 0 for t in done)
        if task.code != 0 and min_failed >= 1 and failed >= min_failed:
            message = f"FailedTaskCount {failed} has reached MinFailedTaskCount {min_failed} in the TaskRole"
            return _completion(task.code, f"{message}: {task.diagnostics}", {**trigger, "message": message})
        succeeded = sum(t.code == 0 for t in done)
        if task.code == 0 and min_succeeded >= 1 and succeeded >= min_succeeded:
            message = f"SucceededTaskCount {succeeded} has reached MinSucceededTaskCount {min_succeeded}"
            message += " in the TaskRole"
            return _completion(0, message, {**trigger, "message": message})
        tasks = attempt.all_tasks()
        if all(t.state == "Completed" for t in tasks):
            n = len(tasks)
            message = (
                f"CompletedTaskCount {n} has reached TotalTaskCount {n} and no user specified conditions in "
                "FrameworkAttemptCompletionPolicy have ever been triggered"
            )
            return _completion(0, message, {**trigger, "message": message})
        return None

    def _begin_deletion(self, job: Job, completion: dict[str, Any]) -> None:
        assert job.attempt is not None
        job.attempt.completion = completion
        job.state = "AttemptDeletionPending"
        self._poll_deleting(job, job.attempt)

    def _poll_deleting(self, job: Job, attempt: Attempt) -> None:
        code = exitspec.STOP_REQUESTED if job.execution == "STOP" else exitspec.ATTEMPT_COMPLETION
        pending = False
        for task in attempt.all_tasks():
            if task.state == "Completed":
                continue
            if task.proc is not None and self._reap(task) is None:
                pending = True
                if task.kill_sent is None:
                    task.kill_sent = time.monotonic()
                    _signal_group(task.proc.pid, signal.SIGTERM)
                elif time.monotonic() - task.kill_sent > KILL_GRACE:
                    _signal_group(task.proc.pid, signal.SIGKILL)
                continue
            task.code = code
            task.diagnostics = exitspec.record(code)["reason"]  # type: ignore[index]
            task.state, task.completed = "Completed", now_ms()
        if not pending:
            attempt.completed = now_ms()
            job.state = "AttemptCompleted"

    def _after_attempt(self, job: Job, attempt: Attempt) -> None:
        """Retry the job or complete it: FC's fancy retry policy with maxRetryCount = jobRetryCount."""
        assert attempt.completion is not None
        code = attempt.completion["code"]
        reaction = exitspec.reaction(code)
        retry = False
        if job.execution != "STOP" and code != 0:
            if reaction in (exitspec.RETRY_ALWAYS, exitspec.RETRY_BACKOFF):
                retry = True  # transient: retried without counting against jobRetryCount
            elif reaction == exitspec.RETRY_TO_MAX and job.accountable < (job.config.get("jobRetryCount") or 0):
                retry, job.accountable = True, job.accountable + 1
        if not retry:
            job.completion = attempt.completion
            job.state, job.completed = "Completed", now_ms()
            return
        job.history.append(attempt)
        job.attempt = None
        job.retries += 1
        delay = 1.0 if reaction == exitspec.RETRY_BACKOFF else 0.0  # FC waits 60-900 s; kept short here
        job.retry_delay = int(delay) if delay else None
        job.next_attempt_at = time.monotonic() + delay
        job.state = "AttemptCreationPending"

    # ------------------------------------------------------------ lookups and shutdown

    def attempt(self, job: Job, attempt_id: int) -> Attempt | None:
        for attempt in [*job.history, *([job.attempt] if job.attempt else [])]:
            if attempt.id == attempt_id:
                return attempt
        return None

    def shutdown(self) -> None:
        """Kill every task's process group (the emulator is going away)."""
        for job in self.jobs.values():
            for attempt in [job.attempt] if job.attempt else []:
                for task in attempt.all_tasks():
                    if task.proc is not None:
                        _signal_group(task.proc.pid, signal.SIGKILL)
                        task.proc.wait()
                        (self.pgid_dir / str(task.proc.pid)).unlink(missing_ok=True)
                        task.proc = None


def _pod_diagnostics(code: int, user_exit: int, matched: str | None, log: str) -> str:
    """FC's pod diagnostics; the runtime's analysis sits in the container message, as the rest-server expects."""
    if code == 0:
        return "Pod succeeded"
    lines = log.rstrip("\n").split("\n")[-15:]
    logs = {"user": "\n".join(lines), "platform": ""}
    runtime: dict[str, Any] = {"exitCode": code, "originUserExitCode": user_exit, "errorLogs": logs}
    if matched is not None:
        runtime["matchedUserLogString"] = matched
    message = f"[PAI_RUNTIME_ERROR_START]\n{json.dumps(runtime)}\n[PAI_RUNTIME_ERROR_END]"
    pod = {"containers": [{"name": "app", "reason": "Error", "message": message, "code": code}]}
    return f"Pod failed: PodPattern matched: {json.dumps(pod)}"
