"""Which trial events the dispatcher applies: a trial's events come from its owner only.

An event's subject says who published it, ``events.<experiment>.<trial>.<source>``, and the
NATS permissions (``k8s/base/nats/auth.conf``) let each adapter's user publish only on its own
source, the dispatcher only on ``dispatcher``. So the source is who the broker let speak, and
the dispatcher applies an event only when

- the subject's experiment and trial are the payload's ``experimentId`` and ``trialId``
  (otherwise an adapter could publish, on a subject of its own, an event about another
  platform's trial), and
- its source is the adapter the trial was dispatched to (``TrialState.platform``), or the
  dispatcher, or none: a three-token ``events.<experiment>.<trial>`` written by an older
  version before an upgrade, which predates the permission (no user may publish one now).

Anything else is refused: never applied, counted in
``trialbus_dispatcher_events_refused_total{reason}`` (``not owner``, ``subject mismatch``) on
the dispatcher's ``/metrics``, and logged at WARNING once per trial and reason (the trials
remembered for that are bounded, so forged events on made-up ids cannot fill memory).
Where the broker has no users (a bare nats-server, as in tests) anyone may publish on any
source: this check still refuses an event whose source is not the owner, but only the
permissions make the source true. Each event costs a subject split and two comparisons.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from prometheus_client import Counter

from contracts import subjects
from contracts.messages import TrialEvent

log = logging.getLogger(__name__)

#: Created once per process: the registry ``/metrics`` serves refuses a second registration.
REFUSED = Counter("trialbus_dispatcher_events_refused", "Trial events not applied, by reason", ["reason"])
NOT_OWNER = "not owner"
SUBJECT_MISMATCH = "subject mismatch"
#: Trials whose refusal was logged, newest kept: one WARNING per trial and reason.
REMEMBERED = 4096


class EventGate:
    """Says whether an event may be applied to its trial; counts and logs what it refuses."""

    def __init__(self) -> None:
        self._warned: OrderedDict[tuple[str, str], None] = OrderedDict()

    def admits(self, subject: str, event: TrialEvent, owner: str | None) -> bool:
        """True if ``event``, received on ``subject``, may change its trial; ``owner`` is the
        adapter the trial was dispatched to (None: no such trial, which nobody may change)."""
        try:
            named = subjects.trial_from_subject(subject)
        except ValueError:  # ``events.x``: the stream takes it, no trial is named
            named = None
        if named != (event.experiment_id, event.trial_id):
            self._refuse(
                SUBJECT_MISMATCH,
                event.trial_id,
                "ignoring an event on %s whose payload is about trial %s of experiment %s: each trial's "
                "events go on its own subject (a publisher may not speak for another trial there)",
                subject,
                event.trial_id,
                event.experiment_id,
            )
            return False
        source = subjects.source_from_subject(subject)
        if owner is None or source is None or source in (owner, subjects.DISPATCHER):
            return True
        self._refuse(
            NOT_OWNER,
            event.trial_id,
            "ignoring %s's %s event for trial %s of experiment %s: the trial was dispatched to %s, and "
            "only %s or the dispatcher may report its status (check who holds the %s NATS credentials)",
            source,
            event.status.value,
            event.trial_id,
            event.experiment_id,
            owner,
            owner,
            source,
        )
        return False

    def _refuse(self, reason: str, trial: str, message: str, *args: object) -> None:
        REFUSED.labels(reason).inc()
        key = (reason, trial)
        if key in self._warned:
            return
        self._warned[key] = None
        if len(self._warned) > REMEMBERED:
            self._warned.popitem(last=False)
        log.warning(
            message + "; further ones for this trial are only counted (trialbus_dispatcher_events_refused_total)", *args
        )
