"""Watching OpenPAI jobs: their states, OpenPAI's own retries taken back, a trial's end, cancel.

Status: one job-list request per cluster and user every ``status_poll`` seconds (the
rest-server limits job lists to 60 a minute; NNI polls every job every 3 s), then the
detail of each job that ended, for its exit code and exit spec, read as the trial's outcome
by :func:`~.outcome.outcome_of`. UNKNOWN and HTTP errors leave the trial running
(transient), and so does a job WAITING in OpenPAI's queue; users see why in the RUNNING
trial's message. The same loop reads each cluster's virtual clusters' GPUs, for every client
(with jobs or not), soon after its first use and then every ``openpai_vc_refresh`` seconds.

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

In reuse mode a trial's end is the keeper's ``state.json`` on the share, watched every
``reuse_poll`` seconds; an environment job that ends under its trials ends the one that ran
and moves the others to another environment.

:class:`Watcher` is a part of :class:`~services.adapters.openpai.adapter.OpenpaiAdapter`: it
reads and updates the :class:`~.trial.Jobs` it is given, owns the two loops, and tells the
adapter's service through ``notify`` which trials to poll now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from contracts import TrialStatus
from contracts.base import utcnow
from services.adapters import trialdir
from services.adapters.base import TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, Stale, TransientError
from services.adapters.openpai.client import FINAL, Clients, OpenpaiClient
from services.adapters.openpai.experiments import Experiments
from services.adapters.openpai.outcome import failure_of, outcome_of, platform_retries
from services.adapters.openpai.reuse import Environment, Pools
from services.adapters.openpai.settings import OpenpaiSettings
from services.adapters.openpai.trial import Job, Jobs
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class Watcher:
    """Job states, OpenPAI's own retries taken back, reuse mode's upkeep (the module's docstring)."""

    def __init__(
        self,
        settings: OpenpaiSettings,
        clients: Clients,
        tracked: Jobs,
        pools: Pools,
        experiments: Experiments,
        bundle_hash: str,
        notify: Callable[[TrialHandle], None],
    ) -> None:
        self.settings, self.clients, self.tracked, self.pools = settings, clients, tracked, pools
        self.experiments, self.bundle_hash, self.notify = experiments, bundle_hash, notify
        self._loops: list[asyncio.Task] = []

    def start(self) -> None:
        self._loops = [asyncio.create_task(self._status_loop()), asyncio.create_task(self._reuse_loop())]

    async def stop(self) -> None:
        await cancel_and_wait(self._loops)

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        job = self.tracked.find(handle)
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
        job = self.tracked.find(handle)
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
            for client in self.clients:
                if client.virtual_clusters_due(self.settings.openpai_vc_refresh):
                    await client.read_virtual_clusters()  # never raises: a failure keeps the last answer
                ours = {j.name: j for j in self.tracked if j.client is client and j.outcome is None and not j.env}
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
        why = (
            f"exit code {spec['code']} ({spec.get('phrase') or 'transient'})"
            if spec.get("code") is not None
            else "a reason of the platform its exit spec calls transient (a lost node, an eviction, a preemption)"
        )
        job.taken_failure = failure_of(spec) if spec else "infrastructure"
        job.taken_back = (
            f"OpenPAI job {what} failed for {why} and OpenPAI retried it by itself; Trialbus stopped "
            "that retry to retry the trial as its next attempt"
        )

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
            job = self.tracked.get(key)
            if job is None or (Path(job.share.local) / f"{job.report}-0").exists():
                if job is not None:
                    self.notify(job.handle)
                continue
            service = await self.experiments.service(job.handle.experiment_id)
            try:
                if service is None:
                    raise PermanentError(f"experiment {job.handle.experiment_id} is gone")
                env.drop(key)
                job.env = await self.pools.place(
                    key,
                    service,
                    job.client,
                    job.handle.experiment_id,
                    job.share.container,
                    True,
                    env.gpus,
                    env.trial_command,
                    self.bundle_hash,
                )
                log.info("trial %s moved to environment %s", key[0], job.env.name)
            except (TransientError, PermanentError) as exc:
                log.warning("cannot move trial %s to another environment: %s", key[0], exc)
                self.notify(job.handle)

    async def _reuse_loop(self) -> None:
        """Reuse mode: a trial's end as soon as its keeper writes it; environments' upkeep."""
        while True:
            await asyncio.sleep(self.settings.reuse_poll)
            for job in self.tracked:
                if job.env is not None and job.outcome is None:
                    with contextlib.suppress(OSError):
                        mtime = (Path(job.share.local) / f"{job.report}-0" / trialdir.STATE).stat().st_mtime
                        if mtime != job.seen:
                            job.seen = mtime
                            self.notify(job.handle)
            await self.pools.tick()
