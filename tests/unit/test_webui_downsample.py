"""What the web UI's charts keep of a large experiment (services/webui/finals.py, downsample.py):
checked against the whole data, computed the obvious way."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from services.webui.downsample import Curve, Line
from services.webui.finals import Finals

values = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), values), max_size=400), st.integers(0, 310), st.integers(0, 310))
def test_the_extremes_of_any_run_of_trials_are_those_of_the_data(changes, start, stop):
    finals, data = Finals(), {}
    for sequence, value in changes:  # trials end, and their metrics change, in any order
        finals.set(sequence, value)
        data[sequence] = value
    inside = [(s, v) for s, v in data.items() if v is not None and start <= s < stop]
    low, high = finals.extremes(start, stop)
    if not inside:
        assert (low, high) == (-1, -1)
    else:  # ties: the earlier trial
        assert low == min(inside, key=lambda sv: (sv[1], sv[0]))[0]
        assert high == min(inside, key=lambda sv: (-sv[1], sv[0]))[0]
    assert finals.count == sum(v is not None for v in data.values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=3000), st.integers(4, 200), st.booleans())
def test_the_chart_keeps_at_most_its_points_every_extreme_and_the_true_best(metrics, points, minimize):
    finals = Finals()
    for sequence, value in enumerate(metrics):
        finals.set(sequence, value)
    chart = finals.chart(points, minimize)
    shown = chart["points"]
    assert len(shown) <= max(points, 2) and shown == sorted(shown)
    # each extreme is drawn: at one of the trials that reached it (with ties, whichever)
    assert {min(metrics), max(metrics)} <= {value for _, value in shown}
    assert all(metrics[sequence] == value for sequence, value in shown)
    best = min(metrics) if minimize else max(metrics)
    assert chart["best"][-1][1] == best and chart["count"] == len(metrics)
    if len(metrics) <= points:  # it all fits: every trial is drawn
        assert shown == list(enumerate(metrics))


def point(sequence: int, value: float, attempt: int = 0, kind: str = "PERIODICAL") -> dict:
    return {"type": kind, "attempt": attempt, "sequence": sequence, "value": value, "default": value}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=5000), st.integers(4, 300))
def test_a_long_curve_keeps_at_most_its_limit_the_first_the_last_and_its_extremes(results, limit):
    line = Line(limit)
    for sequence, value in enumerate(results):
        line.add(point(sequence, value))
    kept = line.points()
    assert len(kept) <= limit and [p["sequence"] for p in kept] == sorted({p["sequence"] for p in kept})
    values = [p["value"] for p in kept]
    assert kept[0]["sequence"] == 0 and kept[-1]["sequence"] == len(results) - 1
    assert min(results) in values and max(results) in values
    assert line.count == len(results)


def test_a_curve_draws_each_attempt_apart_and_its_finals():
    curve = Curve(10)
    for sequence in range(100):
        curve.add(point(sequence, math.sin(sequence)))
        curve.add(point(sequence, 1.0, attempt=1))
    curve.add(point(0, 0.5, kind="FINAL"))
    curve.add(point(0, 2.0, attempt=1, kind="FINAL"))
    drawn = curve.points()
    assert curve.cut and sum(p["attempt"] == 0 and p["type"] == "PERIODICAL" for p in drawn) <= 10
    assert [p["value"] for p in drawn if p["type"] == "FINAL"] == [0.5, 2.0]
