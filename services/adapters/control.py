"""The control requests every adapter replica answers on ``control.<adapter>.*``, written once.

- ``cancel``: only the replica owning the trial (or that attempt, or that replica's copy) acts
  and answers; a cancel that comes while the trial launches takes effect once it is launched.
- ``drain``: the named replica stops taking trials and preempts those it runs (also done by
  itself on a spot notice: ``services.adapters.spot``).
- ``log``: the owner (or a replica that keeps a past attempt's files) answers the log's tail.
- ``check``: one replica (a queue group) says whether the platform can run an experiment.

:class:`ControlRequests` is a part of :class:`~services.adapters.service.AdapterService`: it
owns the four subscriptions, and acts through the parts it is given (the owned trials, the
drain, the adapter).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts import (
    CancelReply,
    CancelRequest,
    CheckReply,
    CheckRequest,
    ContractError,
    DrainReply,
    DrainRequest,
    LogReply,
    LogRequest,
    sealing,
    subjects,
)
from services.adapters.base import PlatformAdapter
from services.adapters.drain import Drain
from services.adapters.trials import OwnedTrials
from services.common import logs
from services.common.bus import Bus

log = logging.getLogger(__name__)


class ControlRequests:
    """``control.<adapter>.*`` handlers (see the module docstring); ``wake`` offers the held
    requests again (a canceled one then ends)."""

    def __init__(
        self, adapter: PlatformAdapter, replica: str, trials: OwnedTrials, drain: Drain, wake: Callable[[], None]
    ) -> None:
        self.adapter, self.replica, self.trials, self.drain, self._wake = adapter, replica, trials, drain, wake
        self._subs: list[Subscription] = []

    async def start(self, bus: Bus) -> None:
        self._subs = [
            await bus.nc.subscribe(subjects.control(self.adapter.name, "cancel"), cb=self._on_cancel),
            await bus.nc.subscribe(subjects.control(self.adapter.name, "log"), cb=self._on_log),
            await bus.nc.subscribe(subjects.control(self.adapter.name, "check"), queue="check", cb=self._on_check),
            await bus.nc.subscribe(subjects.control(self.adapter.name, "drain"), cb=self._on_drain),
        ]

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _on_cancel(self, msg: Msg) -> None:
        if (request := _decode(CancelRequest, msg)) is None:
            return
        if request.replica is not None and request.replica != self.replica:
            return  # meant for another replica's copy
        mine = [o for o in self.trials.of_trial(request.trial_id) if request.attempt in (None, o.attempt)]
        if not mine:
            return  # another replica owns it (or nobody): stay silent
        accepted = False
        for owned in mine:
            if owned.outcome is None:  # an attempt that already ended keeps its own status
                accepted = True
                owned.cancel = owned.cancel or request
                if owned.announced or owned.queued is not None:  # else: sent once launched and announced
                    with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
                        await self.trials.send_cancel(owned)
                elif owned.waiting is not None:  # held for capacity: end it now
                    self._wake()
        reply = CancelReply(trial_id=request.trial_id, replica=self.replica, accepted=accepted)
        await self._respond(msg, reply)

    async def _on_drain(self, msg: Msg) -> None:
        if (request := _decode(DrainRequest, msg)) is None or request.replica != self.replica:
            return  # another replica's: it answers
        preempted = await self.drain.set(request.drain, f"adapter replica {self.replica} is draining")
        reply = DrainReply(replica=self.replica, draining=self.drain.active, preempted=preempted)
        await self._respond(msg, reply)

    async def _on_log(self, msg: Msg) -> None:
        if (request := _decode(LogRequest, msg)) is None:
            return
        handle = self.trials.latest_handle(request.trial_id, request.attempt)
        if handle is None:
            try:
                handle = await self.adapter.past(request.experiment_id, request.trial_id, request.attempt)
            except Exception:
                log.exception("cannot look for the logs of trial %s", request.trial_id)
        if handle is None:
            return
        try:
            text = await self.adapter.log_tail(handle, request.max_bytes)
        except Exception as exc:
            text = f"[the trial's log cannot be read: {exc}]"
        reply = LogReply(trial_id=request.trial_id, replica=self.replica, text=text, attempt=handle.attempt)
        await self._respond(msg, reply)

    async def _on_check(self, msg: Msg) -> None:
        if (request := _decode(CheckRequest, msg)) is None:
            return
        try:
            if (unreadable := sealing.unreadable(request)) is not None:
                problems = [f"the {self.adapter.name} adapter cannot read the experiment's secrets: {unreadable}"]
            else:
                problems = await self.adapter.check(request.training_service)
        except Exception as exc:  # a bug must not block creating experiments
            log.exception("cannot check a training service")
            problems = [f"the {self.adapter.name} adapter could not check the platform: {exc}"]
        await self._respond(msg, CheckReply(replica=self.replica, problems=problems))

    async def _respond(self, msg: Msg, reply: CancelReply | LogReply | CheckReply | DrainReply) -> None:
        with contextlib.suppress(nats.errors.Error):  # the requester times out and asks again
            await msg.respond(reply.encode())


_Control = TypeVar("_Control", CancelRequest, LogRequest, CheckRequest, DrainRequest)


def _decode(model: type[_Control], msg: Msg) -> _Control | None:
    """A control request, or None (logged) when it is malformed: nobody answers it."""
    try:
        return model.decode(msg.data)
    except ContractError as exc:
        log.warning("ignoring a malformed %s on %s: %s", model.__name__, msg.subject, exc)
        return None
