"""A trial's questions to its tuner, and the answers (``asks.<experiment>.<trial>``, request/reply).

A define-by-run objective (Optuna's ``trial.suggest_*``, ``report``, ``should_prune``) runs in the
trial's process, but its sampler and pruner run in the user's process, next to the study. A trial
has no NATS access: it POSTs an :class:`Ask` to the metrics gateway
(``POST /api/v1/trials/{trialId}/ask``, its per-trial token), which checks it and makes a NATS
request of it on :func:`contracts.subjects.asks`; whoever drives the experiment answers with an
:class:`Answer`, which the gateway hands back as the HTTP answer (docs/optuna.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from contracts.base import Contract

#: What a trial may ask: a suggestion, a report, whether to prune, a user attribute, the trial's
#: state so far (a retried attempt's parameters), or to say it was pruned or failed.
AskOp = Literal["suggest", "report", "should_prune", "set_user_attr", "state", "pruned", "failed"]
#: Longest name (parameter, user attribute) a trial may send.
NAME_CHARS = 1000
#: Largest JSON text a trial may send as a distribution or a value.
VALUE_CHARS = 64 * 1024


class Ask(Contract):
    """One question of a trial; the gateway fills in whose it is from the trial's token."""

    kind: Literal["trial.ask"] = "trial.ask"
    v: Literal[1] = 1
    experiment_id: str
    trial_id: str
    #: The experiment's owner ("" for none), as the trial's ask token binds it: the subject names them.
    owner: str = Field(default="", max_length=32)
    #: The attempt that asks (a retried trial asks again; its answers are replayed).
    attempt: int = Field(default=0, ge=0)
    op: AskOp
    #: The parameter (suggest) or the user attribute (set_user_attr); empty otherwise.
    name: str = Field(default="", max_length=NAME_CHARS)
    #: suggest: the distribution, as ``optuna.distributions.distribution_to_json`` writes it.
    distribution: str = Field(default="", max_length=VALUE_CHARS)
    #: report: the intermediate value; set_user_attr: the attribute's value (JSON);
    #: failed: the exception's type name.
    value: Any = None
    #: report: the step (>= 0).
    step: int | None = Field(default=None, ge=0)


class Answer(Contract):
    """The answer to an :class:`Ask`: ``ok`` with a ``value``, or ``error`` saying why not."""

    kind: Literal["trial.answer"] = "trial.answer"
    v: Literal[1] = 1
    ok: bool
    #: suggest: the value; should_prune: a bool; state: ``{"number", "params", "userAttrs", "distributions"}``.
    value: Any = None
    error: str | None = None
