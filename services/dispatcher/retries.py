"""The retry policy, decided in one place: does a trial whose attempt just ended run again?

Adapters report how an attempt ended with the failure class their platform gives
(:data:`contracts.retries.Failure`); this module alone turns that and the experiment's
``retry:`` into a decision. A retry is the same trial (same id, same parameters) as its next
attempt, after a back-off, with the attempt that ended kept in ``TrialState.attempts``.
Never retried: an attempt that succeeded, one stopped because someone asked (a cancel,
an assessor, ``maxTrialDuration``: the trial has ``cancel_status``), a permanent failure,
and one whose budget is spent. Each decision costs O(attempts of the trial).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from contracts.retries import INFRASTRUCTURE, Attempt, Failure, RetryPolicy
from contracts.state import TrialState, TrialStatus

#: Statuses of an attempt a retry may follow: a failure, or a stop nobody here asked for.
RETRIABLE = frozenset({TrialStatus.FAILED, TrialStatus.SYS_CANCELED})


class Retry(NamedTuple):
    """The trial's next attempt, and how long it waits before it may take a slot."""

    trial: TrialState
    delay: float


def ended_attempt(
    trial: TrialState,
    status: TrialStatus,
    failure: Failure | None,
    when: datetime,
    exit_code: int | None,
    message: str | None,
) -> Attempt:
    """The record of the trial's current attempt, ended as said (``PREEMPTED`` for a preemption: it is
    no failure of the trial's)."""
    return Attempt(
        attempt=trial.attempt,
        platform=trial.platform,
        replica=trial.replica,
        start_time=trial.start_time,
        end_time=when,
        status="PREEMPTED" if failure == "preempted" else status.value,
        exit_code=exit_code,
        failure=failure,
        message=message,
    )


def budget_left(policy: RetryPolicy, past: list[Attempt], failure: Failure) -> tuple[bool, int]:
    """Whether one more retry after a ``failure`` fits the policy, and how many of that budget
    were used before (which sets the back-off)."""
    if failure == "preempted":
        used = sum(a.failure == "preempted" for a in past)
        return used < policy.max_preemptions, 0
    if failure in INFRASTRUCTURE:
        used = sum(a.failure in INFRASTRUCTURE for a in past)
        return used < policy.infrastructure, used
    if failure == "trial":
        used = sum(a.failure == "trial" for a in past)
        return used < policy.trial, used
    return False, 0  # permanent


def decide(
    trial: TrialState,
    status: TrialStatus,
    failure: Failure | None,
    policy: RetryPolicy,
    *,
    when: datetime,
    exit_code: int | None,
    message: str | None,
    hybrid: bool,
) -> Retry | None:
    """The retry of ``trial`` after its current attempt ended with ``status`` (and ``failure``),
    or None when the trial ends here."""
    if status not in RETRIABLE or trial.cancel_status is not None:
        return None
    if status is TrialStatus.FAILED:
        failure = failure or "trial"
    elif failure != "preempted":
        return None  # stopped outside Trialbus, for no reason the platform gives: ends as it is
    record = ended_attempt(trial, status, failure, when, exit_code, message)
    past = [*trial.attempts, record]
    fits, used = budget_left(policy, trial.attempts, failure)
    if not fits:
        return None
    delay = policy.backoff if failure == "preempted" else min(policy.backoff * 2**used, policy.max_backoff)
    why = f"attempt {trial.attempt} {_how(status, failure)}" + (f": {message}" if message else "")
    message = f"{why}; attempt {trial.attempt + 1} " + (f"starts in {delay:g}s" if delay else "waits for a slot")
    retry = _next_attempt(trial, past, hybrid, when + timedelta(seconds=delay) if delay else None, message)
    return Retry(retry, delay)


def manual(trial: TrialState, *, hybrid: bool, when: datetime) -> TrialState:
    """A new attempt of a trial that has ended, asked for by a user (``trialbus trial retry``):
    no budget, no back-off."""
    record = ended_attempt(trial, trial.status, trial.failure, trial.end_time or when, trial.exit_code, trial.message)
    message = (
        f"retried by hand after attempt {trial.attempt} ended {trial.status.value}; "
        f"attempt {trial.attempt + 1} waits for a slot"
    )
    return _next_attempt(trial, [*trial.attempts, record], hybrid, None, message)


def _next_attempt(
    trial: TrialState, attempts: list, hybrid: bool, retry_at: datetime | None, message: str
) -> TrialState:
    """The trial as its next attempt starts: the ended ones in ``attempts``, waiting for a slot (on
    any platform of a hybrid experiment), nothing of the last attempt's run kept."""
    return trial.model_copy(
        update={
            "attempt": trial.attempt + 1,
            "attempts": attempts,
            "status": TrialStatus.WAITING,
            "dispatched": False,
            "platform": "" if hybrid else trial.platform,
            "replica": None,
            "start_time": None,
            "end_time": None,
            "exit_code": None,
            "final_metric": None,
            "intermediate_count": 0,
            "failure": None,
            "retry_at": retry_at,
            "cancel_status": None,
            "message": message,
        }
    )


def _how(status: TrialStatus, failure: str) -> str:
    return {
        "preempted": "was preempted",
        "infrastructure": "lost what ran it",
        "lost": "fell silent",
        "trial": "failed",
    }.get(failure, f"ended {status.value}")
