"""Reuse mode (``reuseMode: true``): trials handed to long-running OpenPAI jobs.

OpenPAI lets a user submit only so many jobs an hour (about 60 on a default rest-server), so
a large experiment runs many trials per job. In reuse mode the adapter keeps, per experiment,
a pool of *environments*: OpenPAI jobs ``trialbus_<exp>_env_<id>`` built exactly like a
trial's job (the user's ``openpaiConfig`` or NNI's default job), whose tasks run the
environment runner (``runner.py``, shipped on the share) instead of one trial. A trial goes
to an idle environment, or to a new one when none is idle; as the dispatcher keeps at most
``trialConcurrency`` trials running, the pool grows to that size and no further.

The channel is the share (see ``runner.py`` for the runner's side), so it works when the
cluster cannot reach the adapter's host; trials still post metrics to the gateway, and spool
them in their folder when they cannot. On the share::

    trialbus/envs/<exp>/<env>/tickets/<n>-<trial>-<attempt>   a trial handed over (text: its folder)
    trialbus/envs/<exp>/<env>/alive                           touched while the adapter keeps the environment
    trialbus/envs/<exp>/<env>/retired                         the adapter stopped it: never adopted again
    trialbus/trials/<exp>/<trial>-<attempt>/.trialbus/cancel  stop (or skip) the trial in every task

A trial ends when the reporting task's keeper has written its end in ``state.json``. An
environment that ends while it holds trials (stopped by someone, failed, preempted) fails the
trial that ran (SYS_CANCELED when stopped) and hands the ones that had not started to
another environment. One that OpenPAI restarted by itself (its exit spec retries every
transient failure: a lost node, an eviction) finds the trial it ran begun, and its runner says
it was interrupted: that trial fails too, with failure ``infrastructure``, and the dispatcher
retries it as its next attempt. Environments idle for ``reuse_idle_timeout`` seconds are
stopped; a runner with no word from the adapter for ``reuse_orphan_timeout`` seconds leaves by
itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from contracts import TrialStatus
from contracts.experiment import OpenpaiConfig
from services.adapters import sharefs, trialdir
from services.adapters.base import TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.adapters.keeper import outcome_of
from services.adapters.openpai import jobs
from services.adapters.openpai.client import FINAL, OpenpaiClient
from services.adapters.openpai.settings import OpenpaiSettings

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (trial id, attempt)
#: How the runner's ``state.json`` error begins for a trial its environment's restart interrupted (runner.py).
INTERRUPTED = "the trial was interrupted: its OpenPAI environment restarted"
#: Seconds past the keeper's flush timeout after which a keeper that recorded its trial's exit
#: but never said done is taken for dead.
FLUSH_SLACK = 30.0


@dataclass(eq=False)
class Environment:
    """One environment job and the trials handed to it (in order; the first one runs)."""

    name: str
    experiment_id: str
    folder: Path  # on the adapter's host
    client: OpenpaiClient
    gpus: int = 0  # the job's GPUs and trial command, to build another like it
    trial_command: str = ""
    state: str = "WAITING"  # jobStatus.state as last read
    since: float = field(default_factory=time.monotonic)  # when ``state`` last changed
    tickets: dict[Key, str] = field(default_factory=dict)  # handed over and not released
    busy: list[Key] = field(default_factory=list)  # handed over and not ended
    idle_since: float = field(default_factory=time.monotonic)
    retired: bool = False

    @property
    def live(self) -> bool:
        return not self.retired and self.state not in FINAL

    def hand(self, key: Key, trial_dir: str) -> str:
        """Give the environment a trial (``trial_dir``: its folder in the container); the ticket."""
        ticket = f"{time.time_ns():020d}-{key[0]}-{key[1]}"
        tmp = self.folder / f".{ticket}"
        tmp.write_text(trial_dir)
        tmp.rename(self.folder / "tickets" / ticket)
        self.tickets[key] = ticket
        self.busy.append(key)
        return ticket

    def done(self, key: Key) -> None:
        """The trial ended (or moved): the environment may take another."""
        if key in self.busy:
            self.busy.remove(key)
            if not self.busy:
                self.idle_since = time.monotonic()

    def drop(self, key: Key) -> None:
        self.done(key)
        if (ticket := self.tickets.pop(key, None)) is not None:
            with contextlib.suppress(OSError):
                (self.folder / "tickets" / ticket).unlink()


class Pools:
    """The environments of every reuse-mode experiment this replica runs trials of."""

    def __init__(self, settings: OpenpaiSettings) -> None:
        self.settings = settings
        self.environments: dict[str, Environment] = {}  # by job name
        self._heartbeat = 0.0

    # ------------------------------------------------------------------ placing

    async def place(
        self,
        key: Key,
        service: OpenpaiConfig,
        client: OpenpaiClient,
        experiment_id: str,
        trial_dir: str,
        fresh: bool,
        gpus: int,
        trial_command: str,
        bin_hash: str,
    ) -> Environment:
        """The environment that runs the trial: the one it was handed to before a restart, an
        idle one, a new one, or — when OpenPAI refuses a new one for now — the least busy."""
        if not fresh:
            for handed in self.environments.values():
                if key in handed.tickets and handed.live:
                    if key not in handed.busy:
                        handed.busy.append(key)
                    return handed
        mine = [e for e in self.environments.values() if e.experiment_id == experiment_id and e.client is client]
        env: Environment | None = next((e for e in mine if e.live and not e.busy), None)
        if env is None:
            try:
                env = await self._create(service, client, experiment_id, gpus, trial_command, bin_hash)
            except TransientError:
                if not (live := [e for e in mine if e.live]):
                    raise
                env = min(live, key=lambda e: len(e.busy))
        env.hand(key, trial_dir)
        return env

    async def _create(
        self,
        service: OpenpaiConfig,
        client: OpenpaiClient,
        experiment_id: str,
        gpus: int,
        trial_command: str,
        bin_hash: str,
    ) -> Environment:
        try:
            name, share, spec = jobs.environment_job(
                service,
                experiment_id,
                secrets.token_hex(3),
                trial_command,
                gpus,
                bin_hash,
                self.settings.reuse_poll,
                self.settings.reuse_orphan_timeout,
            )
        except ValueError as exc:
            raise PermanentError(str(exc)) from None
        folder = Path(share.local)
        (folder / "tickets").mkdir(parents=True)
        (folder / "alive").touch()
        (folder / "replica").write_text(self.settings.replica)
        env = self.environments[name] = Environment(name, experiment_id, folder, client, gpus, trial_command)
        try:
            await client.submit(yaml.safe_dump(spec, sort_keys=False), name)
        except Exception:
            del self.environments[name]
            (folder / "retired").touch()
            raise
        log.info("submitted environment %s for experiment %s", client.framework(name), experiment_id)
        return env

    # ------------------------------------------------------------------ watching

    def outcome(self, env: Environment, key: Key, trial_folder: str, report: str) -> TrialOutcome | None:
        """How the trial ended, from the reporting task's ``state.json``; None while it runs."""
        task = Path(trial_folder) / f"{report}-0"
        state = _read_json(task / trialdir.STATE)
        ended = state.get("done") or state.get("error")
        if not ended and state.get("exitCode") is not None:
            # The keeper records the trial's exit, then delivers what is left of its metrics (for
            # up to the flush timeout), then says done: the trial is over then, or once the keeper
            # cannot finish any more (its environment ended, or it died before it was done).
            flushing = time.time() - float(state.get("endTime") or 0) < self.settings.flush_timeout + FLUSH_SLACK
            ended = env.state in FINAL or not flushing
        if ended and not (task / trialdir.ENVIRONMENT_STOPPED).exists():
            outcome = outcome_of(state, None)
            if str(state.get("error") or "").startswith(INTERRUPTED):  # what ran it went away, not the trial
                return dataclasses.replace(outcome, failure="infrastructure")
            return outcome
        if env.state not in FINAL:
            return None  # (a trial stopped with its environment ends as the environment did)
        what = env.client.framework(env.name)
        if env.state == "STOPPED":
            return TrialOutcome(
                TrialStatus.SYS_CANCELED,
                None,
                f"environment job {what} was stopped outside Trialbus while the trial ran",
            )
        started = "while the trial ran" if task.exists() else "before the trial started"
        return TrialOutcome(
            TrialStatus.FAILED, None, f"environment job {what} ended ({env.state}) {started}", "infrastructure"
        )

    def ended(self, env: Environment, key: Key, trial_folder: str, tasks: int) -> None:
        """The trial has its outcome: free the environment; tell the other tasks to stop it."""
        env.done(key)
        if tasks > 1:
            _mark(Path(trial_folder) / trialdir.CANCEL)

    def cancel(self, trial_folder: str, report: str) -> bool:
        """Ask every task to stop the trial; True when it had not started (nothing to wait for)."""
        _mark(Path(trial_folder) / trialdir.CANCEL)
        return not (Path(trial_folder) / f"{report}-0").exists()

    def lost(self, env: Environment) -> list[Key]:
        """``env`` ended by itself or by someone else: forget it; the trials it holds."""
        env.retired = True
        self.environments.pop(env.name, None)
        return list(env.busy)

    async def tick(self) -> None:
        """Heartbeats for live environments; stop the ones idle too long."""
        now = time.monotonic()
        beat = now - self._heartbeat >= min(30.0, self.settings.reuse_orphan_timeout / 4)
        for env in list(self.environments.values()):
            if not env.live:
                continue
            if not env.busy and now - env.idle_since > self.settings.reuse_idle_timeout:
                env.retired = True
                _mark(env.folder / "retired")
                del self.environments[env.name]
                log.info(
                    "environment %s idle for %.0fs: stopping it", env.client.framework(env.name), now - env.idle_since
                )
                try:
                    await env.client.stop(env.name)
                except (TransientError, PermanentError) as exc:  # its runner leaves by itself later
                    log.warning("cannot stop environment %s: %s", env.client.framework(env.name), exc)
            elif beat:
                with contextlib.suppress(OSError):
                    os.utime(env.folder / "alive")
        if beat:
            self._heartbeat = now

    # ------------------------------------------------------------------ restarts

    def adopt(
        self, experiment_id: str, local: str, client: OpenpaiClient, gpus: int, trial_command: str, replica: str
    ) -> dict[Key, Environment]:
        """The environments a previous run of this replica kept for this experiment (not
        retired), and which trial each one holds."""
        held: dict[Key, Environment] = {}
        base = Path(local) / "trialbus" / "envs" / experiment_id
        for folder in sorted(base.iterdir()) if base.is_dir() else ():
            if (folder / "retired").exists() or not sharefs.owned_by(folder, replica):
                continue
            env = Environment(
                jobs.environment_name(experiment_id, folder.name), experiment_id, folder, client, gpus, trial_command
            )
            for ticket in sorted(p.name for p in (folder / "tickets").iterdir() if not p.name.startswith(".")):
                trial_id, _, attempt = ticket.split("-", 1)[1].rpartition("-")
                env.tickets[(trial_id, int(attempt))] = ticket
                env.busy.append((trial_id, int(attempt)))
                held[(trial_id, int(attempt))] = env
            self.environments[env.name] = env
        return held

    def describe(self, client: OpenpaiClient) -> tuple[int, int]:
        """(environments, busy ones) of this cluster and user."""
        mine = [e for e in self.environments.values() if e.client is client and e.live]
        return len(mine), sum(1 for e in mine if e.busy)


def _mark(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.touch()


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
