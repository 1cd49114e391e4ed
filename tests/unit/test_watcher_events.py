"""What the client's experiment watcher reads of an event before it validates it (trialbus/watcher.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from contracts import TrialEvent, TrialStatus
from trialbus.watcher import _GOING_ON, _status_of


@pytest.mark.parametrize("status", list(TrialStatus))
def test_an_events_status_is_read_without_validating_it(status):
    event = TrialEvent(experiment_id="e1", trial_id="t1", attempt=0, status=status, time=datetime.now(UTC))
    assert _status_of(event.encode()) == status.value
    assert (status.value in _GOING_ON) is (not status.terminal)  # only a trial's end is validated further


@pytest.mark.parametrize("data", [b"nope", b"[]", b'{"status": ["RUNNING"]}', b'{"status": {"a": 1}}', b"{}"])
def test_an_unreadable_event_has_no_status_and_is_validated_as_any_other(data):
    assert _status_of(data) is None
