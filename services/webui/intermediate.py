"""Every trial's intermediate results, kept so that the all-curves chart and its step filter
cost O(shown · log m) per request, not O(metrics of the experiment).

The page's "Intermediate results" chart draws the curves of a bounded set of trials (at most
``limit``, 200 by default: the trials whose latest intermediate result is the best, under the
experiment's ``optimize_mode``), and its step filter ranks the trials by their value at step
``k`` (the ``k``-th intermediate result, numbered from 0 as the trial reports them): which
trials were ahead then.

What is kept, for an experiment whose ``m`` trials reported intermediate results:

- per trial, its latest attempt's results by step (:class:`Trace`, an ``array('d')``: 8 bytes a
  result; an earlier attempt's are dropped when a retry reports), so a curve is exact and the
  value at any step is O(1): memory O(intermediate results), 80 MB for 100,000 trials of 100
  results each;
- per experiment, the trials sorted by their latest value (a ``SortedList``): O(log m) per
  result that arrives, so the best ``n`` by latest value are O(log m + n);
- per experiment, the trials sorted by their value at step ``k`` only for the steps someone
  asked for (at most :data:`STEP_INDEXES` of them, least recently asked dropped first): built
  at the first request for a step (once, O(m log m)), then kept at O(log m) per result at that
  step. A ranking at a step asked before is O(log m + n).

A result costs O(log m + STEP_INDEXES) as it arrives. Pure (no I/O): the METRICS stream feeds
it through :meth:`Intermediates.add` (:mod:`services.webui.intermediate_api`).
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from typing import Any

from sortedcontainers import SortedList

#: At most this many steps have a ranking kept per experiment (the least recently asked goes).
STEP_INDEXES = 8
#: The most points a curve is cut down to, and the default.
MAX_POINTS, DEFAULT_POINTS = 1000, 100
#: The most trials one request may draw, and the default.
MAX_TRIALS, DEFAULT_TRIALS = 500, 200
NAN = math.nan

Ranked = tuple[float, str]  # (value, trial id): ascending; the best first under minimize


class Trace:
    """One trial's latest attempt's intermediate results by step (NaN: no result at that step)."""

    __slots__ = ("attempt", "values")

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.values = array("d")

    @property
    def latest(self) -> float | None:
        """The result at the highest step reported (the array ends there): O(1)."""
        return self.values[-1] if self.values else None

    def at(self, step: int) -> float | None:
        if step >= len(self.values) or math.isnan(value := self.values[step]):
            return None
        return value

    def points(self, limit: int) -> list[tuple[int, float]]:
        """At most ``limit`` (≥ 4) ``[step, value]`` points in step order: every one while they fit,
        else the first, the last and the lowest and highest of each run of steps (extremes kept,
        as :mod:`services.webui.downsample`). O(steps)."""
        values = self.values
        if len(values) <= limit:
            return [(i, v) for i, v in enumerate(values) if not math.isnan(v)]
        width = math.ceil(len(values) / max(1, (limit - 2) // 2))
        kept = {0, len(values) - 1}
        for start in range(0, len(values), width):
            run = [(v, i) for i, v in enumerate(values[start : start + width], start) if not math.isnan(v)]
            if run:
                kept.update((min(run)[1], max(run)[1]))
        return [(i, values[i]) for i in sorted(kept) if not math.isnan(values[i])]


class ExperimentCurves:
    """One experiment's traces and rankings (see the module docstring)."""

    def __init__(self) -> None:
        self.traces: dict[str, Trace] = {}
        self.latest: SortedList[Ranked] = SortedList()
        #: step → the trials with a result at that step, by value; only steps asked for.
        self.steps: OrderedDict[int, SortedList[Ranked]] = OrderedDict()

    def add(self, trial_id: str, attempt: int, step: int, value: float) -> None:
        """One intermediate result: O(log m + STEP_INDEXES), amortised O(1) for the array."""
        trace = self.traces.get(trial_id)
        if trace is not None and attempt < trace.attempt:
            return  # an earlier attempt's result, read late: the curve shows the latest attempt
        if trace is None or attempt > trace.attempt:
            if trace is not None:
                self._unrank(trial_id, trace)
            trace = self.traces[trial_id] = Trace(attempt)
        values = trace.values
        old_latest = trace.latest
        old = values[step] if step < len(values) else NAN
        if step >= len(values):
            values.extend([NAN] * (step + 1 - len(values)))
        values[step] = value
        if old_latest != (new_latest := values[-1]):
            if old_latest is not None:
                self.latest.discard((old_latest, trial_id))
            self.latest.add((new_latest, trial_id))
        if (ranked := self.steps.get(step)) is not None and old != value:
            if not math.isnan(old):
                ranked.discard((old, trial_id))
            ranked.add((value, trial_id))

    def _unrank(self, trial_id: str, trace: Trace) -> None:
        """A retry starts again: its old results leave every ranking, O(STEP_INDEXES · log m)."""
        if (latest := trace.latest) is not None:
            self.latest.discard((latest, trial_id))
        for step, ranked in self.steps.items():
            if (value := trace.at(step)) is not None:
                ranked.discard((value, trial_id))

    def best_latest(self, count: int, minimize: bool) -> list[str]:
        """The ids of the ``count`` trials with the best latest result: O(log m + count)."""
        return _best(self.latest, count, minimize)

    def ranking(self, step: int, count: int, minimize: bool) -> tuple[list[str], int]:
        """The ``count`` best trials at ``step`` and how many reported a result there: O(log m +
        count) for a step asked before, O(m log m) the first time (:data:`STEP_INDEXES` kept)."""
        ranked = self.steps.get(step)
        if ranked is None:
            ranked = SortedList(
                (value, trial_id) for trial_id, trace in self.traces.items() if (value := trace.at(step)) is not None
            )
            self.steps[step] = ranked
            while len(self.steps) > STEP_INDEXES:
                self.steps.popitem(last=False)
        self.steps.move_to_end(step)
        return _best(ranked, count, minimize), len(ranked)


def _best(ranked: SortedList[Ranked], count: int, minimize: bool) -> list[str]:
    """Best first: the lowest values under minimize, the highest otherwise (ties: trial id order)."""
    if minimize:
        return [trial_id for _, trial_id in ranked.islice(0, count)]
    top = list(ranked.islice(max(0, len(ranked) - count), len(ranked)))
    return [trial_id for _, trial_id in sorted(top, key=lambda r: (-r[0], r[1]))]


class Intermediates:
    """Every experiment's :class:`ExperimentCurves`, fed one result at a time."""

    def __init__(self) -> None:
        self.experiments: dict[str, ExperimentCurves] = {}

    def add(self, experiment_id: str, trial_id: str, attempt: int, step: int, value: float) -> None:
        self.experiments.setdefault(experiment_id, ExperimentCurves()).add(trial_id, attempt, step, value)

    def forget(self, experiment_id: str) -> None:
        self.experiments.pop(experiment_id, None)

    def of(self, experiment_id: str) -> ExperimentCurves:
        return self.experiments.get(experiment_id) or ExperimentCurves()

    def curves(
        self, experiment_id: str, minimize: bool, limit: int, points: int, step: int | None, top: int
    ) -> dict[str, Any]:
        """The all-curves chart: the ``limit`` trials with the best latest result, each cut down to
        ``points``; with ``step``, the ``top`` best at that step (ranked, and drawn too, so
        that the chart can highlight them). O((limit + top) · (log m + steps of a curve))."""
        curves = self.of(experiment_id)
        shown = curves.best_latest(limit, minimize)
        body: dict[str, Any] = {
            "reported": len(curves.traces),
            "limit": limit,
            "step": step,
            "ranking": [],
            "rankedOf": 0,
        }
        if step is not None:
            ranked, body["rankedOf"] = curves.ranking(step, top, minimize)
            body["ranking"] = [
                {"rank": i + 1, "trialId": t, "value": curves.traces[t].at(step), "latest": curves.traces[t].latest}
                for i, t in enumerate(ranked)
            ]
            drawn = set(shown)
            shown += [t for t in ranked if t not in drawn]
        body["curves"] = [curve(t, curves.traces[t], points) for t in shown]
        return body


def curve(trial_id: str, trace: Trace, points: int) -> dict[str, Any]:
    """A trial's curve as the browser draws it: O(steps)."""
    return {
        "trialId": trial_id,
        "attempt": trace.attempt,
        "steps": len(trace.values),
        "latest": trace.latest,
        "points": trace.points(points),
    }
