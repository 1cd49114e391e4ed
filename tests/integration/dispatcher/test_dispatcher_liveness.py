"""Silent trials (services/dispatcher/liveness.py), in memory: heard from or not, declared lost,
given up, and heartbeats of an attempt that is over not counted. No I/O."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from contracts import subjects
from contracts.state import TrialState, TrialStatus
from services.dispatcher.liveness import Liveness

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def running(trial_id: str = "t1", status: TrialStatus = TrialStatus.RUNNING) -> TrialState:
    return TrialState(
        id=trial_id, experiment_id="e1", sequence_id=0, platform="local-gpu", submit_time=NOW, status=status, attempt=1
    )


def test_a_trial_never_heard_from_has_its_timeout_to_speak():
    liveness = Liveness()
    assert not liveness.silent(running(), timeout=0.05)  # the clock starts now
    time.sleep(0.06)
    assert liveness.silent(running(), timeout=0.05)


def test_a_sign_of_life_resets_the_clock_and_only_running_trials_are_silent():
    liveness = Liveness()
    liveness.silent(running(), timeout=0.05)
    time.sleep(0.06)
    liveness.heard("t1")
    assert not liveness.silent(running(), timeout=0.05)
    assert not liveness.silent(running(status=TrialStatus.WAITING), timeout=0.0)


def test_a_heartbeat_counts_for_the_trial_s_current_attempt_only():
    liveness = Liveness()
    liveness.silent(running(), timeout=0.05)
    time.sleep(0.06)
    subject = subjects.heartbeats("e1", "t1")

    liveness.on_heartbeat(subject, b'{"attempt": 0}', lambda trial_id: 1)  # an attempt that is over
    assert liveness.silent(running(), timeout=0.05)
    liveness.on_heartbeat(subject, b'{"attempt": 1}', lambda trial_id: 1)
    assert not liveness.silent(running(), timeout=0.05)
    liveness.on_heartbeat("heartbeats.malformed", b"{", lambda trial_id: 1)  # ignored, not raised


def test_a_lost_trial_is_given_up_once_its_stop_is_not_confirmed_in_time_and_forgotten_when_it_ends():
    liveness = Liveness()
    liveness.declare_lost("t1")
    assert not liveness.silent(running(), timeout=0.0)  # being stopped: not lost twice
    assert not liveness.given_up("t1", timeout=10)
    time.sleep(0.02)
    assert liveness.given_up("t1", timeout=0.01)

    liveness.forget("t1")

    assert "t1" not in liveness.lost and not liveness.given_up("t1", timeout=0.0)
