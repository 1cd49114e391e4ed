"""Event subjects name their source, and the dispatcher's gate admits a trial's events from its
owner only (services/dispatcher/ownership.py); no I/O."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from contracts import TrialEvent, TrialStatus, subjects
from services.dispatcher.ownership import NOT_OWNER, REMEMBERED, SUBJECT_MISMATCH, EventGate


def event(trial: str = "T1", experiment: str = "E1", status: TrialStatus = TrialStatus.SUCCEEDED) -> TrialEvent:
    return TrialEvent(experiment_id=experiment, trial_id=trial, status=status, time=datetime.now(UTC))


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("trialbus_dispatcher_events_refused_total", {"reason": reason}) or 0.0


def test_an_event_subject_names_experiment_trial_and_source():
    subject = subjects.events("E1", "T1", "local-gpu")
    assert subject == "events.E1.T1.local-gpu"
    assert subjects.trial_from_subject(subject) == ("E1", "T1")
    assert subjects.source_from_subject(subject) == "local-gpu"
    assert subjects.events() == "events.*.*.*"
    # an event an older version wrote before the upgrade has no source
    assert subjects.trial_from_subject("events.E1.T1") == ("E1", "T1")
    assert subjects.source_from_subject("events.E1.T1") is None
    # readers: one experiment's events, or one trial's, in both layouts
    assert subjects.experiment_events("E1") == "events.E1.>"
    assert subjects.trial_events("E1", "T1") == ["events.E1.T1.*", "events.E1.T1"]


@pytest.mark.parametrize("source", ["local-gpu", subjects.DISPATCHER])
def test_the_owner_and_the_dispatcher_are_admitted(source: str):
    assert EventGate().admits(subjects.events("E1", "T1", source), event(), owner="local-gpu")


def test_an_event_from_before_sources_is_admitted():
    assert EventGate().admits("events.E1.T1", event(), owner="local-gpu")


def test_another_adapter_is_refused_counted_and_logged_once_per_trial(caplog: pytest.LogCaptureFixture):
    gate, before = EventGate(), refused(NOT_OWNER)
    caplog.set_level(logging.WARNING, "services.dispatcher.ownership")

    admitted = [
        gate.admits(subjects.events("E1", trial, "openpai"), event(trial), "local-gpu")
        for trial in ("T1", "T1", "T1", "T2")
    ]

    assert admitted == [False] * 4
    assert refused(NOT_OWNER) == before + 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings  # once per trial
    assert warnings[0].startswith(
        "ignoring openpai's SUCCEEDED event for trial T1 of experiment E1: the trial was dispatched to local-gpu"
    ), warnings[0]


@pytest.mark.parametrize(
    "subject", ["events.E1.T2.local-gpu", "events.E2.T1.local-gpu", "events.E1.T2", "events.E1", "events"]
)
def test_a_payload_about_another_trial_than_its_subject_is_refused(subject: str, caplog: pytest.LogCaptureFixture):
    before = refused(SUBJECT_MISMATCH)
    caplog.set_level(logging.WARNING, "services.dispatcher.ownership")

    assert not EventGate().admits(subject, event("T1", "E1"), owner="local-gpu")

    assert refused(SUBJECT_MISMATCH) == before + 1
    assert f"ignoring an event on {subject} whose payload is about trial T1 of experiment E1" in caplog.text


def test_the_trials_remembered_for_warnings_are_bounded():
    gate = EventGate()
    for i in range(REMEMBERED + 10):
        gate.admits(subjects.events("E1", f"T{i}", "openpai"), event(f"T{i}"), "local-gpu")
    assert len(gate._warned) == REMEMBERED
