"""Silent trials: a RUNNING trial whose keeper has said nothing for ``retry.heartbeatTimeout``
seconds is lost, never left RUNNING forever.

A keeper of an experiment with a heartbeat timeout reports at least every third of it: its
metric records, or an empty batch (a heartbeat) when it has none; the gateway publishes the
latter on ``heartbeats.<experiment>.<trial>`` (core NATS: a heartbeat is worth nothing once
late). Both count as signs of life here, by trial, for the trial's current attempt.

A trial silent past its timeout is stopped before it runs again (two attempts never run at
once): its adapter is asked to stop the attempt, and the attempt's end, when it comes, counts
as a ``lost`` failure for the retry policy. If no end comes within a second timeout (its
adapter replica is gone too), the attempt is given up as lost all the same.

Everything here is O(1) per record, heartbeat or trial checked; memory is one float per
running trial of an experiment with a timeout.
"""

from __future__ import annotations

import logging
import time

import orjson

from contracts import subjects
from contracts.state import TrialState, TrialStatus

log = logging.getLogger(__name__)


class Liveness:
    """When each running trial was last heard from (monotonic seconds)."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        #: trial → when it was declared lost (its attempt is being stopped)
        self.lost: dict[str, float] = {}

    def heard(self, trial_id: str) -> None:
        self._seen[trial_id] = time.monotonic()

    def on_heartbeat(self, subject: str, data: bytes, attempt_of) -> None:
        """A heartbeat message; ``attempt_of(trial)`` is the trial's current attempt (None: unknown)."""
        try:
            _, trial_id = subjects.trial_from_subject(subject)
            attempt = orjson.loads(data).get("attempt", 0) if data else 0
        except (ValueError, AttributeError):
            return
        if attempt_of(trial_id) == attempt:
            self.heard(trial_id)

    def silent(self, trial: TrialState, timeout: float) -> bool:
        """Whether the RUNNING ``trial`` has been silent past ``timeout``. A trial never heard from
        (it just started, or this dispatcher did) is heard from now: it has ``timeout`` to speak."""
        if trial.status != TrialStatus.RUNNING or trial.id in self.lost:
            return False
        now = time.monotonic()
        seen = self._seen.setdefault(trial.id, now)
        return now - seen > timeout

    def declare_lost(self, trial_id: str) -> None:
        self.lost[trial_id] = time.monotonic()

    def given_up(self, trial_id: str, timeout: float) -> bool:
        """Whether a trial declared lost has had ``timeout`` more seconds to end, in vain."""
        since = self.lost.get(trial_id)
        return since is not None and time.monotonic() - since > timeout

    def forget(self, trial_id: str) -> None:
        """The attempt is over: its next one starts silent-free."""
        self._seen.pop(trial_id, None)
        self.lost.pop(trial_id, None)
