"""Attempts of a trial: why one ended (its failure class), the experiment's retry policy
(``retry:``, a Trialbus key beside NNI's), and the record of an attempt that is over.

Adapters only say what happened, with the failure class their platform gives; the
dispatcher alone decides from the policy whether the trial runs again as its next attempt
(:mod:`services.dispatcher.retries`). docs/retries.md says it for users.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from contracts.base import Contract
from contracts.nni import NniModel
from contracts.units import parse_seconds

#: Older names, read as the classes they became: OpenPAI's exit spec says *transient* for a
#: failure of its infrastructure; *unknown* was every other failure, which is the trial's own
#: unless the platform says otherwise.
_LEGACY = {"transient": "infrastructure", "unknown": "trial"}


def _legacy_failure(value: Any) -> Any:
    return _LEGACY.get(value, value) if isinstance(value, str) else value


#: Why an attempt ended, for the retry policy:
#:
#: - ``trial``: the trial's own code failed (its command exited non-zero), or the platform
#:   cannot tell; retried only when the policy asks (``retry.trial``);
#: - ``infrastructure``: what ran it went away (a machine or node gone, an SSH host unreachable
#:   past its timeout, the trial's keeper vanished, OpenPAI's exit spec says transient);
#:   retried ``retry.infrastructure`` times (3 by default);
#: - ``preempted``: stopped for someone else's reason (a drain, an eviction, a spot notice);
#:   retried without counting against either budget;
#: - ``lost``: its keeper fell silent past ``retry.heartbeatTimeout``; counted as infrastructure;
#: - ``permanent``: it cannot run at all (a command that does not exist, a refused configuration,
#:   OpenPAI's exit spec says permanent); never retried.
Failure = Annotated[
    Literal["trial", "infrastructure", "preempted", "lost", "permanent"], BeforeValidator(_legacy_failure)
]

#: The failure classes each budget of :class:`RetryPolicy` counts.
INFRASTRUCTURE = frozenset({"infrastructure", "lost"})


class RetryPolicy(NniModel):
    """``retry:`` of an experiment config. Without it: infrastructure failures are retried up
    to 3 times, the trial's own failures are not, preemptions always are."""

    #: Retries after failures of the infrastructure (and of silent, lost trials).
    infrastructure: int = Field(default=3, ge=0, le=1000)
    #: Retries after the trial's own failures (its command exited non-zero).
    trial: int = Field(default=0, ge=0, le=1000)
    #: Seconds before the first retry of a failure, doubled at each further one up to
    #: ``maxBackoff``; NNI unit strings like ``30s`` or ``5m`` are accepted. A preempted
    #: attempt is retried after ``backoff``, never more.
    backoff: float = Field(default=5.0, ge=0)
    max_backoff: float = Field(default=300.0, ge=0)
    #: Preemptions retried at most (they do not count against the budgets above, but a trial
    #: preempted this many times ends, so a platform that always preempts cannot loop forever).
    max_preemptions: int = Field(default=100, ge=0, le=100000)
    #: Seconds a running trial's keeper may stay silent before the trial is lost (stopped, then
    #: retried as an infrastructure failure); unset, trials are never declared lost. Keepers then
    #: report at least every third of it. Longer than any gateway outage you expect to ride out.
    heartbeat_timeout: float | None = Field(default=None, ge=3)

    _durations = field_validator("backoff", "max_backoff", mode="before")(parse_seconds)
    _timeout = field_validator("heartbeat_timeout", mode="before")(lambda v: None if v is None else parse_seconds(v))

    @model_validator(mode="after")
    def _ordered(self) -> RetryPolicy:
        if self.max_backoff < self.backoff:
            raise ValueError(
                f"retry.maxBackoff ({self.max_backoff:g}s) is shorter than retry.backoff ({self.backoff:g}s)"
            )
        return self


class Attempt(Contract):
    """One attempt of a trial that is over (``TrialState.attempts``, oldest first)."""

    attempt: int
    #: The adapter that ran it ("" when it never left the dispatcher) and its replica.
    platform: str = ""
    replica: str | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    status: str
    exit_code: int | None = None
    failure: Failure | None = None
    #: Why it ended, for people.
    message: str | None = None
