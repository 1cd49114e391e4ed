"""The retry policy (services/dispatcher/retries.py): which ends run again, how often, after how long."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from contracts import ExperimentConfig, TrialEvent, TrialState, TrialStatus
from contracts.retries import RetryPolicy
from services.dispatcher import retries

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def running(attempt: int = 0, **fields) -> TrialState:
    return TrialState(
        id="T1",
        experiment_id="E1",
        sequence_id=0,
        attempt=attempt,
        status=TrialStatus.RUNNING,
        platform="local-gpu",
        replica="host-a",
        submit_time=NOW,
        start_time=NOW,
        final_metric=0.5,
        intermediate_count=4,
        dispatched=True,
        **fields,
    )


def end(
    trial: TrialState,
    failure: str | None,
    status: TrialStatus = TrialStatus.FAILED,
    policy: RetryPolicy | None = None,
    hybrid: bool = False,
) -> retries.Retry | None:
    return retries.decide(
        trial, status, failure, policy or RetryPolicy(), when=NOW, exit_code=3, message="why", hybrid=hybrid
    )


def test_by_default_infrastructure_is_retried_three_times_and_the_trial_s_own_failure_never():
    trial, delays = running(), []
    while (retry := end(trial, "infrastructure")) is not None:
        delays.append(retry.delay)
        trial = retry.trial.model_copy(update={"status": TrialStatus.RUNNING})
    assert trial.attempt == 3 and delays == [5.0, 10.0, 20.0]  # doubled each time
    assert [a.failure for a in trial.attempts] == ["infrastructure"] * 3
    assert end(running(), "trial") is None and end(running(), None) is None  # a plain failure is the trial's
    assert end(running(), "permanent", policy=RetryPolicy(trial=5, infrastructure=5)) is None


def test_a_retry_is_the_same_trial_as_its_next_attempt_with_the_ended_one_recorded():
    retry = end(running(), "infrastructure")
    assert retry is not None
    trial = retry.trial
    assert (trial.id, trial.attempt, trial.status, trial.dispatched, trial.platform) == (
        "T1",
        1,
        TrialStatus.WAITING,
        False,
        "local-gpu",
    )
    assert (trial.final_metric, trial.intermediate_count, trial.replica, trial.start_time) == (None, 0, None, None)
    assert trial.retry_at == NOW + timedelta(seconds=5)
    [ended] = trial.attempts
    assert (ended.attempt, ended.status, ended.exit_code, ended.failure, ended.replica, ended.message) == (
        0,
        "FAILED",
        3,
        "infrastructure",
        "host-a",
        "why",
    )
    assert "attempt 1 starts in 5s" in trial.message
    assert end(running(), "infrastructure", hybrid=True).trial.platform == ""  # placed again


def test_budgets_count_per_class_and_preemptions_count_against_neither():
    policy = RetryPolicy(infrastructure=1, trial=1, backoff=0, max_preemptions=2)
    trial = running()
    for failure in ("preempted", "trial", "preempted", "infrastructure"):
        retry = end(
            trial,
            failure,
            status=TrialStatus.SYS_CANCELED if failure == "preempted" else TrialStatus.FAILED,
            policy=policy,
        )
        assert retry is not None, failure
        assert retry.delay == 0 and retry.trial.retry_at is None  # no back-off: queued at once
        trial = retry.trial.model_copy(update={"status": TrialStatus.RUNNING})
    for failure, status in (
        ("trial", TrialStatus.FAILED),
        ("infrastructure", TrialStatus.FAILED),
        ("lost", TrialStatus.FAILED),
        ("preempted", TrialStatus.SYS_CANCELED),
    ):
        assert end(trial, failure, status=status, policy=policy) is None, f"{failure}: its budget is spent"


def test_what_someone_asked_for_or_a_success_is_never_retried():
    assert end(running(cancel_status=TrialStatus.USER_CANCELED), "infrastructure") is None
    for status in (TrialStatus.SUCCEEDED, TrialStatus.USER_CANCELED, TrialStatus.EARLY_STOPPED):
        assert end(running(), None, status=status) is None
    assert end(running(), None, status=TrialStatus.SYS_CANCELED) is None  # stopped outside Trialbus: as it is
    assert end(running(), "preempted", status=TrialStatus.SYS_CANCELED) is not None


def test_the_back_off_grows_to_its_cap_and_a_preemption_always_waits_the_first():
    policy = RetryPolicy(infrastructure=10, backoff=1, max_backoff=6)
    trial, delays = running(), []
    for _ in range(5):
        retry = end(trial, "lost", policy=policy)
        delays.append(retry.delay)
        trial = retry.trial.model_copy(update={"status": TrialStatus.RUNNING})
    assert delays == [1, 2, 4, 6, 6]
    assert end(trial, "preempted", status=TrialStatus.SYS_CANCELED, policy=policy).delay == 1


def test_a_retry_by_hand_keeps_the_ended_attempt_and_needs_no_budget():
    failed = running().model_copy(
        update={
            "status": TrialStatus.FAILED,
            "end_time": NOW,
            "failure": "trial",
            "exit_code": 3,
            "cancel_status": TrialStatus.USER_CANCELED,
        }
    )
    again = retries.manual(failed, hybrid=False, when=NOW)
    assert (again.attempt, again.status, again.cancel_status, again.retry_at) == (1, TrialStatus.WAITING, None, None)
    assert [(a.status, a.failure, a.exit_code) for a in again.attempts] == [("FAILED", "trial", 3)]


def test_the_config_reads_nni_units_and_refuses_what_makes_no_sense():
    config = ExperimentConfig.model_validate(
        {
            "trialCommand": "x",
            "trialConcurrency": 1,
            "trainingService": {"platform": "local"},
            "retry": {
                "infrastructure": 1,
                "TRIAL": 2,
                "backoff": "30s",
                "max_backoff": "1h",
                "heartbeatTimeout": "10m",
            },
            "trialGracePeriod": "2m",
        }
    )
    policy = config.retry_policy
    assert (policy.infrastructure, policy.trial, policy.backoff, policy.max_backoff, policy.heartbeat_timeout) == (
        1,
        2,
        30.0,
        3600.0,
        600.0,
    )
    assert config.trial_grace_period == 120.0
    assert (
        ExperimentConfig.model_validate(
            {"trialCommand": "x", "trialConcurrency": 1, "trainingService": {"platform": "local"}}
        ).retry_policy
        == RetryPolicy()
    )
    for bad, says in (
        ({"backoff": "1h", "maxBackoff": "1m"}, "shorter than retry.backoff"),
        ({"infrastructure": -1}, "greater than or equal to 0"),
        ({"heartbeatTimeout": "1s"}, "greater than or equal to 3"),
        ({"retries": 3}, r"does not have field\(s\) retries"),
    ):
        with pytest.raises(ValidationError, match=says):
            RetryPolicy.model_validate(bad)


def test_older_failure_names_are_read_as_the_classes_they_became():
    event = TrialEvent(experiment_id="E1", trial_id="T1", status=TrialStatus.FAILED, time=NOW, failure="transient")
    assert event.failure == "infrastructure"
    assert (
        TrialEvent(experiment_id="E1", trial_id="T1", status=TrialStatus.FAILED, time=NOW, failure="unknown").failure
        == "trial"
    )
