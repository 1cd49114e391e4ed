"""Launching a trial on an SSH machine: pick the machine, prepare the trial's environment and
files, and have the agent create the trial directory and fork the keeper there.

The trial directory is the idempotency point: a launch of an attempt that a machine already
has (before an adapter restart, or concurrently) returns that attempt, never a second one. The
machine's ``python3`` is probed once per ``pythonPath``, the code snapshot fetched from the object
store once however many machines need it and uploaded once per machine, and the checkpoint of a
previous attempt put in place before the keeper starts (``checkpoints.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from contracts import TrialRequest
from contracts.base import utcnow
from contracts.experiment import RemoteConfig
from services.adapters import trialdir
from services.adapters.base import TrialHandle
from services.adapters.errors import PermanentError, Waiting
from services.adapters.keeper import Bundle, fetch_checked_code
from services.adapters.remote.checkpoints import CheckpointSync, checkpoint_dir
from services.adapters.remote.client import AgentError, Machine
from services.adapters.remote.placement import MachinePlacement
from services.adapters.remote.pool import MachinePool
from services.adapters.remote.settings import RemoteSettings
from services.adapters.remote.trial import Trial, TrialTable
from services.common import tokens
from services.common.bus import Bus


class Launcher:
    """How the remote adapter launches a trial (the module's docstring)."""

    def __init__(
        self,
        *,
        settings: RemoteSettings,
        bundle: Bundle,
        pool: MachinePool,
        placement: MachinePlacement,
        trials: TrialTable,
        checkpoints: CheckpointSync,
        refresh: Callable[[Machine, list[Trial]], Awaitable[None]],
    ) -> None:
        """``refresh``: read trials' status now (for an attempt that a machine already had)."""
        self.settings, self.bundle = settings, bundle
        self._pool, self._placement, self._trials, self._checkpoints = pool, placement, trials, checkpoints
        self._refresh = refresh
        self._bus: Bus | None = None  # for the code snapshots, from start
        self._archives: dict[str, asyncio.Task[bytes]] = {}  # code_ref → its fetch from the object store

    def start(self, bus: Bus) -> None:
        self._bus = bus

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (trial := self._trials.get(key)) is not None:
            return trial.handle
        service = request.training_service
        if not isinstance(service, RemoteConfig):
            raise PermanentError(f"the remote adapter cannot run platform {service.platform!r}")
        machines = await self._pool.connect(service.machine_list)
        up = [m for m in machines if m.up.is_set()]
        if not up:
            self._pool.give_up_if_all_down(machines)
            raise Waiting("no machine reachable: " + "; ".join(m.down_reason() for m in machines))
        machine, (where, held, per_gpu) = await self._placement.choose(request, up, machines)
        if (trial := self._trials.get(key)) is not None:  # launched concurrently meanwhile
            return trial.handle
        with self._placement.starting(machine, key, held, per_gpu):  # awaits below: its GPUs stay taken
            return await self._start(request, service, machine, where, held, per_gpu)

    async def _start(
        self,
        request: TrialRequest,
        service: RemoteConfig,
        machine: Machine,
        where: dict,
        held: tuple[int, ...],
        per_gpu: int,
    ) -> TrialHandle:
        key = (request.trial_id, request.attempt)
        env, files = await self._environment(request, machine, where)
        trials_dir = f"{machine.root}/trials"
        trial_dir = trialdir.attempt_dir(trials_dir, request.experiment_id, request.trial_id, request.attempt)
        self._checkpoints.configure(request.experiment_id, service)
        restored = await self._checkpoints.restore(request, machine)  # before the keeper starts
        if held:
            files["gpus.json"] = json.dumps({"indices": list(held), "perGpu": per_gpu})
        try:
            result = await machine.call(
                "launch", dir=trial_dir, env=env, files=files, warm=request.warm_start, preload=request.warm_preload
            )
        except AgentError as exc:
            raise PermanentError(f"cannot start the trial on {machine.name}: {exc}") from None
        if (trial := self._trials.get(key)) is not None:
            return trial.handle
        trial = self._trials.track(
            request.experiment_id, request.trial_id, request.attempt, machine, trial_dir, utcnow()
        )
        trial.grace = request.grace_period
        trial.checkpoint.synced = restored
        if result.get("exists"):  # launched before a restart: never twice
            await self._refresh(machine, [trial])
        else:
            trial.gpus, trial.per_gpu = held, per_gpu
        return trial.handle

    async def _environment(self, request: TrialRequest, machine: Machine, where: dict) -> tuple[dict, dict]:
        probe = await self._pool.probe(machine, machine.config.python_path)
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
            # the trial's own credential to ask its study (docs/optuna.md), never the keeper's token
            "TRIALBUS_ASK_TOKEN": tokens.ask_token(request.token.get_secret_value(), request.owner),
            "TRIALBUS_ASK_OWNER": request.owner or "",
            **where,
        }
        if self.settings.nni_shim != "never":  # it serves the trial API, an installed nni the rest
            env["TRIALBUS_PYTHONPATH_PREPEND"] = f"{machine.root}/bin/{self.bundle.hash}/nni_shim"
        if request.heartbeat:
            env["TRIALBUS_HEARTBEAT"] = str(request.heartbeat)
        if request.grace_period is not None:
            env["TRIALBUS_KILL_GRACE"] = str(request.grace_period)
        if code_ref := request.code_ref:
            env["TRIALBUS_CODE_DIR"] = await machine.files.code_dir(
                code_ref.removeprefix("sha256:"), lambda: self._archive(code_ref)
            )
        return env, {"token": request.token.get_secret_value()}

    async def _archive(self, code_ref: str) -> bytes:
        """A code snapshot from the object store, fetched once however many machines need it."""
        task = self._archives.get(code_ref)
        if task is None or (task.done() and task.exception() is not None):
            digest = code_ref.removeprefix("sha256:")
            assert self._bus is not None  # started before any launch
            task = self._archives[code_ref] = asyncio.create_task(fetch_checked_code(self._bus, digest))
        return await asyncio.shield(task)
