"""Checkpoints that follow a remote trial to another machine.

Every trial has a checkpoint directory that survives its attempts (docs/retries.md). On the
remote platform it is ``<root>/checkpoints/<experiment>/<trial>`` on the machine that runs the
attempt, so a retry that lands on another machine would start without it. :class:`CheckpointSync`
keeps a copy of it in the ``checkpoints`` object store (``contracts.streams.CHECKPOINT_STORE``):
one object per trial, ``<experiment>/<trial>``, the tar.gz the machine's agent packs
(``agent_checkpoints.py``), with the attempt that saved it and its machine in its headers.
Everything travels over the adapter's SSH connection to the machine; the keeper and the trial
know nothing of it. Guarantees:

- While an attempt runs, its directory's signature (newest mtime, bytes, files) comes with the
  status read of its machine every ``interval`` seconds (``checkpointSync.interval``, else the
  adapter's ``TRIALBUS_CHECKPOINT_SYNC_INTERVAL``); when it changed, the agent packs the
  directory and the adapter copies the archive into the store. One copy per trial at a time, and
  at most ``TRIALBUS_CHECKPOINT_TRANSFERS`` in all (each passes through a file in ``data_dir``).
- When an attempt has ended, its end is reported only after one last copy (if the directory
  changed and its machine is reachable): the next attempt, dispatched only once the end is
  reported, finds the newest copy.
- Before the keeper of an attempt > 0 starts, the copy is unpacked into the directory on the
  chosen machine, checked as untrusted input (no links, nothing outside the directory, size
  caps), unless the newest attempt that ran on that machine is at least as new as the attempt
  that saved the copy and left files there (then what it left is as new, or newer).
- A directory over ``checkpointSync.maxSize`` is not copied: one WARNING per attempt says so.
- A copy that fails is logged and tried again at the next look. A restore the store cannot
  answer now fails the launch as transient (it is retried); a copy that cannot be read, or that
  the agent refuses, is logged, and the attempt starts without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
from nats.js.api import ObjectMeta
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from contracts import TrialRequest
from contracts.experiment import RemoteConfig
from services.adapters.base import TrialHandle
from services.adapters.errors import TransientError
from services.adapters.remote.agent_checkpoints import MAX_FILES
from services.adapters.remote.client import AgentError, Machine
from services.adapters.remote.settings import RemoteSettings
from services.common import logs
from services.common.bus import NO_ANSWER, Bus
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Headers of a copy: the attempt that saved it, and its machine.
ATTEMPT, ORIGIN = "Trialbus-Attempt", "Trialbus-Machine"
#: Seconds the agent may take to pack or unpack a directory (a large one, on a busy disk).
PACKING_TIMEOUT = 900.0
#: Fields of a signature (``agent_checkpoints.scan``).
BYTES, FILES = 1, 2
_MiB = 1024 * 1024
_STORE_ERRORS = (nats.errors.Error, OSError)
#: The store cannot answer now (asked again later); any other error is about the copy itself.
_NO_ANSWER = (*NO_ANSWER, nats.errors.ConnectionClosedError, OSError)


@dataclass(frozen=True)
class Options:
    """An experiment's ``checkpointSync`` in the adapter's units."""

    max_bytes: int
    interval: float


def checkpoint_dir(root: str, experiment_id: str, trial_id: str) -> str:
    """A trial's checkpoint directory on a machine whose Trialbus folder is ``root``."""
    return f"{root}/checkpoints/{experiment_id}/{trial_id}"


def object_name(experiment_id: str, trial_id: str) -> str:
    return f"{experiment_id}/{trial_id}"


@dataclass(eq=False)
class TrialCheckpoint:
    """The checkpoint directory of one attempt, as the sync follows it."""

    handle: TrialHandle
    machine: Machine
    directory: str
    #: The signature of what the store holds from this attempt (None: nothing copied yet).
    synced: list | None = None
    next_look: float = 0.0
    warned: bool = False
    #: The last copy after the attempt's end is done (or not needed, or given up).
    final: bool = False
    task: asyncio.Task | None = field(default=None, repr=False)


class CheckpointSync:
    """Copies of the remote trials' checkpoint directories in the object store (module docstring)."""

    def __init__(self, settings: RemoteSettings, notify: Callable[[TrialHandle], None]) -> None:
        self.settings = settings
        self.notify = notify  # a trial's poll is due: its last copy is done
        self.experiments: dict[str, Options | None] = {}  # None: checkpointSync is off
        self.scratch = settings.data_dir / "remote" / settings.replica / "checkpoints"
        self._bus: Bus | None = None
        self._store: ObjectStore | None = None
        self._slots = asyncio.Semaphore(settings.checkpoint_transfers)
        self._tasks: set[asyncio.Task] = set()

    def start(self, bus: Bus) -> None:
        self._bus = bus
        shutil.rmtree(self.scratch, ignore_errors=True)  # archives a killed adapter left
        self.scratch.mkdir(parents=True, exist_ok=True)

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)

    def configure(self, experiment_id: str, service: RemoteConfig) -> None:
        """Learn an experiment's ``checkpointSync`` (from a trial request or the experiment's state)."""
        sync = service.checkpoints
        interval = (sync.interval if sync else None) or self.settings.checkpoint_sync_interval
        self.experiments[experiment_id] = Options(sync.max_size * _MiB, interval) if sync else None

    def track(self, handle: TrialHandle, machine: Machine) -> TrialCheckpoint:
        """Follow an attempt's directory: first looked at ``interval`` seconds after this."""
        directory = checkpoint_dir(machine.root, handle.experiment_id, handle.trial_id)
        options = self.experiments.get(handle.experiment_id)
        first = time.monotonic() + (options.interval if options else 0.0)
        return TrialCheckpoint(handle, machine, directory, next_look=first)

    def _options(self, checkpoint: TrialCheckpoint) -> Options | None:
        """None when checkpoints are not copied for its experiment, or it is not known yet (an
        adopted trial whose experiment's state has not arrived)."""
        return self.experiments.get(checkpoint.handle.experiment_id)

    # ------------------------------------------------------------------ while it runs

    def due(self, checkpoint: TrialCheckpoint) -> bool:
        """Whether the status read made now should bring the directory's signature."""
        options, now = self._options(checkpoint), time.monotonic()
        if options is None or checkpoint.task is not None or checkpoint.final or now < checkpoint.next_look:
            return False
        checkpoint.next_look = now + options.interval
        return True

    def seen(self, checkpoint: TrialCheckpoint, signature: list | None) -> None:
        """The signature a status read brought: copy the directory if it changed."""
        options = self._options(checkpoint)
        if options is None or checkpoint.task is not None or checkpoint.final or signature == checkpoint.synced:
            return
        if (signature is None or signature[FILES] == 0) and checkpoint.synced is None:
            return  # nothing there, nothing copied
        if signature is not None and signature[BYTES] > options.max_bytes:
            self._over(checkpoint, signature, options)
            return
        self._spawn(checkpoint, options, final=False)

    # ------------------------------------------------------------------ at its end

    def finishing(self, checkpoint: TrialCheckpoint) -> bool:
        """The attempt has ended: True while its last copy is under way (started here, once);
        the adapter is notified when it is done."""
        if checkpoint.final:
            return False
        if checkpoint.task is None:
            if (options := self._options(checkpoint)) is None:
                checkpoint.final = True
                return False
            self._spawn(checkpoint, options, final=True)
        return True

    def _spawn(self, checkpoint: TrialCheckpoint, options: Options, final: bool) -> None:
        task = checkpoint.task = asyncio.create_task(self._copy(checkpoint, options))
        self._tasks.add(task)

        def done(task: asyncio.Task) -> None:
            self._tasks.discard(task)
            checkpoint.task = None
            checkpoint.final = checkpoint.final or final
            self.notify(checkpoint.handle)  # the attempt may have ended meanwhile: its last copy is due

        task.add_done_callback(done)

    async def _copy(self, checkpoint: TrialCheckpoint, options: Options) -> None:
        """Pack the directory on its machine and put it in the store, unless unchanged or too big."""
        handle, machine = checkpoint.handle, checkpoint.machine
        name = object_name(handle.experiment_id, handle.trial_id)
        with logs.bind(experiment=handle.experiment_id, trial=handle.trial_id):
            try:
                async with self._slots:
                    archive = machine.files.scratch("checkpoint")
                    packed = await machine.call(
                        "checkpoint_pack",
                        dir=checkpoint.directory,
                        archive=archive,
                        maxBytes=options.max_bytes,
                        since=checkpoint.synced,
                        timeout=PACKING_TIMEOUT,
                    )
                    signature = packed["signature"]
                    if packed.get("over"):
                        self._over(checkpoint, signature, options)
                    elif packed.get("empty"):  # emptied by the trial: so is its copy
                        if checkpoint.synced is not None:
                            with contextlib.suppress(NotFoundError):
                                await (await self._checkpoints()).delete(name)
                            checkpoint.synced = None
                    elif not packed.get("unchanged"):
                        await self._put(checkpoint, name, archive)
                        checkpoint.synced = signature
                        log.info(
                            "saved the checkpoint of trial %s (attempt %d) from %s in the object store: "
                            "%d files, %d bytes packed",
                            handle.trial_id,
                            handle.attempt,
                            machine.name,
                            signature[FILES],
                            packed["size"],
                        )
            except (TransientError, *_STORE_ERRORS) as exc:  # AgentError, MachineDown among them
                log.warning(
                    "cannot save the checkpoint of trial %s from %s now: %s",
                    handle.trial_id,
                    machine.name,
                    exc or type(exc).__name__,
                )
            except Exception:  # a bug: said, and the next change is copied again
                log.exception("cannot save the checkpoint of trial %s from %s", handle.trial_id, machine.name)

    async def _put(self, checkpoint: TrialCheckpoint, name: str, archive: str) -> None:
        handle, machine = checkpoint.handle, checkpoint.machine
        local = self.scratch / f"{handle.trial_id}-{secrets.token_hex(4)}.tar.gz"
        try:
            await machine.files.download(archive, local)
            headers = {ATTEMPT: [str(handle.attempt)], ORIGIN: [machine.name]}
            store = await self._checkpoints()
            with local.open("rb") as data:
                await store.put(name, data, meta=ObjectMeta(name=name, headers=headers))
        finally:
            local.unlink(missing_ok=True)

    def _over(self, checkpoint: TrialCheckpoint, signature: list, options: Options) -> None:
        if not checkpoint.warned:
            checkpoint.warned = True
            handle = checkpoint.handle
            with logs.bind(experiment=handle.experiment_id, trial=handle.trial_id):
                log.warning(
                    "the checkpoint directory of trial %s on %s holds %.1f MiB in %d files, over "
                    "checkpointSync.maxSize (%d MiB) or %d files: it is not copied to the object store, and a "
                    "retry on another machine starts without it",
                    handle.trial_id,
                    checkpoint.machine.name,
                    signature[BYTES] / _MiB,
                    signature[FILES],
                    options.max_bytes // _MiB,
                    MAX_FILES,
                )

    # ------------------------------------------------------------------ before a retry starts

    async def restore(self, request: TrialRequest, machine: Machine) -> list | None:
        """Put the trial's copy into its checkpoint directory on ``machine`` before the keeper of
        attempt ``request.attempt`` > 0 starts there (module docstring says when not). Returns the
        directory's signature after a restore (what the store holds), else None."""
        options = self.experiments.get(request.experiment_id)
        if options is None or request.attempt == 0:
            return None
        name = object_name(request.experiment_id, request.trial_id)
        directory = checkpoint_dir(machine.root, request.experiment_id, request.trial_id)
        try:
            store = await self._checkpoints()
            info = await store.get_info(name)
        except NotFoundError:
            return None
        except _STORE_ERRORS as exc:
            self._unreadable(request, machine, exc)
            return None
        here = await machine.call(
            "checkpoint_scan", dir=directory, experiment=request.experiment_id, trial=request.trial_id
        )
        signature, ran_here = here["signature"], here["attempt"]
        saved_by = int(((info.headers or {}).get(ATTEMPT) or ["-1"])[0])
        if ran_here is not None and ran_here >= request.attempt:
            return None  # launched here before (an adapter restart): the directory is its own
        if ran_here is not None and ran_here >= saved_by and signature and signature[FILES]:
            return None  # what the last attempt here left is as new as the copy, or newer
        local = self.scratch / f"{request.trial_id}-{secrets.token_hex(4)}.tar.gz"
        remote = machine.files.scratch("restore")
        try:
            async with self._slots:
                try:
                    with local.open("wb") as out:
                        await store.get(name, writeinto=out)
                except NotFoundError:
                    return None  # expired or deleted meanwhile
                except _STORE_ERRORS as exc:
                    self._unreadable(request, machine, exc)
                    return None
                await machine.files.upload(local, remote)
                found = await machine.call(
                    "checkpoint_unpack",
                    dir=directory,
                    archive=remote,
                    maxBytes=options.max_bytes,
                    timeout=PACKING_TIMEOUT,
                )
        except AgentError as exc:  # an archive refused, a full disk: the attempt can run all the same
            self._unreadable(request, machine, exc)
            return None
        finally:
            local.unlink(missing_ok=True)
        origin = ((info.headers or {}).get(ORIGIN) or ["?"])[0]
        log.info(
            "restored the checkpoint of trial %s, saved by attempt %d on %s, on %s for attempt %d",
            request.trial_id,
            saved_by,
            origin,
            machine.name,
            request.attempt,
        )
        return found["signature"]

    def _unreadable(self, request: TrialRequest, machine: Machine, exc: Exception) -> None:
        """A copy that cannot be restored: asked again later when the store does not answer now
        (TransientError), else said, and the attempt starts without it."""
        if isinstance(exc, _NO_ANSWER):
            raise TransientError(f"cannot read the checkpoint of trial {request.trial_id}: {exc}", delay=2.0) from exc
        log.warning(
            "cannot restore the checkpoint of trial %s on %s (%s): attempt %d starts without it",
            request.trial_id,
            machine.name,
            exc or type(exc).__name__,
            request.attempt,
        )

    async def _checkpoints(self) -> ObjectStore:
        if self._store is None:
            assert self._bus is not None  # started before any trial is launched or tracked
            try:
                self._store = await self._bus.checkpoint_store()
            except _STORE_ERRORS as exc:
                raise TransientError(f"cannot open the checkpoint store: {exc}", delay=2.0) from None
        return self._store
