"""Draining an adapter replica: it takes no new trials, and preempts those it runs.

``control.<adapter>.drain`` naming the replica (``trialbus platform drain``), or a spot VM's
notice (:mod:`services.adapters.spot`), drains it; undrained, it takes trials again. Each
running trial gets a cancel that preempts it (SYS_CANCELED with ``preempt``, which the
dispatcher runs again elsewhere); one still launching is preempted once launched
(:class:`~services.adapters.intake.Intake` asks :meth:`Drain.preemption`), and requests held
for capacity go back to the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from contracts import CancelRequest, TrialStatus
from services.adapters.trials import Owned, OwnedTrials
from services.common import logs

log = logging.getLogger(__name__)


class Drain:
    """Whether the replica drains, and why; ``wake`` offers the held requests again (they go
    back to the queue), ``changed`` says the published status changed."""

    def __init__(self, trials: OwnedTrials, wake: Callable[[], None], changed: Callable[[], None]) -> None:
        self.trials, self._wake, self._changed = trials, wake, changed
        self.active = False
        self._because = "the replica is draining"

    async def set(self, drain: bool, why: str) -> int:
        """Drain (no new trials here; each running one preempted, saying ``why``) or undrain;
        how many trials were preempted."""
        self.active, preempted = drain, 0
        log.warning(
            f"draining ({why}): no more trials here, and the running ones are preempted"
            if drain
            else "undrained: taking trials again"
        )
        if drain:
            self._because = why
            for owned in list(self.trials.by_key.values()):
                if owned.outcome is not None or owned.cancel is not None or owned.handle is None:
                    continue  # ended, being stopped already, or still launching (preempted once launched)
                owned.cancel = self.preemption(owned)
                preempted += 1
                if owned.announced or owned.queued is not None:
                    with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
                        await self.trials.send_cancel(owned)
            self._wake()  # held requests go back to the queue
        self._changed()
        return preempted

    def preemption(self, owned: Owned) -> CancelRequest:
        """The cancel that preempts a trial of this draining replica."""
        why = f"preempted: {self._because}"
        return CancelRequest(
            experiment_id=owned.experiment_id,
            trial_id=owned.trial_id,
            status=TrialStatus.SYS_CANCELED,
            message=why,
            preempt=True,
        )
