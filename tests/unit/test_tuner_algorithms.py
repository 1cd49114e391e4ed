"""NNI's built-in tuners and assessors on Optuna (services/tuner/algorithms.py): each name builds, proposes
parameters of NNI's shape inside the space, learns from results, and stops the trials NNI would stop."""

from __future__ import annotations

import statistics

import optuna
import pytest

from services.tuner.algorithms import NoMoreTrials, assessor, tuner
from services.tuner.space import SearchSpaceError, grid, parse_search_space

SPACE = parse_search_space(
    {
        "lr": {"_type": "loguniform", "_value": [1e-4, 0.1]},
        "batch": {"_type": "choice", "_value": [16, 32, 64]},
        "layer": {
            "_type": "choice",
            "_value": [
                {"_name": "Empty"},
                {"_name": "Conv", "kernel": {"_type": "randint", "_value": [1, 4]}},
            ],
        },
    }
)
GRID_SPACE = parse_search_space(
    {
        "batch": {"_type": "choice", "_value": [16, 32]},
        "layer": {
            "_type": "choice",
            "_value": [
                {"_name": "Empty"},
                {"_name": "Conv", "kernel": {"_type": "randint", "_value": [1, 4]}},
            ],
        },
    }
)
TUNERS = ["Random", "TPE", "GridSearch", "Anneal", "Evolution", "Hyperband", "BOHB"]


def within_space(params: dict) -> bool:
    layer_ok = params["layer"] in ({"_name": "Empty"}, *({"_name": "Conv", "kernel": k} for k in (1, 2, 3)))
    return (
        set(params) == {"lr", "batch", "layer"}
        and 1e-4 <= params["lr"] <= 0.1
        and params["batch"] in (16, 32, 64)
        and layer_ok
    )


@pytest.mark.parametrize("name", TUNERS)
def test_every_builtin_tuner_builds_by_either_key_and_any_case(name: str) -> None:
    space = GRID_SPACE if name == "GridSearch" else SPACE
    for config in ({"name": name}, {"builtinTunerName": name.upper(), "classArgs": {"optimize_mode": "minimize"}}):
        built = tuner(config, space, seed=0)
        assert isinstance(built.study, optuna.Study)


@pytest.mark.parametrize("name", ["Random", "TPE", "Evolution", "Anneal"])
def test_samplers_propose_nni_shaped_parameters_within_the_space(name: str) -> None:
    built = tuner(
        {"name": name, "classArgs": {"population_size": 4}} if name == "Evolution" else {"name": name}, SPACE, seed=1
    )
    for _ in range(25):  # past TPE's and NSGA-II's start-up, so the model-based proposals are checked too
        number, params = built.ask()
        assert within_space(params), params
        built.tell(number, {"default": params["lr"], "loss": 1.0})
    params, value = built.best()
    assert within_space(params) and value == params["lr"]


def test_grid_search_proposes_every_point_once_then_raises_no_more_trials() -> None:
    built = tuner({"name": "GridSearch"}, GRID_SPACE)
    proposed = []
    for _ in range(len(grid(GRID_SPACE))):
        number, params = built.ask()
        proposed.append(params)
        built.tell(number, 1.0)
    assert proposed == list(grid(GRID_SPACE)) and len(proposed) == 8
    with pytest.raises(NoMoreTrials):
        built.ask()


def test_grid_search_refuses_a_continuous_space_when_built() -> None:
    with pytest.raises(ValueError, match="lr"):
        tuner({"name": "GridSearch"}, SPACE)


def best_of(config: dict, seed: int) -> float:
    """Maximise -(x - 0.3)^2 over uniform [0, 1] in 30 trials."""
    built = tuner(config, parse_search_space({"x": {"_type": "uniform", "_value": [0, 1]}}), seed=seed)
    for _ in range(30):
        number, params = built.ask()
        built.tell(number, -((params["x"] - 0.3) ** 2))
    return built.best()[1]


def test_tpe_beats_random_on_average_on_a_smooth_function() -> None:
    tpe = statistics.mean(
        best_of({"name": "TPE", "classArgs": {"tpe_args": {"n_startup_jobs": 10}}}, s) for s in range(5)
    )
    random = statistics.mean(best_of({"name": "Random"}, s) for s in range(5))
    assert tpe > random


def test_seed_makes_proposals_repeatable() -> None:
    first, second = tuner({"name": "TPE"}, SPACE, seed=7), tuner({"name": "TPE", "classArgs": {"seed": 7}}, SPACE)
    assert [first.ask()[1] for _ in range(5)] == [second.ask()[1] for _ in range(5)]


def test_medianstop_prunes_a_clearly_bad_trial_after_its_warm_up() -> None:
    built = tuner(
        {"name": "TPE"}, SPACE, seed=0, assessor_config={"name": "Medianstop", "classArgs": {"start_step": 3}}
    )
    for good in range(4):
        number, _ = built.ask()
        for step in range(10):
            built.report(number, step, 0.8 + 0.01 * step + 0.001 * good)
            assert not built.should_prune(number)
        built.tell(number, 0.9)

    bad, _ = built.ask()
    verdicts = []
    for step in range(5):
        built.report(bad, step, {"default": 0.1})
        verdicts.append(built.should_prune(bad))
    assert verdicts == [False, False, False, True, True]  # never within start_step, then at once
    built.tell(bad, None)
    assert built.study.trials[bad].state == optuna.trial.TrialState.PRUNED
    assert built.best()[1] == 0.9


def test_assessors_map_to_pruners() -> None:
    assert isinstance(assessor(None), optuna.pruners.NopPruner)
    assert isinstance(assessor({"name": "Medianstop", "classArgs": {"start_step": 2}}), optuna.pruners.MedianPruner)
    assert isinstance(
        assessor({"builtinAssessorName": "curvefitting", "classArgs": {"epoch_num": 20}}),
        optuna.pruners.PercentilePruner,
    )


def test_hyperband_and_bohb_bring_their_own_pruner() -> None:
    for name in ("Hyperband", "BOHB"):
        assert isinstance(tuner({"name": name}, SPACE).study.pruner, optuna.pruners.HyperbandPruner)
        with pytest.raises(ValueError, match="takes no assessor"):
            tuner({"name": name}, SPACE, assessor_config={"name": "Medianstop"})


def test_unknown_names_raise_with_the_known_ones() -> None:
    with pytest.raises(
        ValueError,
        match="unknown tuner 'SMAC'; the known tuners are Random, TPE, GridSearch, Anneal, Evolution, Hyperband, BOHB",
    ):
        tuner({"name": "SMAC"}, SPACE)
    with pytest.raises(ValueError, match="the known assessors are Medianstop, Curvefitting"):
        assessor({"name": "Nope"})


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ({"name": "TPE", "classArgs": {"optimize_mode": "max"}}, "optimize_mode"),
        ({"name": "TPE", "classArgs": {"population_size": 4}}, "does not take classArgs"),
        ({"classArgs": {}}, "needs a name"),
    ],
)
def test_bad_tuner_configs_say_what_is_wrong(config: dict, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        tuner(config, SPACE)


def test_assessor_must_optimize_the_same_way_as_the_tuner() -> None:
    with pytest.raises(ValueError, match="optimize_mode"):
        tuner(
            {"name": "TPE"}, SPACE, assessor_config={"name": "Medianstop", "classArgs": {"optimize_mode": "minimize"}}
        )


# --- adopting trials proposed elsewhere (a restarted tuner's predecessor, a person) ----------------


def test_adopted_trials_count_like_asked_ones() -> None:
    t = tuner({"name": "TPE", "classArgs": {"optimize_mode": "minimize", "seed": 3}}, SPACE)
    first = t.adopt({"lr": 0.001, "batch": 32, "layer": {"_name": "Conv", "kernel": 2}})
    second = t.adopt({"lr": 0.05, "batch": 64, "layer": {"_name": "Empty"}})
    t.report(first, 0, 0.7)
    t.tell(first, 0.5)
    t.tell(second, {"default": 0.9, "loss": 1})
    assert t.best() == ({"lr": 0.001, "batch": 32, "layer": {"_name": "Conv", "kernel": 2}}, 0.5)
    number, params = t.ask()
    assert number == 2 and within_space(params)


def test_a_seeded_tuner_that_adopted_trials_does_not_propose_its_first_points_again() -> None:
    fresh = tuner({"name": "Random", "classArgs": {"seed": 7}}, SPACE)
    first = [fresh.ask()[1] for _ in range(3)]
    resumed = tuner({"name": "Random", "classArgs": {"seed": 7}}, SPACE)
    for params in first:
        resumed.tell(resumed.adopt(params), 1.0)
    assert all(resumed.ask()[1] not in first for _ in range(3))


def test_grid_search_skips_points_it_adopted() -> None:
    t = tuner({"name": "GridSearch"}, GRID_SPACE)
    points = list(grid(GRID_SPACE))
    t.adopt(points[0])
    t.adopt(points[3])
    proposed = []
    with pytest.raises(NoMoreTrials):
        while True:
            proposed.append(t.ask()[1])
    assert proposed == [p for i, p in enumerate(points) if i not in (0, 3)]


def test_adopting_parameters_outside_the_space_changes_nothing() -> None:
    t = tuner({"name": "TPE"}, SPACE)
    with pytest.raises(SearchSpaceError, match="lr"):
        t.adopt({"lr": 5.0, "batch": 32, "layer": {"_name": "Empty"}})
    assert t.study.trials == [] and t.ask()[0] == 0


def _completed(built, count: int, level: float, steps: int) -> None:
    """``count`` trials whose curves rise to about ``level`` over ``steps`` steps, each told its end; judged
    after every report, as the tuner service judges running trials (Hyperband's rungs record only then)."""
    for i in range(count):
        number, _ = built.ask()
        for step in range(1, steps + 1):
            built.report(number, step, level * step / steps + 0.001 * i)
            assert not built.should_prune(number)
        built.tell(number, level + 0.001 * i)


def test_curvefitting_stops_a_curve_in_the_worst_quarter_only_after_start_step() -> None:
    built = tuner(
        {"name": "Random"},
        SPACE,
        seed=0,
        assessor_config={"name": "Curvefitting", "classArgs": {"start_step": 4, "epoch_num": 10}},
    )
    _completed(built, 4, 0.9, 10)
    fair, _ = built.ask()  # a curve as good as the best
    bad, _ = built.ask()
    verdicts = {fair: [], bad: []}
    for step in range(8):
        for number, level in ((fair, 0.95), (bad, 0.2)):
            built.report(number, step, level * (step + 1) / 10)
            verdicts[number].append(built.should_prune(number))
    assert verdicts[fair] == [False] * 8  # as good as the others: runs on
    assert verdicts[bad] == [False] * 4 + [True] * 4  # in the worst quarter, once past start_step


@pytest.mark.parametrize("name", ["Hyperband", "BOHB"])
def test_hyperband_and_bohb_stop_bad_trials_at_a_rung_and_keep_the_best(name: str) -> None:
    args = {"R": 27, "eta": 3} if name == "Hyperband" else {"min_budget": 1, "max_budget": 27, "eta": 3}
    built = tuner({"name": name, "classArgs": args}, SPACE, seed=1)
    _completed(built, 12, 0.9, 27)
    best, _ = built.ask()
    bad = [built.ask()[0] for _ in range(6)]
    stopped: dict[int, int | None] = dict.fromkeys([best, *bad])
    for step in range(1, 28):
        for number in stopped:
            if stopped[number] is None:
                built.report(number, step, (1.9 if number == best else 0.05) * step / 27)
                if built.should_prune(number):
                    stopped[number] = step
    # each trial falls in one of the brackets (by its number); the brackets with early rungs stop the bad
    assert any(stopped[n] is not None and stopped[n] < 27 for n in bad), stopped
    assert stopped[best] is None
