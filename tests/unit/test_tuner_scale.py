"""The tuner's memory at scale (services/tuner/history.py, trials.py): a built-in tuner told tens of thousands of
trials keeps a bounded history, still knows its best trial, and proposes as before while nothing was forgotten.
Sizes are asserted, not timings (bench/scale_tuner.py measures those)."""

from __future__ import annotations

import random

import optuna

from services.tuner.algorithms import Tuner, tuner
from services.tuner.history import DEFAULT_KEEP_BEST, History
from services.tuner.space import parse_search_space
from services.tuner.trials import Ended, experiment_of

SPACE = parse_search_space(
    {
        "lr": {"_type": "loguniform", "_value": [1e-5, 0.1]},
        "batch": {"_type": "choice", "_value": [16, 32, 64, 128]},
        "dropout": {"_type": "uniform", "_value": [0, 0.5]},
    }
)


def history_of(built: Tuner) -> History:
    storage = built.study._storage
    assert isinstance(storage, History)
    return storage


def resumed(built: Tuner, count: int, seed: int = 0) -> float:
    """``count`` finished trials adopted and told, as a tuner restarted on a large experiment takes them; the best
    final result among them."""
    rng = random.Random(seed)
    best = float("-inf")
    for _ in range(count):
        params = {
            "lr": 10 ** rng.uniform(-5, -1),
            "batch": rng.choice([16, 32, 64, 128]),
            "dropout": rng.uniform(0, 0.5),
        }
        value = rng.random()
        best = max(best, value)
        built.tell(built.adopt(params), value)
    return best


def test_a_tpe_tuner_told_20000_trials_keeps_only_its_bounded_history() -> None:
    built = tuner({"name": "TPE"}, SPACE, seed=0, history=500)
    best = resumed(built, 20_000)
    history = history_of(built)
    assert history.created == 20_000
    assert len(history) <= 500 + DEFAULT_KEEP_BEST
    assert built.best()[1] == best  # the best of all, though most trials are forgotten

    for _ in range(5):  # proposes from the bounded history: what the sampler reads stays the same size
        number, params = built.ask()
        assert number >= 20_000 and 1e-5 <= params["lr"] <= 0.1
        assert len(built.study.get_trials(deepcopy=False)) <= 500 + DEFAULT_KEEP_BEST + 1
        built.tell(number, 0.5)
    assert len(history) <= 500 + DEFAULT_KEEP_BEST


def test_random_and_hyperband_keep_the_default_bound_at_any_size() -> None:
    for name in ("Random", "Hyperband"):
        built = tuner({"name": name}, SPACE, seed=1)
        resumed(built, 3_000)
        assert len(history_of(built)) <= 1000 + DEFAULT_KEEP_BEST
        assert built.ask()[0] == 3_000


def test_below_the_bound_proposals_are_those_of_optunas_own_storage() -> None:
    bounded = tuner({"name": "TPE", "classArgs": {"n_startup_jobs": 5}}, SPACE, seed=3, history=100)
    plain = Tuner(
        optuna.create_study(sampler=optuna.samplers.TPESampler(n_startup_trials=5, seed=3), direction="maximize"), SPACE
    )
    for i in range(60):
        (a_number, a_params), (b_number, b_params) = bounded.ask(), plain.ask()
        assert (a_number, a_params) == (b_number, b_params), i
        value = -abs(a_params["lr"] - 0.01) if i % 7 else None  # some fail
        bounded.tell(a_number, value)
        plain.tell(b_number, value)
    assert bounded.best() == plain.best()


def test_the_best_trials_stay_after_they_leave_the_window() -> None:
    built = tuner({"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}, SPACE, seed=0, history=50)
    first, params = built.ask()
    built.tell(first, -1.0)  # the best, at the start
    resumed(built, 400)  # worse: results in [0, 1)
    assert built.best() == (params, -1.0)
    kept = {t.number for t in built.study.get_trials(deepcopy=False)}
    assert first in kept and len(kept) <= 50 + DEFAULT_KEEP_BEST


def test_pruners_judge_with_the_bounded_history() -> None:
    built = tuner({"name": "Random"}, SPACE, seed=0, history=100, assessor_config={"name": "Medianstop"})
    for i in range(1_000):
        number, _ = built.ask()
        for step in range(3):
            built.report(number, step, 0.8 + 0.0001 * i)
        built.tell(number, 0.8)
    bad, _ = built.ask()
    built.report(bad, 0, 0.1)
    assert built.should_prune(bad)
    assert len(history_of(built)) <= 100 + DEFAULT_KEEP_BEST + 1


def test_a_driver_remembers_ended_trials_by_a_bit_each() -> None:
    ended = Ended()
    for sequence_id in range(0, 100_000, 2):
        ended.add(sequence_id)
    ended.add(0)  # again
    assert ended.count == 50_000 and 99_998 in ended and 99_999 not in ended and 10**9 not in ended
    assert ended.nbytes <= 2 * 100_000 // 8


def test_the_service_reads_a_trials_experiment_without_decoding_it() -> None:
    assert experiment_of(b'{"kind":"trial.state","id":"T1","experimentId":"exp1","sequenceId":3}') == "exp1"
    assert experiment_of(b"not json") is None and experiment_of(b"[1]") is None
