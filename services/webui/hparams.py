"""The "Hyper-parameters" view: trials as lines across one axis per parameter and the final metric.

NNI's most used view is a parallel-coordinates chart of the trials' parameters against their
final metric, filtered to the top N %. This module answers it for one experiment:

- **Axes** come from the search space (``searchSpace`` in the config) where it has one: a
  ``choice`` is categorical (its values in the space's order), ``loguniform``/``qloguniform``/
  ``lognormal``/``qlognormal`` numeric on a log scale, the other types numeric and linear, each
  numeric axis spanning the space's bounds and the values shown. A nested choice (NNI's nested
  search space: options that are dicts with a ``_name``) becomes an axis ``<key>/_name`` and one
  axis per parameter of its options, ``<key>/<parameter>``; a trial whose branch has no such
  parameter is *absent* on that axis (``None``: the chart draws it at an "absent" place). A
  parameter that no search space names (no space, a customised trial) gets an axis inferred
  from the values shown: numbers numeric (log when all are positive and span 1,000× or more),
  anything else categorical. The final metric is the last axis.
- **Lines**: the trials with a final default metric, ranked by it (``optimize_mode`` aware: the
  best first, ties to the earlier trial), the best ``top`` % of them. At most ``lines`` are sent;
  when the top N % holds more, the lines sent are spread evenly over its ranks, the best
  included, and ``rule`` says so ("showing 2,000 of 20,000 …").

Cost: O(lines · (log n + parameters)) for an experiment of n trials, whatever n is: the ranking
is the web UI's trial index (:mod:`services.common.trial_index`), the count of finals the
overview chart's (:mod:`services.webui.finals`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from contracts.state import TrialState, default_metric
from services.webui.model import MINIMIZE, Model

#: The most lines a browser gets (a chart of more is ink, not information), and the default.
MAX_LINES = 2000
LINES_RANGE = (1, MAX_LINES)
TOP_RANGE = (1, 100)
LOG_TYPES = {"loguniform", "qloguniform", "lognormal", "qlognormal"}
BOUNDED_TYPES = {"uniform", "quniform", "randint", "loguniform", "qloguniform"}
#: An inferred numeric axis is drawn on a log scale when its values are positive and span this much.
LOG_SPAN = 1000.0
METRIC_AXIS = "final metric"


@dataclass
class Axis:
    """One axis: ``numeric`` (``scale`` linear or log, ``low``/``high``) or ``categorical``."""

    name: str
    kind: str  # "numeric" | "categorical"
    scale: str = "linear"  # "linear" | "log" (numeric)
    low: float | None = None
    high: float | None = None
    categories: list[Any] = field(default_factory=list)
    #: orjson of each category → its position (values are compared as JSON: 1 and 1.0 are one)
    _places: dict[bytes, int] = field(default_factory=dict)
    absent: bool = False
    from_space: bool = True

    def category(self, value: Any) -> int:
        key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        if key not in self._places:
            self._places[key] = len(self.categories)
            self.categories.append(value)
        return self._places[key]

    def widen(self, value: float) -> None:
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)

    def view(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "kind": self.kind, "absent": self.absent}
        if self.kind == "numeric":
            body.update(scale=self.scale, low=self.low, high=self.high)
        else:
            body["categories"] = self.categories
        return body


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def space_axes(space: dict[str, Any] | None, prefix: str = "") -> dict[str, Axis]:
    """The axes of a search space (NNI's ``_type``/``_value`` format), nested choices flattened,
    in the space's order: O(size of the space)."""
    axes: dict[str, Axis] = {}
    for key, spec in (space or {}).items():
        if not isinstance(spec, dict) or "_type" not in spec:
            continue
        path, kind, values = f"{prefix}{key}", spec["_type"], spec.get("_value") or []
        if kind == "choice":
            nested = any(isinstance(v, dict) and "_name" in v for v in values)
            name = f"{path}/_name" if nested else path
            axis = axes.setdefault(name, Axis(name, "categorical"))
            for option in values:
                axis.category(option["_name"] if nested and isinstance(option, dict) else option)
                if nested and isinstance(option, dict):
                    inner = {k: v for k, v in option.items() if k != "_name"}
                    for name, found in space_axes(inner, f"{path}/").items():
                        _merge(axes, name, found)
        elif kind in LOG_TYPES or kind in BOUNDED_TYPES or kind in ("normal", "qnormal"):
            axis = axes.setdefault(path, Axis(path, "numeric", "log" if kind in LOG_TYPES else "linear"))
            if kind in BOUNDED_TYPES and len(values) >= 2 and is_number(values[0]) and is_number(values[1]):
                axis.widen(values[0])
                axis.widen(values[1] - 1 if kind == "randint" else values[1])
    return axes


def _merge(axes: dict[str, Axis], name: str, found: Axis) -> None:
    """Two options of a nested choice with a parameter of the same name share its axis."""
    if name not in axes:
        axes[name] = found
    elif axes[name].kind == "categorical" and found.kind == "categorical":
        for value in found.categories:
            axes[name].category(value)
    elif axes[name].kind == "numeric" and found.kind == "numeric":
        for bound in (found.low, found.high):
            if bound is not None:
                axes[name].widen(bound)


def flatten(parameters: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A trial's parameters by axis name: a nested choice's ``{"_name": "adam", "lr": 0.1}`` under
    ``opt`` is ``opt/_name: "adam"`` and ``opt/lr: 0.1``; O(size of the parameters)."""
    flat: dict[str, Any] = {}
    for key, value in parameters.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            if "_name" in value:
                flat[f"{path}/_name"] = value["_name"]
            flat.update(flatten({k: v for k, v in value.items() if k != "_name"}, f"{path}/"))
        else:
            flat[path] = value
    return flat


def infer_axes(axes: dict[str, Axis], flats: list[dict[str, Any]]) -> None:
    """Add an axis for every parameter the space does not name, its kind and scale from the values
    shown: O(lines · parameters)."""
    for flat in flats:
        for name in flat:
            if name not in axes:
                axes[name] = Axis(name, "numeric", from_space=False)
    for axis in axes.values():
        if axis.from_space:
            continue
        values = [f[axis.name] for f in flats if axis.name in f]
        if values and not all(is_number(v) for v in values):
            axis.kind = "categorical"
            for value in sorted(values, key=lambda v: (not is_number(v), v if is_number(v) else str(v))):
                axis.category(value)
        elif values and min(values) > 0 and max(values) / min(values) >= LOG_SPAN:
            axis.scale = "log"


def _ranked_ids(model: Model, experiment_id: str, top: int, lines: int) -> tuple[list[str], int, int]:
    """The ids of the lines to send, best first, how many trials have a final metric, and how many
    of them the top N % holds: O(lines · log n)."""
    finals = model.finals.get(experiment_id)
    index = model.indexes.experiments.get(experiment_id)
    ranked = finals.count if finals is not None else 0
    if index is None or not ranked:
        return [], 0, 0
    in_top = max(1, math.ceil(ranked * top / 100))
    if in_top <= lines:
        return index.window("metric", None, 0, in_top), ranked, in_top
    # Spread over the top N %'s ranks, the best (rank 0) first: one O(log n) lookup each.
    positions = [i * in_top // lines for i in range(lines)]
    return [trial for p in positions for trial in index.window("metric", None, p, 1)], ranked, in_top


def hyper_parameters(model: Model, experiment_id: str, top: int = 100, lines: int = MAX_LINES) -> dict[str, Any]:
    """The view of the module docstring for ``GET /api/experiments/{id}/hyper-parameters``."""
    state = model.experiments.get(experiment_id)
    minimize = state is not None and state.config.optimize_mode == MINIMIZE
    axes = space_axes(state.config.search_space if state is not None else None)
    ids, ranked, in_top = _ranked_ids(model, experiment_id, top, lines)
    trials: dict[str, TrialState] = model.trials_of.get(experiment_id, {})
    chosen = [trials[t] for t in ids if t in trials]
    flats = [flatten(t.parameters) for t in chosen]
    infer_axes(axes, flats)
    shown: list[dict[str, Any]] = []
    for trial, flat in zip(chosen, flats, strict=True):
        values: list[Any] = []
        for axis in axes.values():
            value: Any = flat.get(axis.name)
            if axis.kind == "numeric" and is_number(value) and (axis.scale == "linear" or value > 0):
                axis.widen(value)
                values.append(value)
            elif axis.kind == "categorical" and axis.name in flat:
                values.append(axis.category(value))
            else:
                axis.absent = True
                values.append(None)
        metric = default_metric(trial.final_metric)
        shown.append({"id": trial.id, "sequence": trial.sequence_id, "metric": metric, "values": values})
    metrics: list[float] = [line["metric"] for line in shown if line["metric"] is not None]
    metric_axis = {"name": METRIC_AXIS, "kind": "numeric", "scale": "linear", "absent": False}
    metric_axis.update(low=min(metrics, default=None), high=max(metrics, default=None))
    return {
        "optimizeMode": MINIMIZE if minimize else "maximize",
        "top": top,
        "withMetric": ranked,
        "inTop": in_top,
        "shown": len(shown),
        "rule": rule(top, ranked, in_top, len(shown)),
        "axes": [axis.view() for axis in axes.values()] + [metric_axis],
        "lines": shown,
    }


def rule(top: int, ranked: int, in_top: int, shown: int) -> str:
    """What the chart shows, in words (the page prints it above the chart)."""
    if not ranked:
        return "no trial has a final metric yet"
    which = "every trial with a final metric" if top == 100 else f"the top {top} % by final metric"
    if shown == in_top:
        return f"showing {shown:,} trials: {which} ({ranked:,} have one), the best first"
    return f"showing {shown:,} of {in_top:,} trials ({which}), spread evenly over their ranks, the best first"
