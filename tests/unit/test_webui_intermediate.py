"""The all-curves chart's aggregation: the best trials by latest result, the ranking at a step,
retries, curves cut down with their extremes kept, and bounded step indexes."""

from __future__ import annotations

from services.webui.intermediate import STEP_INDEXES, ExperimentCurves, Intermediates

#: trial → its intermediate results by step: at step 1, A leads; at the end, D does.
CURVES = {
    "A": [0.1, 0.9, 0.3],
    "B": [0.2, 0.5, 0.8],
    "C": [0.3, 0.7, 0.6],
    "D": [0.1, 0.2, 0.95],
}


def fed() -> Intermediates:
    store = Intermediates()
    for trial, values in CURVES.items():
        for step, value in enumerate(values):
            store.add("exp1", trial, 0, step, value)
    return store


def test_the_best_by_latest_result_follow_the_optimize_mode() -> None:
    curves = fed().of("exp1")
    assert curves.best_latest(2, minimize=False) == ["D", "B"]
    assert curves.best_latest(2, minimize=True) == ["A", "C"]
    assert curves.best_latest(10, minimize=False) == ["D", "B", "C", "A"]


def test_the_ranking_at_a_step_differs_from_the_final_one() -> None:
    curves = fed().of("exp1")
    assert curves.ranking(1, 4, minimize=False) == (["A", "C", "B", "D"], 4)
    assert curves.ranking(1, 2, minimize=True) == (["D", "B"], 4)


def test_a_ranked_step_stays_current_as_results_arrive() -> None:
    store = fed()
    curves = store.of("exp1")
    assert curves.ranking(1, 1, minimize=False)[0] == ["A"]
    store.add("exp1", "E", 0, 0, 0.5)
    store.add("exp1", "E", 0, 1, 0.99)
    assert curves.ranking(1, 2, minimize=False) == (["E", "A"], 5)
    assert curves.best_latest(1, minimize=False) == ["E"]


def test_a_retry_replaces_the_earlier_attempt_in_every_ranking() -> None:
    store = fed()
    curves = store.of("exp1")
    curves.ranking(1, 4, minimize=False)
    store.add("exp1", "A", 1, 0, 0.05)  # A's second attempt: one result so far
    assert curves.ranking(1, 4, minimize=False) == (["C", "B", "D"], 3)
    assert curves.best_latest(4, minimize=True)[0] == "A"
    store.add("exp1", "A", 0, 2, 5.0)  # the first attempt's, read late: ignored
    assert curves.traces["A"].latest == 0.05


def test_a_result_that_changes_only_an_earlier_step_keeps_the_latest() -> None:
    curves = ExperimentCurves()
    curves.add("A", 0, 3, 1.0)
    curves.add("A", 0, 1, 7.0)
    assert curves.traces["A"].latest == 1.0
    assert list(curves.latest) == [(1.0, "A")]
    assert curves.traces["A"].points(10) == [(1, 7.0), (3, 1.0)]


def test_a_long_curve_is_cut_down_with_its_extremes_kept() -> None:
    curves = ExperimentCurves()
    for step in range(10_000):
        curves.add("A", 0, step, 1000.0 if step == 4321 else (step % 100) / 100)
    points = curves.traces["A"].points(100)
    assert len(points) <= 100
    assert (4321, 1000.0) in points
    assert points[0][0] == 0 and points[-1][0] == 9999


def test_only_a_bounded_number_of_steps_keep_a_ranking() -> None:
    curves = fed().of("exp1")
    for step in range(STEP_INDEXES + 3):
        curves.ranking(step, 1, minimize=False)
    assert len(curves.steps) == STEP_INDEXES
    assert 0 not in curves.steps, "the least recently asked step went first"


def test_the_chart_draws_the_best_and_adds_the_ranked_trials() -> None:
    body = fed().curves("exp1", minimize=False, limit=2, points=100, step=1, top=2)
    assert [c["trialId"] for c in body["curves"]] == ["D", "B", "A", "C"]
    assert [(r["rank"], r["trialId"], r["value"]) for r in body["ranking"]] == [(1, "A", 0.9), (2, "C", 0.7)]
    assert body["reported"] == 4 and body["rankedOf"] == 4
    assert fed().curves("nosuch", minimize=False, limit=2, points=100, step=None, top=2)["curves"] == []


def test_a_deleted_experiment_s_curves_go_with_it():
    from services.webui.model import Model

    model, intermediates = Model(), Intermediates()
    model.on_deleted.append(intermediates.forget)
    intermediates.add("e1", "t1", 0, 0, 0.5)
    assert "e1" in intermediates.experiments
    model.delete_experiment("e1")
    assert "e1" not in intermediates.experiments
