"""NNI's search space (services/tuner/space.py): parsed with errors a person can act on, sampled with NNI's
semantics with and without Optuna, and enumerated as NNI's GridSearch does."""

from __future__ import annotations

import itertools
import math
import random
import re
import statistics

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.tuner.space import SearchSpaceError, grid, locate, parse_search_space, recall, sample, suggest

LAYER = {
    "_type": "choice",
    "_value": [  # NNI's nested search space example
        {"_name": "Empty"},
        {"_name": "Conv", "kernel_size": {"_type": "choice", "_value": [1, 2, 3, 5]}},
        {"_name": "Max_pool", "pooling_size": {"_type": "choice", "_value": [2, 3, 5]}},
        {"_name": "Avg_pool", "pooling_size": {"_type": "choice", "_value": [2, 3, 5]}},
    ],
}
SUB_PARAMS = {"Empty": set(), "Conv": {"kernel_size"}, "Max_pool": {"pooling_size"}, "Avg_pool": {"pooling_size"}}


def one(type_: str, value: list) -> dict:
    return {"x": {"_type": type_, "_value": value}}


def nni_random(raw: dict, n: int, seed: int = 0) -> list[dict]:
    space, rng = parse_search_space(raw), random.Random(seed)
    return [sample(space, rng) for _ in range(n)]


def through_optuna(raw: dict, n: int, sampler: optuna.samplers.BaseSampler | None = None) -> list[dict]:
    """``n`` trials asked and told (so TPE leaves its 10 random start-up trials); each result checked by recall."""
    space = parse_search_space(raw)
    study = optuna.create_study(sampler=sampler or optuna.samplers.TPESampler(seed=0))
    results = []
    for i in range(n):
        trial = study.ask()
        params = suggest(trial, space)
        assert recall(trial.params, space) == params
        study.tell(trial, float(i % 5))
        results.append(params)
    return results


def both(raw: dict, n: int, seed: int = 0) -> list:
    return [p["x"] for p in nni_random(raw, n, seed) + through_optuna(raw, n)]


def on_grid(v: float, q: float) -> bool:
    return v == round(v / q) * q  # exact: NNI's value is k * q as a float


# --- every type: type, bounds, quantisation --------------------------------------------------------


@st.composite
def uniform_specs(draw) -> tuple[str, list]:
    type_ = draw(st.sampled_from(["uniform", "quniform", "loguniform", "qloguniform"]))
    if "log" in type_:
        low = draw(st.floats(1e-6, 1e3))
        value = [low, low * draw(st.floats(1.01, 1e4))]
    else:
        low = draw(st.one_of(st.integers(-100, 100), st.floats(-1e3, 1e3)))
        value = [low, low + draw(st.one_of(st.integers(1, 100), st.floats(1e-2, 1e3)))]
    if type_.startswith("q"):
        value.append(draw(st.one_of(st.integers(1, 50), st.floats(1e-3, 1e2))))
    return type_, value


@settings(max_examples=25, deadline=None)
@given(uniform_specs(), st.integers(0, 2**32))
def test_uniform_family_stays_in_low_high_and_on_multiples_of_q(spec, seed):
    type_, value = spec
    for v in both(one(type_, value), 12, seed):
        assert type(v) is float
        assert value[0] <= v <= value[1]
        if type_.startswith("q"):  # round(x / q) * q, clipped into [low, high]
            assert v in (value[0], value[1]) or on_grid(v, value[2])


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(["normal", "qnormal", "lognormal", "qlognormal"]),
    st.floats(-5, 5),
    st.floats(0.01, 3),
    st.floats(0.01, 2),
    st.integers(0, 2**32),
)
def test_normal_family_is_quantised_positive_when_log_and_never_clipped(type_, mu, sigma, q, seed):
    value = [mu, sigma, q] if type_.startswith("q") else [mu, sigma]
    for v in both(one(type_, value), 12, seed):
        assert type(v) is float
        if type_.startswith("q"):
            assert on_grid(v, q)
        if "log" in type_:
            assert v >= 0 if type_.startswith("q") else v > 0  # qlognormal rounds small values to 0, as NNI does


@settings(max_examples=25, deadline=None)
@given(st.integers(-1000, 1000), st.integers(1, 50), st.integers(0, 2**32))
def test_randint_is_an_int_from_lower_up_to_but_excluding_upper(lower, width, seed):
    for v in both(one("randint", [lower, lower + width]), 12, seed):
        assert type(v) is int and lower <= v < lower + width


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(JSON.filter(lambda o: not (isinstance(o, dict) and "_name" in o)), min_size=1, max_size=5),
    st.integers(0, 2**32),
)
def test_choice_returns_one_of_the_options_whatever_json_they_are(options, seed):
    for v in both(one("choice", options), 12, seed):
        assert any(v == o and type(v) is type(o) for o in options)


def test_choice_options_are_handed_out_as_copies():
    space = parse_search_space(one("choice", [{"layers": [64, 32]}]))
    sample(space, random.Random(0))["x"]["layers"].append(16)
    assert sample(space, random.Random(0)) == {"x": {"layers": [64, 32]}}


# --- distributions (seeded, so deterministic; bounds wide enough to hold for any seed in practice) -----------


def test_loguniform_is_uniform_in_log_space():
    raw = one("loguniform", [1e-5, 1e-1])
    for values in (
        [p["x"] for p in nni_random(raw, 2001)],
        [p["x"] for p in through_optuna(raw, 401, optuna.samplers.RandomSampler(seed=0))],
    ):
        assert 10**-3.5 < statistics.median(values) < 10**-2.5  # the geometric mean 1e-3; uniform gives 0.05
        assert sum(v < 1e-4 for v in values) / len(values) == pytest.approx(0.25, abs=0.06)  # one decade of four


def test_quniform_ends_get_half_the_mass_of_inner_points_as_in_nni():
    values = [p["x"] for p in nni_random(one("quniform", [0, 3, 1]), 4000)]
    counts = {k: values.count(float(k)) for k in range(4)}
    assert set(values) == {0.0, 1.0, 2.0, 3.0}
    assert 0.4 < counts[0] / counts[1] < 0.6 and 0.4 < counts[3] / counts[2] < 0.6


def test_normal_and_lognormal_draw_nni_prior_with_and_without_optuna():
    nni = [p["x"] for p in nni_random(one("normal", [10, 2]), 2000)]
    assert statistics.mean(nni) == pytest.approx(10, abs=0.2) and statistics.stdev(nni) == pytest.approx(2, rel=0.1)
    # Optuna explores the quantile uniformly: a normal again, truncated at ±6 sigma.
    via = [p["x"] for p in through_optuna(one("normal", [10, 2]), 400, optuna.samplers.RandomSampler(seed=0))]
    assert sum(abs(v - 10) < 2 for v in via) / len(via) == pytest.approx(0.683, abs=0.07)
    assert all(abs(v - 10) <= 12.0001 for v in via)
    logs = [p["x"] for p in nni_random(one("lognormal", [0, 1]), 2001)]
    assert statistics.median(logs) == pytest.approx(1, abs=0.1)  # exp(normal(0, 1)): median exp(0)


def test_randint_reaches_every_integer():
    assert {p["x"] for p in nni_random(one("randint", [-2, 3]), 200)} == {-2, -1, 0, 1, 2}


# --- nested choice -----------------------------------------------------------------------------------------


def assert_nni_shape(params: dict) -> None:
    assert set(params) == {"lr", "layer0"}
    layer = params["layer0"]
    assert set(layer) == {"_name"} | SUB_PARAMS[layer["_name"]]
    if layer["_name"] == "Conv":
        assert layer["kernel_size"] in (1, 2, 3, 5)
    elif layer["_name"] != "Empty":
        assert layer["pooling_size"] in (2, 3, 5)


def test_nested_choice_yields_the_chosen_name_and_only_its_sub_parameters():
    raw = {"lr": {"_type": "uniform", "_value": [0, 1]}, "layer0": LAYER}
    results = nni_random(raw, 200) + through_optuna(raw, 40)
    for params in results:
        assert_nni_shape(params)
    assert {p["layer0"]["_name"] for p in results} == set(SUB_PARAMS)


def test_optuna_sees_one_parameter_per_active_path():
    space = parse_search_space({"layer0": LAYER})
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    told = []
    for _ in range(30):
        trial = study.ask()
        params = suggest(trial, space)
        name = params["layer0"]["_name"]
        expected = {"layer0"} | {f"layer0/{name}/{sub}" for sub in SUB_PARAMS[name]}
        assert set(trial.params) == expected  # pooling_size of Max_pool and Avg_pool stay two parameters
        told.append((float(name == "Conv") + params["layer0"].get("kernel_size", 0), params))
        study.tell(trial, told[-1][0])
    best = max(told, key=lambda t: t[0])
    assert recall(study.best_params, space) == best[1] and best[1]["layer0"]["_name"] == "Conv"


def test_nested_choices_nest():
    inner = {"_type": "choice", "_value": [{"_name": "a", "k": {"_type": "randint", "_value": [0, 2]}}, {"_name": "b"}]}
    outer = {"m": {"_type": "choice", "_value": [{"_name": "deep", "inner": inner}]}}
    for params in nni_random(outer, 20) + through_optuna(outer, 12):
        assert params["m"]["_name"] == "deep"
        assert params["m"]["inner"] in ({"_name": "a", "k": 0}, {"_name": "a", "k": 1}, {"_name": "b"})


# --- grid -------------------------------------------------------------------------------------------------


def test_grid_enumerates_every_combination_last_parameter_fastest():
    space = parse_search_space(
        {
            "a": {"_type": "choice", "_value": [1, "x"]},
            "b": {"_type": "randint", "_value": [0, 2]},
            "c": {"_type": "quniform", "_value": [0.5, 2.5, 1]},
        }
    )
    expected = [dict(zip("abc", combo, strict=True)) for combo in itertools.product([1, "x"], [0, 1], [0.5, 1.0, 2.0])]
    points = grid(space)
    assert list(points) == expected and len(points) == 12
    assert points[-1] == {"a": "x", "b": 1, "c": 2.0} and type(points[0]["c"]) is float
    with pytest.raises(IndexError):
        points[12]


@pytest.mark.parametrize(
    ("type_", "value", "points"),
    [
        ("quniform", [16, 128, 16], [16.0, 32.0, 48.0, 64.0, 80.0, 96.0, 112.0, 128.0]),
        ("quniform", [0.6, 3, 1], [1.0, 2.0, 3.0]),  # 0.6 is never drawn: round(x) is 1 for x in [0.6, 1.5)
        ("qloguniform", [1, 100, 10], [1.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]),
        ("randint", [-1, 2], [-1, 0, 1]),
    ],
)
def test_grid_of_one_parameter(type_, value, points):
    assert [p["x"] for p in grid(parse_search_space(one(type_, value)))] == points


@settings(max_examples=25, deadline=None)
@given(
    uniform_specs().filter(lambda s: s[0].startswith("q") and (s[1][1] - s[1][0]) / s[1][2] < 1e4),
    st.integers(0, 2**32),
)
def test_every_sampled_q_value_is_a_grid_point(spec, seed):
    points = {p["x"] for p in grid(parse_search_space(one(*spec)))}
    assert set(both(one(*spec), 12, seed)) <= points


def test_grid_is_lazy_so_a_tuner_keeps_only_an_index():
    raw = {"seed": {"_type": "randint", "_value": [0, 10**12]}, "x": {"_type": "quniform", "_value": [0, 1, 1e-6]}}
    points = grid(parse_search_space(raw))
    assert len(points) == 10**12 * (10**6 + 1)
    assert points[-1] == {"seed": 10**12 - 1, "x": 1.0} and points[10**6 + 2] == {"seed": 1, "x": 1e-6}


def test_grid_of_a_nested_choice_walks_each_option_with_its_sub_grid():
    points = list(grid(parse_search_space({"layer0": LAYER})))
    assert len(points) == 1 + 4 + 3 + 3
    assert points[:2] == [{"layer0": {"_name": "Empty"}}, {"layer0": {"_name": "Conv", "kernel_size": 1}}]
    assert points[-1] == {"layer0": {"_name": "Avg_pool", "pooling_size": 5}}


@pytest.mark.parametrize(
    ("type_", "value", "why"),
    [
        ("uniform", [0, 1], "continuous"),
        ("loguniform", [1e-3, 1], "continuous"),
        ("normal", [0, 1], "unbounded"),
        ("qnormal", [0, 1, 1], "unbounded"),
        ("lognormal", [0, 1], "unbounded"),
        ("qlognormal", [0, 1, 1], "unbounded"),
    ],
)
def test_grid_refuses_what_it_cannot_enumerate(type_, value, why):
    with pytest.raises(SearchSpaceError) as error:
        grid(parse_search_space({"m": {"_type": "choice", "_value": [{"_name": "a", "x": one(type_, value)["x"]}]}}))
    assert str(error.value) == (
        f'"m/a/x": GridSearch cannot enumerate {type_}: it is {why}; use choice, randint, quniform or qloguniform'
    )


def test_grid_of_an_empty_or_unwalkable_space_is_refused():
    with pytest.raises(SearchSpaceError, match="search space is empty"):
        grid(parse_search_space({}))
    with pytest.raises(SearchSpaceError, match="GridSearch cannot walk 18446744073709551616 points"):
        grid(parse_search_space({"x": one("randint", [0, 2**62])["x"], "y": one("randint", [0, 4])["x"]}))


# --- validation ---------------------------------------------------------------------------------------------


def nested(*options) -> dict:
    return {"model": {"_type": "choice", "_value": list(options)}}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (one("loguniform", [0, 1]), '"x": loguniform needs 0 < low < high, got [0, 1]'),
        (one("qloguniform", [-1, 1, 1]), '"x": qloguniform needs 0 < low < high, got [-1, 1, 1]'),
        (one("uniform", [1, 1]), '"x": uniform needs low < high, got [1, 1]'),
        (one("quniform", [0, 1, 0]), '"x": quniform needs q > 0, got [0, 1, 0]'),
        (one("qnormal", [0, 1, -1]), '"x": qnormal needs q > 0, got [0, 1, -1]'),
        (one("normal", [0, 0]), '"x": normal needs sigma > 0, got [0, 0]'),
        (one("randint", [0.5, 3]), '"x": randint needs integers [lower, upper), got [0.5, 3]'),
        (one("randint", [3, 3]), '"x": randint needs lower < upper (upper is excluded), got [3, 3]'),
        (one("randint", [5]), '"x": randint needs _value [lower, upper], got [5]'),
        (one("uniform", [0, 1, 2]), '"x": uniform needs _value [low, high], got [0, 1, 2]'),
        (one("quniform", [0, 1]), '"x": quniform needs _value [low, high, q], got [0, 1]'),
        (one("lognormal", ["a", 1]), '"x": lognormal needs finite numbers [mu, sigma], got ["a", 1]'),
        (one("uniform", [True, 2]), '"x": uniform needs finite numbers [low, high], got [true, 2]'),
        (one("uniform", [0, math.inf]), '"x": uniform needs finite numbers [low, high], got [0, Infinity]'),
        (
            one("quniform", [0, 1e10, 1e-300]),
            '"x": quniform needs a larger q: values / q overflow a float, got [0, 10000000000.0, 1e-300]',
        ),
        (one("lognormal", [700, 1]), '"x": lognormal needs mu + 6 sigma <= 700 (exp overflows a float), got [700, 1]'),
        (one("uniform", 3), '"x": uniform\'s _value must be a list, got 3'),
        (
            one("gaussian", [0, 1]),
            '"x": unknown _type "gaussian"; NNI\'s types are choice, randint, uniform, quniform, '
            "loguniform, qloguniform, normal, qnormal, lognormal, qlognormal",
        ),
        (one("choice", []), '"x": choice needs at least one option, got []'),
        ({"x": 0.1}, '"x": expected {"_type": ..., "_value": [...]}, got 0.1'),
        ({"x": {"_value": [0, 1]}}, '"x": missing "_type" in {"_value": [0, 1]}'),
        ({"x": {"_type": "uniform"}}, '"x": missing "_value" in {"_type": "uniform"}'),
        ([1, 2], "a search space is a JSON object of parameters, got [1, 2]"),
        (
            nested({"_name": "conv"}, 3),
            '"model": a nested choice needs every option to be an object with "_name"; option 1 is 3',
        ),
        (nested({"_name": "a"}, {"_name": "a"}), '"model": two options are named "a"; "_name" must tell them apart'),
        (nested({"_name": 1}), '"model": option 0\'s "_name" must be a string, got 1'),
        (
            nested({"_name": "conv", "kernel": one("randint", [3, 1])["x"]}),
            '"model/conv/kernel": randint needs lower < upper (upper is excluded), got [3, 1]',
        ),
        (
            nested({"_name": "conv", "kernel": 3}),
            '"model/conv/kernel": expected {"_type": ..., "_value": [...]}, got 3',
        ),
        (
            {"model/a/k": one("uniform", [0, 1])["x"], **nested({"_name": "a", "k": one("uniform", [0, 1])["x"]})},
            '"model/a/k": two parameters have this path (the Optuna parameter name); rename one',
        ),
    ],
)
def test_a_bad_space_is_refused_with_its_path_and_what_is_wrong(raw, message):
    with pytest.raises(SearchSpaceError) as error:
        parse_search_space(raw)
    assert str(error.value) == message


SPEC = st.fixed_dictionaries(
    {
        "_type": st.sampled_from(
            [
                "choice",
                "randint",
                "uniform",
                "quniform",
                "loguniform",
                "qloguniform",
                "normal",
                "qnormal",
                "lognormal",
                "qlognormal",
            ]
        ),
        "_value": st.lists(st.integers(-3, 3) | st.floats(-3, 3) | JSON, max_size=4),
    }
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=3), SPEC | JSON, max_size=3), st.integers(0, 2**32))
def test_any_json_either_parses_and_samples_or_is_refused_with_a_search_space_error(raw, seed):
    try:
        space = parse_search_space(raw)
    except SearchSpaceError:
        return
    assert set(sample(space, random.Random(seed))) == set(raw)


# --- locate: trials the tuner did not propose ----------------------------------------------------

MIXED = {
    "layer": LAYER,
    "lr": {"_type": "loguniform", "_value": [1e-5, 0.1]},
    "units": {"_type": "quniform", "_value": [32, 512, 32]},
    "depth": {"_type": "randint", "_value": [1, 6]},
    "noise": {"_type": "qlognormal", "_value": [0, 1, 0.5]},
    "shift": {"_type": "normal", "_value": [0, 2]},
    "act": {"_type": "choice", "_value": ["relu", {"k": [1, 2]}, None, True]},
}


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32))
def test_locate_gives_the_optuna_trial_that_suggests_the_same_parameters(seed):
    space = parse_search_space(MIXED)
    params = sample(space, random.Random(seed))
    located, distributions = locate(params, space)
    study = optuna.create_study()
    study.enqueue_trial(located)
    trial = study.ask(fixed_distributions=distributions)
    again = suggest(trial, space)
    assert {k: v for k, v in again.items() if k != "shift"} == {k: v for k, v in params.items() if k != "shift"}
    assert again["shift"] == pytest.approx(params["shift"], abs=1e-9)  # the normal's quantile, and back


@pytest.mark.parametrize(
    ("params", "complaint"),
    [
        ({"x": 2.0}, "outside [0, 1]"),
        ({"x": "a"}, "expected a number"),
        ({"y": 0.5}, "do not match the search space's names"),
    ],
)
def test_locate_refuses_parameters_outside_the_space(params, complaint):
    with pytest.raises(SearchSpaceError, match=re.escape(complaint)):
        locate(params, parse_search_space(one("uniform", [0, 1])))


def test_locate_tells_choice_options_apart_by_json_value():
    space = parse_search_space(one("choice", [1, True, "1"]))
    assert [locate({"x": v}, space)[0]["x"] for v in (1, True, "1")] == [0, 1, 2]
    with pytest.raises(SearchSpaceError, match="not one of the options"):
        locate({"x": 2}, space)
    with pytest.raises(SearchSpaceError, match="none of the options"):
        locate({"layer": {"_name": "Dense"}}, parse_search_space({"layer": LAYER}))
