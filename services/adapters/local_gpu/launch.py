"""The local-gpu launch path: from a trial request to a keeper running in the trial's directory.

``launch`` is idempotent per trial and attempt: ``mkdir`` of
``<work_dir>/trials/<experiment>/<trial>-<attempt>/`` is the point where a launch happens
once — a directory that exists means the attempt was launched already (maybe before a
restart), and its handle is returned instead of a second run; one an earlier run began but
never started a keeper in is launched afresh. On the way: the code snapshot
(:class:`~.code.CodeCache`), the GPUs (:meth:`Launcher.place` sets ``CUDA_VISIBLE_DEVICES``;
``Waiting`` when they are taken now), and the warm template the trial may fork from
(:class:`~.keepers.KeeperSpawner`). ``None`` means no room now (``max_trials``). The attempt's
directory and its checkpoint directory are handed to the trial's user (its team's:
:class:`~.users.TrialUsers`), whose keeper it starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

from contracts import TrialRequest
from contracts.base import utcnow
from services.adapters import trialdir
from services.adapters.base import TrialHandle
from services.adapters.errors import PermanentError, TransientError, Waiting
from services.adapters.gpu.placement import GpuAsk
from services.adapters.gpu.scheduler import GpuScheduler
from services.adapters.local_gpu import client
from services.adapters.local_gpu.code import CodeCache
from services.adapters.local_gpu.keepers import KeeperSpawner
from services.adapters.local_gpu.settings import LocalGpuSettings
from services.adapters.local_gpu.table import TrialTable
from services.adapters.local_gpu.trial import GPUS_FILE, SAFE_ID, UNBORN_GRACE
from services.adapters.local_gpu.users import TrialUsers
from services.common import tokens

log = logging.getLogger(__name__)


class Launcher:
    """Launches trials into a :class:`~.table.TrialTable` (the module's docstring)."""

    def __init__(
        self,
        settings: LocalGpuSettings,
        *,
        table: TrialTable,
        code: CodeCache,
        keepers: KeeperSpawner,
        gpus: GpuScheduler,
        users: TrialUsers,
    ) -> None:
        self.settings, self.table, self.code, self.keepers, self.gpus = settings, table, code, keepers, gpus
        self.users = users

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = (request.trial_id, request.attempt)
        if (trial := self.table.get(key)) is not None:
            return trial.handle
        if not (SAFE_ID.match(request.experiment_id) and SAFE_ID.match(request.trial_id)):
            raise PermanentError(f"ids {request.experiment_id!r}/{request.trial_id!r} cannot name a trial directory")
        trials_dir = self.table.trials_dir
        trial_dir = trialdir.attempt_dir(trials_dir, request.experiment_id, request.trial_id, request.attempt)
        if self.table.full():
            return self._existing(trial_dir, request)
        code_dir = await self.code.dir(request.code_ref) if request.code_ref else None
        ask = self.gpus.ask(request)
        if ask is not None:
            assert self.gpus.bus is not None  # handed over at the adapter's start, before any launch
            await self.gpus.check_fits(ask, self.gpus.bus)
        user = await self.users.trial_user_for(request)
        self.keepers.prepare(user)
        await self.keepers.warm_wait(request, code_dir, user)
        # No await from here on: the checks and the spawn happen as one step of the event loop.
        if (trial := self.table.get(key)) is not None:
            return trial.handle
        if self.table.full():  # filled up during the download
            return self._existing(trial_dir, request)
        if os.path.isdir(trial_dir) and not self._unborn(trial_dir):  # launched before a restart: never twice
            return self.table.adopt_dir(trial_dir, *key, request.experiment_id).handle
        try:
            where, held, per_gpu = self.place(request, ask)
        except Waiting as exc:  # a replica that can place it now should have it (only GPUs make it wait)
            if ask is not None and (peer := self.gpus.room_elsewhere(ask)) is not None:
                raise TransientError(f"{exc}; offered to replica {peer}, which has idle GPUs", delay=0.2) from None
            raise
        try:
            os.mkdir(trial_dir)
        except FileNotFoundError:
            self.users.folder(os.path.dirname(trial_dir))
            os.mkdir(trial_dir)
        except FileExistsError:  # launched before (a redelivery after a restart): never twice
            return self.table.adopt_dir(trial_dir, *key, request.experiment_id).handle
        os.mkdir(f"{trial_dir}/.trialbus")
        if held:
            with open(f"{trial_dir}/{GPUS_FILE}", "w") as f:
                json.dump({"indices": list(held), "perGpu": per_gpu}, f)
        checkpoint_dir = checkpoint_of(str(self.settings.checkpoint_root), request.experiment_id, request.trial_id)
        if user.switch:  # (else the keeper makes it, as the trial's user)
            self.users.folder(os.path.dirname(checkpoint_dir))
            os.makedirs(checkpoint_dir, exist_ok=True)
            self.users.hand_over(checkpoint_dir, user)
        self.users.hand_over(f"{trial_dir}/{trialdir.META}", user)
        self.users.hand_over(trial_dir, user)
        env = self.keepers.env_for(user)
        env.update(
            TRIALBUS_TRIAL_DIR=trial_dir,
            TRIALBUS_TRIAL_COMMAND=request.trial_command,
            TRIALBUS_EXPERIMENT_ID=request.experiment_id,
            TRIALBUS_TRIAL_ID=request.trial_id,
            TRIALBUS_SEQUENCE_ID=str(request.sequence_id),
            TRIALBUS_ATTEMPT=str(request.attempt),
            TRIALBUS_CHECKPOINT_DIR=checkpoint_dir,
            TRIALBUS_PARAMETERS=request.parameter_record,
            TRIALBUS_TRIAL_TOKEN=request.token.get_secret_value(),
            TRIALBUS_ASK_TOKEN=tokens.ask_token(request.token.get_secret_value(), request.owner),
            TRIALBUS_ASK_OWNER=request.owner or "",
            **where,
        )
        if code_dir is not None:
            env["TRIALBUS_CODE_DIR"] = code_dir
        if request.heartbeat:
            env["TRIALBUS_HEARTBEAT"] = str(request.heartbeat)
        if request.grace_period is not None:
            env["TRIALBUS_KILL_GRACE"] = str(request.grace_period)
        pid, template = self.keepers.fork(env, request) or (None, None)
        try:
            if pid is None:
                pid = self.keepers.spawn(env, trial_dir, user)
        except OSError as exc:
            shutil.rmtree(trial_dir, ignore_errors=True)  # never launched: nothing to adopt later
            raise PermanentError(f"cannot start the trial keeper with {self.settings.keeper_python}: {exc}") from exc
        trial = self.table.track(request.experiment_id, *key, trial_dir, client.Keeper(pid), utcnow())
        trial.gpus, trial.per_gpu = held, per_gpu
        trial.template, trial.grace = template, request.grace_period
        return trial.handle

    def _unborn(self, trial_dir: str) -> bool:
        """Whether ``trial_dir`` is a launch an earlier run of this adapter began but died before
        it started the keeper (so the request was never acked, and here it is again): then the
        directory is removed, to launch afresh. A keeper spawned in the instant before that
        death may still be on its way: for :data:`UNBORN_GRACE` seconds the launch is retried
        later instead."""
        if client.keeper_born(trial_dir):
            return False
        age = time.time() - os.path.getmtime(trial_dir)
        if age < UNBORN_GRACE:
            raise TransientError(
                "an earlier launch of this trial may still be starting its keeper", delay=UNBORN_GRACE - age
            )
        log.info("%s: an earlier launch died before starting the trial keeper; launching it afresh", trial_dir)
        shutil.rmtree(trial_dir, ignore_errors=True)
        return True

    def _existing(self, trial_dir: str, request: TrialRequest) -> TrialHandle | None:
        """No room for a new trial: only an attempt launched before can be returned."""
        if not os.path.isdir(trial_dir) or not client.keeper_born(trial_dir):
            return None
        return self.table.adopt_dir(trial_dir, request.trial_id, request.attempt, request.experiment_id).handle

    def place(self, request: TrialRequest, ask: GpuAsk | None) -> tuple[dict[str, str], tuple[int, ...], int]:
        """Where the trial runs on this host: keeper environment, GPUs held, maxTrialNumberPerGpu.

        ``trialGpuNumber`` unset: nothing (the trial sees what the host has); ``0``: no GPU
        (``CUDA_VISIBLE_DEVICES=""``, as NNI v3); ≥ 1: GPUs from the scheduler, numbered as
        nvidia-smi does (``CUDA_DEVICE_ORDER=PCI_BUS_ID``). Raises Waiting with the reason
        when they are not free now. ``ask`` is ``self.gpus.ask(request)``.
        """
        if ask is None:
            return ({} if request.trial_gpu_number is None else {"TRIALBUS_GPUS": ""}), (), 1
        held = self.gpus.place(ask)
        return {"TRIALBUS_GPUS": ",".join(map(str, held)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, held, ask.per_gpu


def checkpoint_of(checkpoint_root: str, experiment_id: str, trial_id: str) -> str:
    """A trial's checkpoint directory, kept across its attempts (docs/retries.md)."""
    return f"{checkpoint_root}/{experiment_id}/{trial_id}"
