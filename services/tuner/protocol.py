"""What the driver (:mod:`services.tuner.driver`) asks of a tuner, whatever does the tuning.

Three kinds implement :class:`TunerLike`: NNI's built-in names on Optuna
(:class:`services.tuner.algorithms.Tuner`), a user's NNI ``Tuner``/``Assessor`` classes
(:mod:`services.tuner.nni_classes`), and a user's NNI advisor (:mod:`services.tuner.advisor`).
The types they share live here so that none of them imports another.

Call order, per experiment, all from one driver task (never two calls at once, but for the :meth:`TunerLike.propose`
calls of a tuner with :attr:`TunerLike.proposers`; a class may still run its own calls on several threads, see
``multiThread`` in :mod:`services.tuner.calls`): :meth:`TunerLike.import_data` for the experiment's imported earlier
results (before anything else, and again when more are imported), :meth:`TunerLike.adopt` for the trials already on
the bus, then any mix of :meth:`TunerLike.propose`, :meth:`TunerLike.report`, :meth:`TunerLike.should_prune`,
:meth:`TunerLike.finish` (each trial once) and :meth:`TunerLike.forget`, and :meth:`TunerLike.close` last, once no
call is in progress (or after a grace period, for a call that does not return).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts import TrialStatus
from services.tuner.space import Parameters

__all__ = ["ClassFailed", "Metric", "NoMoreTrials", "ParameterId", "Parameters", "Proposal", "TrialEnd", "TunerLike"]

Metric = float | Mapping[str, Any]
"""A metric as trials report it: a number, or a dict whose ``default`` key is the number NNI tunes on."""

ParameterId = int | str
"""NNI's ``parameter_id``: the tuner's name for one proposal (an int; advisors may use strings)."""

#: The longest message the dispatcher takes for a stopped experiment.
MESSAGE_LIMIT = 1000


class NoMoreTrials(LookupError):
    """The tuner has nothing left to propose (GridSearch walked its grid), as NNI's ``NoMoreTrialError``."""


class ClassFailed(Exception):
    """A user's tuner, assessor or advisor class raised: the experiment stops with :attr:`message`.

    Not a ValueError on purpose: the driver treats a built-in tuner's ValueError as a bad metric and carries on,
    and a user's class that raises must stop the experiment instead.
    """

    def __init__(self, what: str, details: str) -> None:
        super().__init__(f"{what}:\n{details}")
        self.what = what  # "tuner class my_tuner.MyTuner failed in generate_parameters"
        self.details = details  # the traceback from the user's frame down, or a sentence

    def message(self, prefix: str = "", limit: int = MESSAGE_LIMIT) -> str:
        """``prefix`` + what failed + the traceback, within ``limit`` characters: the innermost frames and the
        exception line (where the user's code failed) are kept, outer frames give way first."""
        head = f"{prefix}{self.what}:\n"
        details = self.details
        if len(head) + len(details) > limit:
            keep = details[len(details) - (limit - len(head) - 2) :]
            details = "…\n" + (keep[keep.find("\n") + 1 :] if "\n" in keep else keep)
        return (head + details)[:limit]


@dataclass(frozen=True)
class TrialEnd:
    """How a trial ended, as the driver tells the tuner."""

    trial_id: str
    status: TrialStatus
    #: The FINAL result as the trial reported it (a number or a dict), whatever the status; None without one.
    final: Any = None


@dataclass
class Proposal:
    """What a tuner answers when asked for trials."""

    #: New trials to submit, in order: the tuner's parameter id and the parameters trials receive.
    trials: list[tuple[ParameterId, Parameters]] = field(default_factory=list)
    #: Why the tuner has no more trials (NNI's ``NoMoreTrialError`` / ``NO_MORE_TRIAL_JOBS``); None while it has.
    no_more: str | None = None
    #: True when ``no_more`` means "none now": an NNI advisor may send trials again when others end, so the
    #: experiment closes only once nothing is in flight. False: the experiment closes at once.
    for_now: bool = False
    #: Trials the tuner wants stopped (an advisor's ``KILL_TRIAL_JOB``): they end EARLY_STOPPED.
    kills: list[str] = field(default_factory=list)


class TunerLike(Protocol):
    """One experiment's tuner (and assessor), as the driver calls it. Calls block; the driver runs them off
    its event loop."""

    #: Who stops trials early, as messages name it: "assessor", or "advisor" for an NNI advisor.
    judge: str

    @property
    def proposers(self) -> int:
        """0: :meth:`propose` is called in turn with the other calls. n > 0 (NNI's ``multiThread``): up to n
        ``propose(1)`` calls may run at once, each on a thread of its own, beside the other calls (one at a time):
        a proposal that waits for a result (:meth:`finish`) gets it meanwhile."""
        ...

    def propose(self, count: int) -> Proposal:
        """``count`` (>= 0) more trials are wanted now: the trials to submit (at most ``count`` for a tuner; an
        advisor may also return trials it sent on its own), whether there will be more, and trials to stop."""
        ...

    def adopt(self, params: Parameters, parameter_id: ParameterId | None, *, resumed: bool) -> ParameterId:
        """A trial this tuner did not propose: ``resumed`` when it was on the bus before this tuner started (the
        tuner's own from before a restart, or any earlier one), else one a person submitted meanwhile. Returns
        the id the tuner knows it by from now on.

        :raises ValueError: it cannot be modelled (outside the search space): the trial is then left alone.
        """
        ...

    def import_data(self, data: list[dict[str, Any]]) -> None:
        """Earlier results (``trialbus experiment import``, NNI's ``import_data``): completed trials as
        ``[{"parameter": {...}, "value": <number or {"default": n, ...}>}, ...]``, learnt from as if they had run
        here, before the proposals that follow."""
        ...

    def forget(self, parameter_id: ParameterId) -> None:
        """A proposal that never became a trial (the dispatcher refused it: maxTrialNumber, the experiment
        ended)."""
        ...

    def update_search_space(self, search_space: Mapping[str, Any]) -> None:
        """The experiment's search space changed while it runs (NNI's ``update_search_space``): the next
        proposals come from it.

        :raises ValueError: a space this tuner cannot search (it keeps the one it had).
        """
        ...

    def report(self, parameter_id: ParameterId, step: int, value: Metric, /, *, trial_id: str) -> None:
        """An intermediate result (``nni.report_intermediate_result``), numbered from 0 by the trial."""
        ...

    def should_prune(self, parameter_id: ParameterId, /, *, trial_id: str) -> bool:
        """Whether the assessor would stop the trial now, judged on what :meth:`report` received."""
        ...

    def finish(self, ends: list[tuple[ParameterId, TrialEnd]]) -> None:
        """Trials that ended, each told once, in the order they ended."""
        ...

    def close(self, *, ended: bool, failed: bool = False) -> None:
        """No more calls: ``ended`` when the experiment is over (NNI's ``_on_exit``), ``failed`` when this tuner
        failed (``_on_error``); neither when another tuner replica takes the experiment over."""
        ...
