"""The control requests every adapter replica answers on ``control.<adapter>.*``, written once.

- ``cancel``: only the replica owning the trial (or that attempt, or that replica's copy) acts
  and answers; a cancel that comes while the trial launches takes effect once it is launched.
- ``drain``: the named replica stops taking trials and preempts those it runs (also done by
  itself on a spot notice: ``services.adapters.spot``).
- ``log``: the owner (or a replica that keeps a past attempt's files) answers the log's tail.
- ``check``: one replica (a queue group) says whether the platform can run an experiment.

A mixin of :class:`~services.adapters.service.AdapterService`, which holds the state it uses.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.msg import Msg

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
    TrialStatus,
    sealing,
)
from services.common import logs

if TYPE_CHECKING:
    from services.adapters.trials import Owned

log = logging.getLogger(__name__)


class ControlRequests:
    """``control.<adapter>.*`` handlers (see the module docstring)."""

    _drained_because = "the replica is draining"


    async def _on_cancel(self, msg: Msg) -> None:
        if (request := _decode(CancelRequest, msg)) is None:
            return
        if request.replica is not None and request.replica != self.settings.replica:
            return  # meant for another replica's copy
        mine = [o for o in self.trials.of_trial(request.trial_id) if request.attempt in (None, o.attempt)]
        if not mine:
            return  # another replica owns it (or nobody): stay silent
        accepted = False
        for owned in mine:
            if owned.outcome is None:  # an attempt that already ended keeps its own status
                accepted = True
                owned.cancel = owned.cancel or request
                if owned.announced:  # else: sent once launched and announced
                    with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
                        await self.trials.send_cancel(owned)
                elif owned.waiting is not None:  # held for capacity: end it now
                    self.capacity.fire()
        reply = CancelReply(trial_id=request.trial_id, replica=self.settings.replica, accepted=accepted)
        await self._respond(msg, reply)

    async def _on_drain(self, msg: Msg) -> None:
        if (request := _decode(DrainRequest, msg)) is None or request.replica != self.settings.replica:
            return  # another replica's: it answers
        preempted = await self.drain(request.drain, f"adapter replica {self.settings.replica} is draining")
        reply = DrainReply(replica=self.settings.replica, draining=self.draining, preempted=preempted)
        await self._respond(msg, reply)

    async def drain(self, drain: bool, why: str) -> int:
        """Drain (no new trials here; each running one preempted, saying ``why``) or undrain;
        how many trials were preempted."""
        self.draining, preempted = drain, 0
        log.warning(f"draining ({why}): no more trials here, and the running ones are preempted" if drain
                    else "undrained: taking trials again")  # fmt: skip
        if drain:
            self._drained_because = why
            for owned in list(self.owned.values()):
                if owned.outcome is not None or owned.cancel is not None or owned.handle is None:
                    continue  # ended, being stopped already, or still launching (preempted once launched)
                owned.cancel = self._preemption(owned)
                preempted += 1
                if owned.announced:
                    with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
                        await self.trials.send_cancel(owned)
            self.capacity.fire()  # held requests go back to the queue
        self._status_due.set()
        return preempted

    def _preemption(self, owned: Owned) -> CancelRequest:
        why = f"preempted: {self._drained_because}"
        return CancelRequest(experiment_id=owned.experiment_id, trial_id=owned.trial_id,
                             status=TrialStatus.SYS_CANCELED, message=why, preempt=True)  # fmt: skip

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
        reply = LogReply(trial_id=request.trial_id, replica=self.settings.replica, text=text, attempt=handle.attempt)
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
        await self._respond(msg, CheckReply(replica=self.settings.replica, problems=problems))

    async def _respond(self, msg: Msg, reply: CancelReply | LogReply | CheckReply | DrainReply) -> None:
        with contextlib.suppress(nats.errors.Error):  # the requester times out and asks again
            await msg.respond(reply.encode())


_Control = CancelRequest | LogRequest | CheckRequest | DrainRequest


def _decode(model: type[_Control], msg: Msg) -> _Control | None:
    """A control request, or None (logged) when it is malformed: nobody answers it."""
    try:
        return model.decode(msg.data)
    except ContractError as exc:
        log.warning("ignoring a malformed %s on %s: %s", model.__name__, msg.subject, exc)
        return None
