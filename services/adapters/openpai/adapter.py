"""The openpai adapter: each trial attempt is one OpenPAI job (NNI's ``platform: openpai``).

Files go through the share that the cluster mounts (``localStorageMountPoint`` here,
``containerStorageMountPoint`` in the containers), under ``trialbus/``: the keeper and the
``nni`` shim once per content hash (``bin/<hash>/``), the code snapshot once per hash
(``code/<sha256>/``), and per attempt a trial directory (``trials/<exp>/<trial>-<attempt>/``)
with the keeper's settings (0600; the trial's token never goes into the job spec). Creating
that directory is the idempotency point; submitting a job whose name exists (409, after a
crash) adopts it.

Status: one job-list request per cluster and user every ``status_poll`` seconds (the
rest-server limits job lists to 60 a minute; NNI polls every job every 3 s), then the
detail of each job that ended, for its exit code and exit spec. ``jobStatus.state`` maps to
the trial's status; FAILED carries ``appExitCode`` and the exit spec (its ``behavior``:
transient, permanent or unknown) into the trial's message and failure class; STOPPED after
our cancel takes the cancel's status, after anyone else's SYS_CANCELED; UNKNOWN and HTTP
errors leave the trial running (transient). The trial's own exit code comes from the
keeper's ``state.json`` on the share.

OpenPAI retries a job by itself after every failure its exit spec calls transient (a lost
node, an eviction, a preemption, SIGKILL: ``reaction: ALWAYS_RETRY``, whatever
``jobRetryCount`` says; the protocol cannot turn it off). Trialbus retries trials itself, as
the experiment's ``retry:`` says, as the trial's next attempt: so once the trial has started
(its reporting task's folder exists on the share) and the job list shows such a retry
(``retryDetails.platform``), the adapter stops the job, and the attempt ends FAILED once it
is stopped, with the failure class of the exit spec OpenPAI kept for the platform attempt that
failed (``preempted`` for an eviction or a preemption, else ``infrastructure``). Before the
trial started (an allocation that timed out) OpenPAI's retries are left alone, and so are the
ones ``jobRetryCount`` asks for.

In reuse mode (``reuseMode: true``, ``reuse.py``) trials are handed to a pool of long-running
environment jobs instead, through tickets on the share; a trial's end is then the keeper's
``state.json``, watched every ``reuse_poll`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from contracts import TrainingService, TrialRequest, TrialStatus, sealing
from contracts.base import utcnow
from contracts.experiment import OpenpaiConfig
from services.adapters import sharefs
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, Stale, TransientError
from services.adapters.keeper import Bundle
from services.adapters.openpai import jobs
from services.adapters.openpai.client import FINAL, JobExists, OpenpaiClient
from services.adapters.openpai.reuse import Environment, Pools
from services.adapters.openpai.settings import OpenpaiSettings
from services.common import platforms
from services.common.bus import Bus

log = logging.getLogger(__name__)

#: ``failure`` of a trial from the exit spec's ``behavior``.
BEHAVIOR = {"TRANSIENT": "infrastructure", "TRANSIENT_CONFLICT": "infrastructure", "PERMANENT": "permanent"}
#: Exit codes of a task stopped for someone else's reason, failure ``preempted`` rather than the
#: TRANSIENT behavior's ``infrastructure`` (OpenPAI's k8s-job-exit-spec.yaml): −101
#: PodExternalDeleted ("Pod is deleted by external unexpectedly": a drain, a preemption),
#: −1000 PodEvicted ("Pod is evicted by K8S, maybe its node is out of resource"), −1003
#: PodPreemptedForCriticalPod ("Pod is preempted by the kubelet of its node for the admission
#: of other more critical platform Pod"). −1001 PodNodeLost stays ``infrastructure``.
PREEMPTED = frozenset({-101, -1000, -1003})


@dataclass(eq=False)
class Job:
    handle: TrialHandle
    client: OpenpaiClient
    name: str
    share: sharefs.Share
    report: str  # the reporting task role
    state: str = "WAITING"  # jobStatus.state as last read
    outcome: TrialOutcome | None = None
    detail: dict = field(default_factory=dict)
    env: Environment | None = None  # reuse mode: the environment running it
    tasks: int = 1  # tasks of the job (or environment): more than one stop together in reuse mode
    seen: float = 0.0  # reuse mode: mtime of the reporting task's state.json when last read
    since: float = field(default_factory=time.monotonic)  # when ``state`` last changed
    #: OpenPAI's own retries of the job after platform failures, as last seen before the trial started.
    platform_retries: int = 0
    #: Why the attempt ended, once OpenPAI retried the job by itself and the adapter stopped it,
    #: and the failure class of the platform attempt that failed (its exit spec).
    taken_back: str | None = None
    taken_failure: str = "infrastructure"


class OpenpaiAdapter(PlatformAdapter):
    name = "openpai"

    def __init__(self, settings: OpenpaiSettings):
        self.settings = settings
        self.bundle = bundle()
        self.clients: dict[tuple[str, str, str], OpenpaiClient] = {}
        self.jobs: dict[tuple[str, int], Job] = {}
        self.pools = Pools(settings)
        self._bus: Bus | None = None
        self._loops: list[asyncio.Task] = []

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._loops = [asyncio.create_task(self._status_loop()), asyncio.create_task(self._reuse_loop())]

    async def stop(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self.clients.values()), return_exceptions=True)

    def client(self, service: OpenpaiConfig) -> OpenpaiClient:
        token = service.token.get_secret_value()
        key = (service.host, service.username, hashlib.sha256(token.encode()).hexdigest())
        if (found := self.clients.get(key)) is None:
            found = self.clients[key] = OpenpaiClient(
                service.host, service.username, token, self.settings.openpai_ca_bundle,
                self.settings.request_timeout, self.settings.rate_limit_backoff,
            )  # fmt: skip
        return found

    async def check(self, service: TrainingService) -> list[str]:
        if not isinstance(service, OpenpaiConfig):
            return [f"the openpai adapter cannot run platform {service.platform!r}"]
        problems = []
        share = Path(service.local_storage_mount_point)
        if not share.is_dir():
            problems.append(f"localStorageMountPoint {share} is not a directory on the adapter's host "
                            "(mount the share there)")  # fmt: skip
        elif not os.access(share, os.W_OK):
            problems.append(f"localStorageMountPoint {share} is not writable by the adapter")
        try:
            problems += await self.client(service).check(service.virtual_cluster, service.storage_config_name)
        except (TransientError, PermanentError) as exc:
            problems.append(str(exc))
        return problems

    # ------------------------------------------------------------------ launch

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (job := self.jobs.get(key)) is not None:
            return job.handle
        service = request.training_service
        if not isinstance(service, OpenpaiConfig):
            raise PermanentError(f"the openpai adapter cannot run platform {service.platform!r}")
        local, container = service.local_storage_mount_point.rstrip("/"), service.container_storage_mount_point
        try:
            report = jobs.reporting_role(service)
            name, share, job_spec = jobs.trial_job(service, request.experiment_id, request.trial_id, request.attempt,
                                                   request.trial_command, request.trial_gpu_number or 0,
                                                   self.bundle.hash)  # fmt: skip
        except ValueError as exc:
            raise PermanentError(str(exc)) from None
        root = sharefs.Share(local, container)
        keeper, fresh = await sharefs.prepare(self._bus, self.bundle, root, share, request, "pai", self.settings)
        client = self.client(service)
        if service.reuse_mode:
            env = await self.pools.place(key, service, client, request.experiment_id, share.container, fresh,
                                         request.trial_gpu_number or 0, request.trial_command, keeper)  # fmt: skip
            job = self.jobs[key] = Job(TrialHandle(request.experiment_id, request.trial_id, request.attempt,
                                                   ref=f"{client.framework(env.name)}#{share.local}"),
                                       client, env.name, share, report, env=env, tasks=_tasks(service))  # fmt: skip
            return job.handle
        try:
            await client.submit(yaml.safe_dump(job_spec, sort_keys=False), name)
        except JobExists:
            if fresh:  # not ours: a name we did not submit
                raise PermanentError(f"an OpenPAI job named {client.framework(name)} exists already") from None
            log.info("job %s was submitted before a restart: adopting it", client.framework(name))
        job = self.jobs[key] = Job(TrialHandle(request.experiment_id, request.trial_id, request.attempt,
                                               ref=f"{client.framework(name)}#{share.local}", start_time=utcnow()),
                                   client, name, share, report)  # fmt: skip
        return job.handle

    # ------------------------------------------------------------------ watching

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        job = self._find(handle)
        if job.outcome is not None:
            return job.outcome
        if job.env is not None:
            key = (handle.trial_id, handle.attempt)
            job.outcome = self.pools.outcome(job.env, key, job.share.local, job.report)
            if job.outcome is not None:
                self.pools.ended(job.env, key, job.share.local, job.tasks)
            elif not (Path(job.share.local) / f"{job.report}-0").exists():  # not begun: the environment's state
                env = job.env
                self._note(job.client, job.client.framework(env.name), env.state, env.since, "environment job")
            return job.outcome
        if job.state not in FINAL:
            self._note(job.client, job.client.framework(job.name), job.state, job.since, "job")
            return None
        if not job.detail:
            job.detail = await job.client.job(job.name) or {}
        job.outcome = outcome_of(job)
        return job.outcome

    def _note(self, client: OpenpaiClient, what: str, state: str, since: float, kind: str) -> None:
        """Raise Stale (users see the message on the RUNNING trial) while the job's state is not
        current, unknown, or WAITING for long in OpenPAI's queue."""
        note = None
        if client.error is not None:
            note = f"cannot read the state of {kind} {what} from OpenPAI: {client.error}"
        elif state == "UNKNOWN":
            note = f"OpenPAI reports {kind} {what} in state UNKNOWN; waiting for it to settle"
        elif state == "WAITING" and time.monotonic() - since > self.settings.queue_note_after:
            note = f"{kind} {what} is waiting in OpenPAI's queue"
        if note is not None:
            raise Stale(note, delay=self.settings.poll_interval)

    async def cancel(self, handle: TrialHandle) -> None:
        job = self._find(handle)
        if job.outcome is not None:
            return
        if job.env is None:
            await job.client.stop(job.name)
        elif self.pools.cancel(job.share.local, job.report):  # it had not started: it never will
            job.outcome = TrialOutcome(TrialStatus.FAILED, None, "canceled before it started", None, utcnow())
            self.pools.ended(job.env, (handle.trial_id, handle.attempt), job.share.local, job.tasks)
            self.notify(handle)

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.status_poll)
            for client in list(self.clients.values()):
                ours = {j.name: j for j in self.jobs.values() if j.client is client and j.outcome is None and not j.env}
                envs = {e.name: e for e in self.pools.environments.values() if e.client is client and e.live}
                if not ours and not envs:
                    continue
                try:
                    summaries, client.error = await client.jobs("trialbus_"), None
                except (TransientError, PermanentError) as exc:
                    log.warning("cannot read job states from %s: %s", client.host, exc)
                    client.error = str(exc)
                    continue
                for summary in summaries:
                    name, state = summary.get("name", ""), str(summary.get("state"))
                    if (job := ours.get(name)) is not None:
                        if state != job.state:
                            job.state, job.since = state, time.monotonic()
                            self.notify(job.handle)
                        retries = platform_retries(summary)
                        if job.taken_back is None and state not in FINAL and retries > job.platform_retries:
                            await self._take_back(job, retries)
                    elif (env := envs.get(name)) is not None and state != env.state:
                        env.state, env.since = state, time.monotonic()
                        if state in FINAL:
                            await self._lost(env)

    async def _take_back(self, job: Job, retries: int) -> None:
        """OpenPAI retried the job by itself (see the module docstring): stop it, so that the
        dispatcher retries the trial as its next attempt; unless the trial had not started
        (``retries``: OpenPAI's own retries so far, remembered then)."""
        if not (Path(job.share.local) / f"{job.report}-0").exists():
            job.platform_retries = retries
            return
        what = job.client.framework(job.name)
        try:
            await job.client.stop(job.name)
        except (TransientError, PermanentError) as exc:  # the next status poll tries again
            log.warning("cannot stop OpenPAI's own retry of job %s: %s", what, exc)
            return
        log.info("OpenPAI retried job %s by itself after a platform failure: stopped it", what)
        spec = await self._exit_spec(job, retries - 1)  # the platform attempt that failed
        why = f"exit code {spec['code']} ({spec.get('phrase') or 'transient'})" if spec.get("code") is not None \
            else "a reason of the platform its exit spec calls transient (a lost node, an eviction, a preemption)"
        job.taken_failure = failure_of(spec) if spec else "infrastructure"
        job.taken_back = (f"OpenPAI job {what} failed for {why} and OpenPAI retried it by itself; Trialbus stopped "
                          "that retry to retry the trial as its next attempt")  # fmt: skip

    async def _exit_spec(self, job: Job, attempt_id: int) -> dict:
        """The exit spec a platform attempt of the job ended with ({} when OpenPAI cannot say)."""
        try:
            detail = await job.client.attempt(job.name, attempt_id)
        except (TransientError, PermanentError) as exc:
            log.info("cannot read attempt %d of job %s: %s", attempt_id, job.client.framework(job.name), exc)
            return {}
        spec = ((detail or {}).get("jobStatus") or {}).get("appExitSpec")
        return spec if isinstance(spec, dict) else {}

    async def _lost(self, env: Environment) -> None:
        """An environment ended under its trials: the one that ran ends; the others move."""
        log.warning("environment %s ended (%s)", env.client.framework(env.name), env.state)
        for key in self.pools.lost(env):
            job = self.jobs.get(key)
            if job is None or (Path(job.share.local) / f"{job.report}-0").exists():
                if job is not None:
                    self.notify(job.handle)
                continue
            service = await self._service(job.handle.experiment_id)
            try:
                if service is None:
                    raise PermanentError(f"experiment {job.handle.experiment_id} is gone")
                env.drop(key)
                job.env = await self.pools.place(key, service, job.client, job.handle.experiment_id,
                                                 job.share.container, True, env.gpus, env.trial_command,
                                                 self.bundle.hash)  # fmt: skip
                log.info("trial %s moved to environment %s", key[0], job.env.name)
            except (TransientError, PermanentError) as exc:
                log.warning("cannot move trial %s to another environment: %s", key[0], exc)
                self.notify(job.handle)

    async def _reuse_loop(self) -> None:
        """Reuse mode: a trial's end as soon as its keeper writes it; environments' upkeep."""
        while True:
            await asyncio.sleep(self.settings.reuse_poll)
            for job in list(self.jobs.values()):
                if job.env is not None and job.outcome is None:
                    with contextlib.suppress(OSError):
                        mtime = (Path(job.share.local) / f"{job.report}-0" / ".trialbus" / "state.json").stat().st_mtime
                        if mtime != job.seen:
                            job.seen = mtime
                            self.notify(job.handle)
            await self.pools.tick()

    # ------------------------------------------------------------------ restarts

    async def adopt(self) -> list[TrialHandle]:
        """Jobs (or, in reuse mode, environments' trials) of the openpai experiments on the bus
        whose trials were never reported."""
        handles = []
        for state in await platforms.experiments(self._bus):
            service = state.config.service_for(self.name)
            if not isinstance(service, OpenpaiConfig):
                continue
            if (unreadable := sealing.unreadable(service)) is not None:
                log.warning("cannot adopt the jobs of experiment %s: %s", state.id, unreadable)
                continue
            client, report = self.client(service), jobs.reporting_role(service)
            held = {}
            if service.reuse_mode:
                gpus = state.config.gpus_for(service)
                held = self.pools.adopt(state.id, service.local_storage_mount_point, client, gpus or 0,
                                        state.config.command_for(service), self.settings.replica)  # fmt: skip
            attempts = sharefs.unreported(service.local_storage_mount_point, state.id, self.settings.replica)
            for key in set(held) - {(t, a) for t, a, _ in attempts}:  # released before its ticket was removed
                held.pop(key).drop(key)
            for trial_id, attempt, entry in attempts:
                key = (trial_id, attempt)
                if service.reuse_mode and key not in held:
                    continue  # never handed over: its request comes again
                where = f"trialbus/trials/{state.id}/{entry.name}"
                share = sharefs.Share(str(entry), f"{service.container_storage_mount_point}/{where}")
                env = held.get(key)
                name = env.name if env else jobs.job_name(state.id, trial_id, key[1])
                started = datetime.fromtimestamp(entry.stat().st_mtime, UTC)
                handle = TrialHandle(state.id, trial_id, key[1], ref=f"{client.framework(name)}#{entry}",
                                     start_time=started)  # fmt: skip
                self.jobs[key] = Job(handle, client, name, share, report, env=env, tasks=_tasks(service))
                handles.append(handle)
        return handles

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        """An attempt (the newest by default) of a finished trial whose folder the share keeps (its logs)."""
        service = await self._service(experiment_id)
        root = service.local_storage_mount_point if service else None
        found = sharefs.newest_attempt(root, experiment_id, trial_id, attempt) if root else None
        if not found:
            return None
        return TrialHandle(experiment_id, trial_id, found[0], ref=f"{self.client(service).username}#{found[1]}")

    async def _service(self, experiment_id: str) -> OpenpaiConfig | None:
        for state in await platforms.experiments(self._bus):
            service = state.config.service_for(self.name)
            if state.id == experiment_id and isinstance(service, OpenpaiConfig):
                return service
        return None

    async def release(self, handle: TrialHandle) -> None:
        job = self.jobs.pop((handle.trial_id, handle.attempt), None)
        if job is not None and job.env is not None:
            job.env.drop((handle.trial_id, handle.attempt))
        sharefs.mark_reported(job.share.local if job else handle.ref.split("#", 1)[1])

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        job = self.jobs.get((handle.trial_id, handle.attempt))
        return await asyncio.to_thread(sharefs.log_tail, job.share.local if job else handle.ref.split("#", 1)[1],
                                       max_bytes)  # fmt: skip

    def _find(self, handle: TrialHandle) -> Job:
        job = self.jobs.get((handle.trial_id, handle.attempt))
        if job is None:
            raise PermanentError(f"trial {handle.trial_id} attempt {handle.attempt} is not known to this replica")
        return job

    def describe(self) -> dict:
        clusters = []
        for client in self.clients.values():
            environments, busy = self.pools.describe(client)
            jobs_ = sum(1 for j in self.jobs.values() if j.client is client and j.env is None and j.outcome is None)
            clusters.append({"name": f"{client.username}@{client.host}", "jobs": jobs_,
                             "environments": environments, "busy_environments": busy,
                             "paused_for": client.paused_for(), "error": client.error})  # fmt: skip
        return {"clusters": clusters}


def bundle() -> Bundle:
    """The files the adapter installs on the share: the keeper, the ``nni`` shim and the
    reuse-mode runner with its warm-start files (their hash names their folder, and appears
    in every job)."""
    from services.trial_keeper import KEEPER_PATH, SHIM_PATH, WARM_FILES

    return Bundle(KEEPER_PATH, SHIM_PATH, {jobs.RUNNER: Path(__file__).with_name("runner.py"), **WARM_FILES})


def _tasks(service: OpenpaiConfig) -> int:
    """The tasks of a trial's job: the instances of every task role."""
    roles = (service.openpai_config or {}).get("taskRoles") or {"taskrole": {}}
    return sum(int(spec.get("instances", 1)) if isinstance(spec, dict) else 1 for spec in roles.values())


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
        return TrialOutcome(TrialStatus.SYS_CANCELED, exit_code, f"job {job.client.framework(job.name)} was stopped "
                            "outside Trialbus", None, end_time)  # fmt: skip
    spec = status.get("appExitSpec") or {}
    code = status.get("appExitCode")
    phrase = spec.get("phrase") or "unknown"
    behavior = spec.get("behavior") or "UNKNOWN"
    message = f"OpenPAI job {job.client.framework(job.name)} failed: exit code {code} ({phrase}, {behavior.lower()})"
    if exit_code is not None:
        message += f"; the trial command exited with {exit_code}"
    if diagnostics := str(status.get("appExitDiagnostics") or "").strip():
        message += f": {diagnostics.splitlines()[0][:200]}"
    return TrialOutcome(TrialStatus.FAILED, exit_code, message, failure_of(spec), end_time)


def failure_of(spec: dict) -> str:
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
