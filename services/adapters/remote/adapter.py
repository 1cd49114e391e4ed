"""The remote adapter: each trial is a trial keeper process group on one of the experiment's
SSH machines (NNI's ``platform: remote``).

Per machine there is one SSH connection and one agent on it (``client.py``, ``agent.py``).
A launch picks the machine with the most free room (``placement.py``), uploads the code
snapshot there once, and has the agent create the trial directory (the idempotency point)
and fork the keeper in its own session. The keeper runs detached: trials survive a dropped
connection and an adapter restart, and their state lives in the trial directory.

Status: the agent pushes a keeper's exit at once; every ``status_poll`` seconds the adapter
also reads every running trial's ``state.json`` in one request per machine. While a machine
is unreachable its trials are RUNNING with a message saying so (:class:`Stale`), until it is
back or ``unreachable_timeout`` passes (then FAILED, end unknown; killed if it comes back).

Checkpoints: each trial's checkpoint directory is copied to the object store while it runs
and once more at its end, and put on the machine of its next attempt before that starts
(``checkpoints.py``), so that a retry on another machine resumes from it.

Metrics go from the keeper to the gateway over HTTP. When a machine cannot reach the
gateway the keeper spools them; the adapter reads batches older than ``relay_after`` over
SSH, posts them to the gateway with the trial's token, and deletes them: nothing is lost,
and the gateway drops duplicates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from contracts import ExperimentState, ExperimentStatus, TrainingService, TrialRequest, TrialStatus, subjects
from contracts.base import utcnow
from contracts.experiment import RemoteConfig, RemoteMachineConfig
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, Stale, TransientError, Waiting
from services.adapters.keeper import Bundle, fetch_checked_code, outcome_of
from services.adapters.remote.checkpoints import CheckpointSync, TrialCheckpoint, checkpoint_dir
from services.adapters.remote.client import AGENT_FILES, AgentError, Machine, MachineDown, machine_key
from services.adapters.remote.placement import MachinePlacement
from services.adapters.remote.settings import RemoteSettings
from services.common import platforms
from services.common.bus import Bus
from services.trial_keeper import WARM_FILES

log = logging.getLogger(__name__)

#: Seconds a trial directory may wait for its keeper's first ``state.json`` (see local-gpu).
UNBORN_GRACE = 10.0
#: Seconds a machine's connection stays open with no trial on it and no experiment asking.
IDLE_CLOSE = 600.0


@dataclass(eq=False)
class Trial:
    handle: TrialHandle
    machine: Machine
    dir: str
    outcome: TrialOutcome | None = None
    status: dict = field(default_factory=dict)  # the agent's last word: state, alive, spool
    gpus: tuple[int, ...] = ()
    per_gpu: int = 1
    kill: asyncio.TimerHandle | None = field(default=None, repr=False)
    relaying: bool = False
    grace: float | None = None  # its seconds from SIGTERM to SIGKILL (None: the adapter's kill_grace)
    checkpoint: TrialCheckpoint | None = None  # its checkpoint directory's copies (checkpoints.py)

    @property
    def running(self) -> bool:
        return self.outcome is None

    @property
    def key(self) -> str:
        return subjects.dispatch_id(self.handle.trial_id, self.handle.attempt)


class RemoteAdapter(PlatformAdapter):
    name = "remote"

    def __init__(self, settings: RemoteSettings, keeper_path: Path | None = None, shim_path: Path | None = None):
        if keeper_path is None or shim_path is None:
            from services.trial_keeper import KEEPER_PATH, SHIM_PATH

            keeper_path, shim_path = keeper_path or KEEPER_PATH, shim_path or SHIM_PATH
        self.settings = settings
        self.bundle = Bundle(keeper_path, shim_path, {**AGENT_FILES, **WARM_FILES})
        self.machines: dict[str, Machine] = {}
        self.trials: dict[tuple[str, int], Trial] = {}
        self.placement = MachinePlacement(settings, self.name, self.trials.values, self.capacity_freed)
        self.abandoned: dict[str, set[str]] = {}  # machine → trial dirs given up on: kill when back
        self.unreported: dict[str, set[str]] = {}  # machine → trial dirs to mark reported when back
        self.wanted: dict[str, set[str]] = {}  # running experiment → the keys of its machines
        self._bus: Bus | None = None
        self._http: httpx.AsyncClient | None = None
        self._loops: list[asyncio.Task] = []
        self._archives: dict[str, asyncio.Task] = {}
        self.checkpoints = CheckpointSync(settings, self.notify)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._http = httpx.AsyncClient(timeout=10)
        self.checkpoints.start(bus)
        self._loops = [asyncio.create_task(self._status_loop()), asyncio.create_task(self._retention_loop()),
                       asyncio.create_task(platforms.watch_experiments(bus, self._on_experiment))]  # fmt: skip

    async def stop(self) -> None:
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await self.checkpoints.stop()
        await self.placement.stop()
        for trial in self.trials.values():
            if trial.kill is not None:
                trial.kill.cancel()
        await asyncio.gather(*(m.close() for m in self.machines.values()), return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    def machine(self, config: RemoteMachineConfig) -> Machine:
        """The pool's connection for a machine with these credentials (made on first use)."""
        key = machine_key(config)
        machine = self.machines.get(key)
        if machine is None:
            machine = self.machines[key] = Machine(config, self.settings, self.bundle, self._on_agent_event,
                                                   self._on_up)  # fmt: skip
            machine.start()
        machine.last_used = time.monotonic()
        return machine

    async def _prune(self) -> None:
        """Close the connections no trial and no experiment has needed for ``IDLE_CLOSE`` seconds."""
        busy = {t.machine.key for t in self.trials.values()} | set(self.abandoned) | set(self.unreported)
        busy |= self.placement.busy()
        idle = [m for m in self.machines.values()
                if m.key not in busy and time.monotonic() - m.last_used > IDLE_CLOSE]  # fmt: skip
        for machine in idle:
            del self.machines[machine.key]
            await self.placement.forget(machine)
            await machine.close()
            log.info("closed the idle connection to %s", machine.name)

    async def check(self, service: TrainingService) -> list[str]:
        """Connect to every machine (or reuse the connection) and find its ``python3``."""
        if not isinstance(service, RemoteConfig):
            return [f"the remote adapter cannot run platform {service.platform!r}"]
        machines = [self.machine(config) for config in service.machine_list]
        await asyncio.gather(*(m.ready(wait=0) for m in machines))
        problems = [m.down_reason() for m in machines if not m.up.is_set()]
        for machine in machines:
            if machine.up.is_set():
                try:
                    await self._probe(machine, machine.config.python_path)
                except (PermanentError, TransientError) as exc:
                    problems.append(str(exc))
        return problems

    # ------------------------------------------------------------------ launch

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (trial := self.trials.get(key)) is not None:
            return trial.handle
        service = request.training_service
        if not isinstance(service, RemoteConfig):
            raise PermanentError(f"the remote adapter cannot run platform {service.platform!r}")
        machines = [self.machine(config) for config in service.machine_list]
        await asyncio.gather(*(m.ready(wait=0) for m in machines))
        up = [m for m in machines if m.up.is_set()]
        if not up:
            self._give_up_if_all_down(machines)
            raise Waiting("no machine reachable: " + "; ".join(m.down_reason() for m in machines))
        machine, (where, held, per_gpu) = await self.placement.choose(request, up, machines)
        if (trial := self.trials.get(key)) is not None:  # launched concurrently meanwhile
            return trial.handle
        with self.placement.starting(machine, key, held, per_gpu):  # awaits below: its GPUs stay taken
            return await self._start(request, machine, where, held, per_gpu)

    async def _start(self, request: TrialRequest, machine: Machine, where: dict, held: tuple[int, ...],
                     per_gpu: int) -> TrialHandle:  # fmt: skip
        key = (request.trial_id, request.attempt)
        env, files = await self._environment(request, machine, where)
        trial_dir = f"{machine.root}/trials/{request.experiment_id}/{request.trial_id}-{request.attempt}"
        self.checkpoints.configure(request.experiment_id, request.training_service)
        restored = await self.checkpoints.restore(request, machine)  # before the keeper starts
        if held:
            files["gpus.json"] = json.dumps({"indices": list(held), "perGpu": per_gpu})
        try:
            result = await machine.call("launch", dir=trial_dir, env=env, files=files, warm=request.warm_start,
                                        preload=request.warm_preload)  # fmt: skip
        except AgentError as exc:
            raise PermanentError(f"cannot start the trial on {machine.name}: {exc}") from None
        if (trial := self.trials.get(key)) is not None:
            return trial.handle
        trial = self._track(request.experiment_id, request.trial_id, request.attempt, machine, trial_dir, utcnow())
        trial.grace = request.grace_period
        trial.checkpoint.synced = restored
        if result.get("exists"):  # launched before a restart: never twice
            await self._refresh(machine, [trial])
        else:
            trial.gpus, trial.per_gpu = held, per_gpu
        return trial.handle

    def _give_up_if_all_down(self, machines: list[Machine]) -> None:
        if all(m.permanent for m in machines):
            raise PermanentError("no machine can be used: " + "; ".join(m.down_reason() for m in machines))
        now, timeout = time.monotonic(), self.settings.unreachable_timeout
        if all(m.down_since is not None and now - m.down_since > timeout for m in machines):
            raise PermanentError(
                f"no machine reachable for {timeout:g}s: " + "; ".join(m.down_reason() for m in machines)
            )

    async def _environment(self, request: TrialRequest, machine: Machine, where: dict) -> tuple[dict, dict]:
        probe = await self._probe(machine, machine.config.python_path)
        env = {
            "PATH": probe["path"],
            "TRIALBUS_GATEWAY_URL": self.settings.trials_gateway,
            "TRIALBUS_KILL_GRACE": str(self.settings.kill_grace),
            "TRIALBUS_FLUSH_TIMEOUT": str(self.settings.flush_timeout),
            "TRIALBUS_NNI_PLATFORM": "remote",
            "TRIALBUS_TRIAL_COMMAND": request.trial_command,
            "TRIALBUS_EXPERIMENT_ID": request.experiment_id,
            "TRIALBUS_TRIAL_ID": request.trial_id,
            "TRIALBUS_SEQUENCE_ID": str(request.sequence_id),
            "TRIALBUS_ATTEMPT": str(request.attempt),
            # on this machine; copied through the object store to the next attempt's (checkpoints.py)
            "TRIALBUS_CHECKPOINT_DIR": checkpoint_dir(machine.root, request.experiment_id, request.trial_id),
            "TRIALBUS_PARAMETERS": request.parameter_record,
            "TRIALBUS_TRIAL_TOKEN": request.token.get_secret_value(),
            **where,
        }
        if self.settings.nni_shim != "never":  # it serves the trial API, an installed nni the rest
            env["TRIALBUS_PYTHONPATH_PREPEND"] = f"{machine.root}/bin/{self.bundle.hash}/nni_shim"
        if request.heartbeat:
            env["TRIALBUS_HEARTBEAT"] = str(request.heartbeat)
        if request.grace_period is not None:
            env["TRIALBUS_KILL_GRACE"] = str(request.grace_period)
        if request.code_ref:
            env["TRIALBUS_CODE_DIR"] = await machine.code_dir(request.code_ref.removeprefix("sha256:"),
                                                              lambda: self._archive(request.code_ref))  # fmt: skip
        return env, {"token": request.token.get_secret_value()}

    async def _probe(self, machine: Machine, python_path: str | None) -> dict:
        probe = machine.probes.get(python_path)
        if probe is None:
            probe = await machine.call("probe", pythonPath=python_path, timeout=90)
            if not probe.get("python"):
                where = f"with pythonPath {python_path}" if python_path else "on its PATH (set pythonPath)"
                raise PermanentError(f"machine {machine.name} has no python3 {where}")
            found = probe.get("where") or ""
            if python_path and not found.startswith(python_path.rstrip("/") + "/"):
                raise PermanentError(
                    f"machine {machine.name} has no python3 in pythonPath {python_path} (trials would run {found})"
                )
            machine.probes[python_path] = probe
        return probe

    async def _archive(self, code_ref: str) -> bytes:
        """A code snapshot from the object store, fetched once however many machines need it."""
        task = self._archives.get(code_ref)
        if task is None or (task.done() and task.exception() is not None):
            digest = code_ref.removeprefix("sha256:")
            task = self._archives[code_ref] = asyncio.create_task(fetch_checked_code(self._bus, digest))
        return await asyncio.shield(task)

    # ------------------------------------------------------------------ watching

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        trial = self._find(handle)
        if trial.outcome is not None:
            return trial.outcome
        machine = trial.machine
        if not machine.up.is_set():
            down_for = time.monotonic() - (machine.down_since or time.monotonic())
            if down_for > self.settings.unreachable_timeout:
                self.abandoned.setdefault(machine.key, set()).add(trial.dir)
                why = f"{machine.down_reason()}; gave up after {self.settings.unreachable_timeout:g}s"
                trial.outcome = TrialOutcome(TrialStatus.FAILED, None, why + ": the trial's real end is unknown",
                                             "infrastructure")  # fmt: skip
                return trial.outcome
            raise Stale(f"{machine.down_reason()}; status and metrics resume when it is back", delay=1.0)
        status = trial.status
        if not status:
            return None  # not read yet
        state, alive = status.get("state") or {}, status.get("alive")
        if alive:
            return None
        if status.get("spool"):  # the keeper is gone with metrics undelivered: relay them first
            if trial.relaying:
                return None
            await self._relay(trial, min_age=0.0)
        if not status.get("exists", True):
            why = f"trial directory {trial.dir} is gone from {machine.name}"
            outcome = TrialOutcome(TrialStatus.FAILED, None, why, "infrastructure")
        elif not state:
            if time.time() - trial.handle.start_time.timestamp() < UNBORN_GRACE:
                return None
            outcome = outcome_of({}, None, None)
        else:
            if not state.get("done") and "exitCode" not in state and state.get("keeperPid"):
                await machine.call("signal", dir=trial.dir, signal=signal.SIGKILL, group=True)  # no orphans
            outcome = outcome_of(state, state.get("keeperExit"))
        if self.checkpoints.finishing(trial.checkpoint):  # its last copy first: the next attempt may need it
            return None
        trial.outcome = outcome
        return outcome

    async def cancel(self, handle: TrialHandle) -> None:
        trial = self._find(handle)
        if not trial.running:
            return
        result = await trial.machine.call("signal", dir=trial.dir, signal=signal.SIGTERM)
        if not result.get("sent") and not (trial.status.get("state") or {}).get("keeperPid"):
            raise TransientError("the trial keeper has not started yet", delay=0.2)
        if trial.kill is None:
            loop = asyncio.get_running_loop()
            grace = self.settings.kill_grace if trial.grace is None else trial.grace
            trial.kill = loop.call_later(grace + 1.0, self._force_stop, trial)

    def _force_stop(self, trial: Trial) -> None:
        if trial.running and trial.machine.up.is_set():
            log.warning("trial %s still running after cancel: SIGKILL", trial.handle.trial_id)
            asyncio.ensure_future(trial.machine.call("signal", dir=trial.dir, signal=signal.SIGKILL, group=True))

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.status_poll)
            by_machine: dict[str, list[Trial]] = {}
            for trial in self.trials.values():
                if trial.running and trial.machine.up.is_set():
                    by_machine.setdefault(trial.machine.key, []).append(trial)
            results = await asyncio.gather(
                *(self._refresh(self.machines[name], trials) for name, trials in by_machine.items()),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, MachineDown):
                    log.warning("cannot read trial status: %s", result)
            await self._prune()

    async def _refresh(self, machine: Machine, trials: list[Trial]) -> None:
        """Read the trials' status in one request (with the signatures of the checkpoint directories
        due a look); wake the ended ones; relay stuck metrics; copy changed checkpoints."""
        looks = {t.dir: t.checkpoint.directory for t in trials if self.checkpoints.due(t.checkpoint)}
        found = await machine.call("status", dirs=[t.dir for t in trials], checkpoints=looks)
        for trial in trials:
            status = found.get(trial.dir)
            if status is None:
                continue
            trial.status = status
            if "checkpoint" in status:
                self.checkpoints.seen(trial.checkpoint, status["checkpoint"])
            if not status["alive"]:
                self.notify(trial.handle)
            stuck = [name for name, age in status["spool"] if age >= self.settings.relay_after]
            if stuck and not trial.relaying:
                asyncio.ensure_future(self._relay(trial))

    async def _relay(self, trial: Trial, min_age: float | None = None) -> None:
        """Post a keeper's undelivered batches to the gateway ourselves, in order, then delete
        them (one relay per trial at a time)."""
        if trial.relaying:
            return
        trial.relaying = True
        try:
            age = self.settings.relay_after if min_age is None else min_age
            found = await trial.machine.call("spool", dir=trial.dir, minAge=age)
            url = f"{self.settings.gateway_url.rstrip('/')}/api/v1/trials/{trial.handle.trial_id}/metrics"
            for name, records in found["files"]:
                body = {"experimentId": trial.handle.experiment_id, "records": records}
                headers = {"Authorization": f"Bearer {found['token']}",
                           "X-Trialbus-Keeper-Version": trial.machine.keeper_version}  # fmt: skip
                reply = await self._http.post(url, json=body, headers=headers)
                if reply.status_code != 200:
                    log.warning("the gateway refused relayed metrics of %s (%d): %s", trial.handle.trial_id,
                                reply.status_code, reply.text[:300])  # fmt: skip
                    return
                await trial.machine.call("unspool", dir=trial.dir, names=[name])
                log.info("relayed %d metric records of %s from %s over SSH", len(records), trial.handle.trial_id,
                         trial.machine.name)  # fmt: skip
        except (MachineDown, AgentError, httpx.HTTPError) as exc:
            log.warning("cannot relay metrics of %s now: %s", trial.handle.trial_id, exc)
        finally:
            trial.relaying = False

    def _on_agent_event(self, machine: Machine, message: dict) -> None:
        if message.get("event") != "exit":
            return
        trials = [t for t in self.trials.values() if t.dir == message.get("dir") and t.machine is machine]
        if trials:
            asyncio.ensure_future(self._refresh_quietly(machine, trials))

    async def _refresh_quietly(self, machine: Machine, trials: list[Trial]) -> None:
        try:
            await self._refresh(machine, trials)
        except (MachineDown, AgentError) as exc:
            log.warning("cannot read the status of an ended trial now: %s", exc)

    def _on_up(self, machine: Machine) -> None:
        """A machine is (back) up: settle what waited for it, look for trials, wake waiters."""
        asyncio.ensure_future(self._reconnected(machine))

    async def _reconnected(self, machine: Machine) -> None:
        try:
            for trial_dir in self.abandoned.pop(machine.key, set()):
                await machine.call("signal", dir=trial_dir, signal=signal.SIGKILL, group=True)
                await machine.call("report", dir=trial_dir)
            for trial_dir in self.unreported.pop(machine.key, set()):
                await machine.call("report", dir=trial_dir)
            found = await machine.call("list")
            for entry in found:
                key = (entry["trial"], entry["attempt"])
                if key not in self.trials:
                    trial = self._adopt_entry(machine, entry)
                    self.found(trial.handle)
            ours = [t for t in self.trials.values() if t.machine is machine and t.running]
            if ours:
                await self._refresh(machine, ours)
            if (scheduler := self.placement.gpus.get(machine.key)) is not None:
                await scheduler.read()
        except (MachineDown, AgentError) as exc:
            log.warning("cannot settle %s after reconnecting: %s", machine.name, exc)
        self.capacity_freed()
        self.notify()

    # ------------------------------------------------------------------ restarts

    async def adopt(self) -> list[TrialHandle]:
        """Trials on the machines of the experiments on the bus that this adapter left running."""
        for state in await platforms.experiments(self._bus):
            if isinstance(service := state.config.service_for(self.name), RemoteConfig):
                for config in service.machine_list:
                    self.machine(config)
        await asyncio.gather(*(m.ready(wait=0) for m in self.machines.values()))
        handles = []
        for machine in self.machines.values():
            if not machine.up.is_set():
                log.warning("cannot adopt trials on %s now (%s); will when it is back", machine.name, machine.error)
                continue
            for entry in await machine.call("list"):
                key = (entry["trial"], entry["attempt"])
                if key not in self.trials:
                    handles.append(self._adopt_entry(machine, entry).handle)
        return handles

    def _adopt_entry(self, machine: Machine, entry: dict) -> Trial:
        state = entry.get("state") or {}
        started = datetime.fromtimestamp(state.get("startTime") or entry["mtime"], UTC)
        trial = self._track(entry["experiment"], entry["trial"], entry["attempt"], machine, entry["dir"], started)
        trial.status = {"state": state, "alive": True, "spool": []}  # until the next read says otherwise
        if gpus := entry.get("gpus"):
            trial.gpus, trial.per_gpu = tuple(gpus["indices"]), int(gpus["perGpu"])
        return trial

    async def release(self, handle: TrialHandle) -> None:
        trial = self.trials.pop((handle.trial_id, handle.attempt), None)
        if trial is None:
            return
        if trial.kill is not None:
            trial.kill.cancel()
        try:
            await trial.machine.call("report", dir=trial.dir)
        except MachineDown:
            self.unreported.setdefault(trial.machine.key, set()).add(trial.dir)

    async def past(self, experiment_id: str, trial_id: str) -> TrialHandle | None:
        """The newest attempt of a finished trial whose directory a connected machine keeps."""
        for machine in list(self.machines.values()):
            if not machine.up.is_set():
                continue
            try:
                found = await machine.call("find", experiment=experiment_id, trial=trial_id)
            except (MachineDown, AgentError):
                continue
            if found:
                ref = f"{machine.key}#{found['dir']}"
                return TrialHandle(experiment_id, trial_id, found["attempt"], ref=ref)
        return None

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        trial = self.trials.get((handle.trial_id, handle.attempt))
        machine = trial.machine if trial else self._machine_of(handle.ref)
        if machine is None:
            return ""
        found = await machine.call("tail", dir=handle.ref.split("#", 1)[1], max=max_bytes)
        return "\n".join(f"==> {name} <==\n{text}" for name, text in found.items())

    async def _retention_loop(self) -> None:
        retention = self.settings.trial_retention
        while retention:
            await asyncio.sleep(min(3600.0, max(1.0, retention / 4)))
            for machine in list(self.machines.values()):
                try:
                    found = await machine.call("clean", retention=retention, timeout=300)
                    if found["removed"]:
                        log.info("removed %d finished trial directories on %s", found["removed"], machine.name)
                except (MachineDown, AgentError):
                    continue

    # ------------------------------------------------------------------ bookkeeping

    def _on_experiment(self, state: ExperimentState) -> None:
        service = state.config.service_for(self.name)
        if isinstance(service, RemoteConfig):
            self.checkpoints.configure(state.id, service)
        if state.status == ExperimentStatus.RUNNING and isinstance(service, RemoteConfig):
            self.wanted[state.id] = {machine_key(m) for m in service.machine_list}
        else:
            self.wanted.pop(state.id, None)

    def describe(self) -> dict:
        """The machines running experiments use, and those holding trials here: a machine of
        finished experiments only (kept open a while, or waiting to clean up) is not shown."""
        shown = set().union(*self.wanted.values(), (t.machine.key for t in self.trials.values()))
        machines = []
        for machine in self.machines.values():
            if machine.key not in shown:
                continue
            machines.append({
                "name": machine.name, "up": machine.up.is_set(), "error": machine.error, "cpus": machine.cpus,
                "running": self.placement.running(machine), "gpus": self.placement.describe(machine),
            })  # fmt: skip
        return {"machines": machines}

    def _track(self, experiment_id, trial_id, attempt, machine: Machine, trial_dir: str, started) -> Trial:
        handle = TrialHandle(experiment_id, trial_id, attempt, ref=f"{machine.key}#{trial_dir}", start_time=started)
        trial = self.trials[(trial_id, attempt)] = Trial(handle, machine, trial_dir)
        trial.checkpoint = self.checkpoints.track(handle, machine)
        return trial

    def _find(self, handle: TrialHandle) -> Trial:
        trial = self.trials.get((handle.trial_id, handle.attempt))
        if trial is None:
            raise PermanentError(f"trial {handle.trial_id} attempt {handle.attempt} is not known to this replica")
        return trial

    def _machine_of(self, ref: str) -> Machine | None:
        return self.machines.get(ref.split("#", 1)[0]) if "#" in ref else None
