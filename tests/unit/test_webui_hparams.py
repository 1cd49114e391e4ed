"""The web UI's analysis views, aggregated on the server: the hyper-parameters' axes and lines
(top N %, optimize_mode, nested choices, the cap on lines) and the durations' histogram."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus
from services.webui.durations import Durations
from services.webui.hparams import flatten, hyper_parameters, space_axes
from services.webui.model import Model

START = datetime(2026, 1, 1, tzinfo=UTC)
SPACE = {
    "lr": {"_type": "loguniform", "_value": [1e-5, 1e-1]},
    "batch": {"_type": "choice", "_value": [16, 32, 64]},
    "layers": {"_type": "randint", "_value": [1, 5]},
    "optimizer": {
        "_type": "choice",
        "_value": [
            {"_name": "sgd", "momentum": {"_type": "uniform", "_value": [0, 1]}},
            {"_name": "adam", "beta1": {"_type": "uniform", "_value": [0.8, 0.99]}},
            {"_name": "none"},
        ],
    },
}


def model_of(count: int, mode: str = "maximize", space: dict[str, Any] | None = SPACE) -> Model:
    model = Model()
    config: dict[str, Any] = {
        "trialCommand": "true",
        "trialConcurrency": 1,
        "trainingService": {"platform": "local"},
        "tuner": {"name": "TPE", "classArgs": {"optimize_mode": mode}},
    }
    if space is not None:
        config["searchSpace"] = space
    model.put_experiment(ExperimentState(id="e", config=ExperimentConfig.model_validate(config), start_time=START))
    for i in range(count):
        optimizer = [{"_name": "sgd", "momentum": i / count}, {"_name": "adam", "beta1": 0.9}, {"_name": "none"}][i % 3]
        model.put_trial(
            TrialState(
                id=f"t{i}",
                experiment_id="e",
                sequence_id=i,
                platform="local",
                status=TrialStatus.SUCCEEDED if i % 5 else TrialStatus.FAILED,
                parameters={
                    "lr": 10 ** -(1 + i % 4),
                    "batch": [16, 32, 64][i % 3],
                    "layers": 1 + i % 4,
                    "optimizer": optimizer,
                },
                submit_time=START,
                start_time=START,
                end_time=START + timedelta(seconds=i),
                final_metric={"default": (i * 37) % 101} if i % 5 else None,
            )
        )
    return model


def best(count: int, share: int, minimize: bool) -> list[str]:
    ranked = sorted(((i * 37) % 101, i) for i in range(count) if i % 5)
    ranked = ranked if minimize else sorted(ranked, key=lambda p: (-p[0], p[1]))
    keep = -(-len(ranked) * share // 100)
    return [f"t{i}" for _, i in ranked[:keep]]


def test_the_top_20_percent_are_the_best_fifth_of_the_trials_with_a_metric_in_either_mode() -> None:
    for mode in ("maximize", "minimize"):
        view = hyper_parameters(model_of(100, mode), "e", top=20)
        assert [line["id"] for line in view["lines"]] == best(100, 20, mode == "minimize")
        assert view["withMetric"] == 80 and view["inTop"] == 16 and view["shown"] == 16
        assert view["optimizeMode"] == mode
        assert "top 20 %" in view["rule"]


def test_nested_choices_are_flattened_to_axes_with_an_absent_place() -> None:
    view = hyper_parameters(model_of(30), "e")
    names = [axis["name"] for axis in view["axes"]]
    assert names == [
        "lr",
        "batch",
        "layers",
        "optimizer/_name",
        "optimizer/momentum",
        "optimizer/beta1",
        "final metric",
    ]
    axes = {axis["name"]: axis for axis in view["axes"]}
    assert axes["lr"]["scale"] == "log" and (axes["lr"]["low"], axes["lr"]["high"]) == (1e-5, 1e-1)
    assert (axes["layers"]["low"], axes["layers"]["high"]) == (1, 4), "randint's upper bound is excluded"
    assert axes["optimizer/_name"]["categories"] == ["sgd", "adam", "none"]
    assert axes["batch"]["categories"] == [16, 32, 64] and not axes["batch"]["absent"]
    assert axes["optimizer/momentum"]["absent"] and axes["optimizer/beta1"]["absent"]
    line = next(line for line in view["lines"] if line["id"] == "t4")  # adam, batch 32
    assert line["values"][1] == 1 and line["values"][3] == 1
    assert line["values"][4] is None and line["values"][5] == 0.9


def test_without_a_search_space_the_axes_come_from_the_values() -> None:
    view = hyper_parameters(model_of(30, space=None), "e")
    axes = {axis["name"]: axis for axis in view["axes"]}
    assert axes["lr"]["kind"] == "numeric" and axes["lr"]["scale"] == "log", "1e-4 to 0.1 spans 1,000x"
    assert axes["layers"]["scale"] == "linear"
    assert axes["optimizer/_name"]["kind"] == "categorical"
    assert set(axes["optimizer/_name"]["categories"]) == {"sgd", "adam", "none"}


def test_at_most_lines_are_sent_spread_over_the_ranks_the_best_first() -> None:
    view = hyper_parameters(model_of(1000), "e", top=50, lines=100)
    ranked = best(1000, 50, minimize=False)
    assert view["inTop"] == len(ranked) == 400 and view["shown"] == 100
    assert [line["id"] for line in view["lines"]] == ranked[::4]
    assert view["rule"].startswith("showing 100 of 400 trials")


def test_an_experiment_without_finals_shows_no_line() -> None:
    view = hyper_parameters(model_of(0), "e")
    assert view["lines"] == [] and view["rule"] == "no trial has a final metric yet"


def test_flatten_and_space_axes_of_a_deeper_nesting() -> None:
    flat = flatten({"a": {"_name": "x", "b": {"_name": "y", "c": 1}}, "d": 2})
    assert flat == {"a/_name": "x", "a/b/_name": "y", "a/b/c": 1, "d": 2}
    space = {
        "a": {
            "_type": "choice",
            "_value": [
                {
                    "_name": "x",
                    "b": {
                        "_type": "choice",
                        "_value": [{"_name": "y", "c": {"_type": "qloguniform", "_value": [1, 100, 1]}}],
                    },
                }
            ],
        }
    }
    assert list(space_axes(space)) == ["a/_name", "a/b/_name", "a/b/c"]
    assert space_axes(space)["a/b/c"].scale == "log"


def test_durations_histogram_counts_every_ended_trial_once() -> None:
    model = model_of(100)
    histogram = model.durations["e"].histogram(10)
    assert histogram["count"] == 100 and sum(b["count"] for b in histogram["bins"]) == 100
    assert [b["count"] for b in histogram["bins"]] == [10] * 9 + [10]
    assert (histogram["min"], histogram["max"], histogram["median"]) == (0.0, 99.0, 50.0)
    model.delete_trial("t99")
    assert model.durations["e"].histogram(10)["count"] == 99


def test_a_running_trial_has_no_duration_until_it_ends() -> None:
    durations = Durations()
    running = TrialState(
        id="r",
        experiment_id="e",
        sequence_id=0,
        platform="local",
        status=TrialStatus.RUNNING,
        submit_time=START,
        start_time=START,
    )
    durations.set(running)
    assert len(durations) == 0 and durations.histogram(5)["bins"] == []
    durations.set(running.model_copy(update={"status": TrialStatus.SUCCEEDED, "end_time": START + timedelta(1)}))
    durations.set(running.model_copy(update={"status": TrialStatus.SUCCEEDED, "end_time": START + timedelta(2)}))
    assert len(durations) == 1 and durations.histogram(5)["bins"] == [{"from": 172800.0, "to": 172800.0, "count": 1}]
