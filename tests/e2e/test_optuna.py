"""Optuna studies run through ``trialbus.optuna.optimize`` on the local platform (docs/optuna.md):
real processes, a real nats-server, Optuna's documented objectives, each study compared with what
``study.optimize`` gives for the same seed."""

from __future__ import annotations

import importlib
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest

from contracts import TrialStatus
from trialbus.client import AsyncClient, Client
from trialbus.optuna import TrialFailed, optimize

OBJECTIVES = textwrap.dedent(
    """
    import optuna


    def quadratic(trial):  # Optuna's quickstart
        x = trial.suggest_float("x", -10, 10)
        return (x - 2) ** 2


    def pruned(trial):  # Optuna's pruning example: report each step, ask the pruner
        x = trial.suggest_float("x", 0, 10)
        for step in range(4):
            trial.report(x + step, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return x


    def conditional(trial):  # a conditional search space
        kind = trial.suggest_categorical("kind", ["linear", "square"])
        if kind == "linear":
            return trial.suggest_float("a", -1, 1)
        b = trial.suggest_int("b", 1, 4)
        trial.set_user_attr("b_squared", b * b)
        return b * b


    def killed_once(trial):  # its first attempt dies mid-run; the retry is the same Optuna trial
        import os, signal
        x = trial.suggest_float("x", -10, 10)
        if os.environ["TRIALBUS_ATTEMPT"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        return (x - 2) ** 2


    def failing(trial):
        trial.suggest_float("x", 0, 1)
        raise ValueError("boom from the objective")
    """
)


@pytest.fixture
def objectives(tmp_path: Path, monkeypatch):
    code = tmp_path / "optuna_code"
    code.mkdir()
    (code / "optuna_objectives.py").write_text(OBJECTIVES)
    monkeypatch.syspath_prepend(str(code))
    sys.modules.pop("optuna_objectives", None)
    yield importlib.import_module("optuna_objectives")
    sys.modules.pop("optuna_objectives", None)


def study(seed: int, pruner: optuna.pruners.BasePruner | None = None) -> optuna.Study:
    return optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), pruner=pruner)


def trials_of(s: optuna.Study) -> list[tuple]:
    return [(t.number, t.params, t.values, t.state, t.user_attrs) for t in s.trials]


def statuses(stack, experiment: str) -> dict[int, TrialStatus]:
    """The study trial number → the Trialbus trial's status."""
    with Client(stack.nats.url) as client:
        return {t.parameters["optuna_trial"]: t.status for t in client.list_trials(experiment)}


def test_the_quickstart_gives_the_study_that_study_optimize_gives(stack, objectives):
    ours, theirs = study(seed=7), study(seed=7)
    experiment = optimize(ours, objectives.quadratic, n_trials=4, client=AsyncClient(stack.nats.url))
    theirs.optimize(objectives.quadratic, n_trials=4)
    assert trials_of(ours) == trials_of(theirs)
    assert set(statuses(stack, experiment).values()) == {TrialStatus.SUCCEEDED}


def test_pruned_trials_end_pruned_in_the_study_and_early_stopped_here(stack, objectives):
    def median() -> optuna.pruners.BasePruner:
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)

    ours, theirs = study(seed=3, pruner=median()), study(seed=3, pruner=median())
    seen = []
    experiment = optimize(
        ours,
        objectives.pruned,
        n_trials=6,
        client=AsyncClient(stack.nats.url),
        callbacks=[lambda s, t: seen.append((t.number, t.state))],
    )
    theirs.optimize(objectives.pruned, n_trials=6)
    assert trials_of(ours) == trials_of(theirs)
    assert [(t.number, t.state) for t in ours.trials] == seen
    pruned = {t.number for t in ours.trials if t.state == optuna.trial.TrialState.PRUNED}
    assert pruned, "the seed prunes some trials"
    here = statuses(stack, experiment)
    assert {n for n, status in here.items() if status == TrialStatus.EARLY_STOPPED} == pruned
    assert {n for n, status in here.items() if status == TrialStatus.SUCCEEDED} == set(range(6)) - pruned


def test_a_conditional_space_asks_the_sampler_branch_by_branch(stack, objectives):
    ours, theirs = study(seed=11), study(seed=11)
    optimize(ours, objectives.conditional, n_trials=5, client=AsyncClient(stack.nats.url))
    theirs.optimize(objectives.conditional, n_trials=5)
    assert trials_of(ours) == trials_of(theirs)
    assert {t.params["kind"] for t in ours.trials} == {"linear", "square"}, "the seed takes both branches"


def test_a_raising_objective_fails_with_its_traceback_in_the_trial_log(stack, objectives):
    caught = study(seed=1)
    experiment = optimize(
        caught, objectives.failing, n_trials=1, catch=(ValueError,), client=AsyncClient(stack.nats.url)
    )
    assert [t.state for t in caught.trials] == [optuna.trial.TrialState.FAIL]
    with Client(stack.nats.url) as client:
        (trial,) = client.list_trials(experiment)
        assert trial.status == TrialStatus.FAILED
        log = client.trial_log(trial.id)
    assert "Traceback (most recent call last)" in log and "ValueError: boom from the objective" in log
    # uncaught, as study.optimize re-raises it
    uncaught = study(seed=1)
    with pytest.raises(TrialFailed, match="builtins.ValueError"):
        optimize(uncaught, objectives.failing, n_trials=3, client=AsyncClient(stack.nats.url))
    assert [t.state for t in uncaught.trials] == [optuna.trial.TrialState.FAIL]


def test_timeout_starts_no_trial_after_it_and_lets_the_running_ones_finish(stack, objectives):
    ours = study(seed=2)
    started = time.monotonic()
    optimize(ours, objectives.quadratic, timeout=2, concurrency=2, client=AsyncClient(stack.nats.url))
    assert len(ours.trials) >= 2 and time.monotonic() - started < 60
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in ours.trials)
    assert all(t.datetime_start is not None for t in ours.trials)


def test_a_trial_killed_mid_run_is_retried_as_the_same_optuna_trial(stack, objectives):
    ours, theirs = study(seed=4), study(seed=4)
    retry = {"retry": {"trial": 1, "backoff": 0}}
    experiment = optimize(ours, objectives.killed_once, n_trials=2, config=retry, client=AsyncClient(stack.nats.url))
    theirs.optimize(objectives.quadratic, n_trials=2)
    # its suggestions replayed, not sampled again: the study is the one study.optimize gives
    assert [(t.params, t.values, t.state) for t in ours.trials] == [
        (t.params, t.values, t.state) for t in theirs.trials
    ]
    with Client(stack.nats.url) as client:
        trials = client.list_trials(experiment)
    assert [(t.status, t.attempt) for t in trials] == [(TrialStatus.SUCCEEDED, 1)] * 2


def test_four_at_once_sample_what_the_seed_gives(stack, objectives):
    ours, theirs = study(seed=5), study(seed=5)
    optimize(ours, objectives.quadratic, n_trials=8, concurrency=4, client=AsyncClient(stack.nats.url))
    theirs.optimize(objectives.quadratic, n_trials=8)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in ours.trials)
    assert all(t.value == (t.params["x"] - 2) ** 2 for t in ours.trials)
    # one draw of the seeded generator per trial, whichever trial asked first
    assert sorted(t.params["x"] for t in ours.trials) == sorted(t.params["x"] for t in theirs.trials)


SLOW = textwrap.dedent(
    """
    import pathlib, time


    def slow(trial):
        x = trial.suggest_float("x", 0, 1)
        pathlib.Path(MARKERS, str(trial.number)).touch()
        time.sleep(120)
        return x
    """
)

DRIVER = textwrap.dedent(
    """
    import sys
    import optuna
    import slow_objective
    from trialbus.client import AsyncClient
    from trialbus.optuna import optimize

    study = optuna.create_study(study_name="s", storage=sys.argv[2])
    optimize(study, slow_objective.slow, n_trials=4, concurrency=2, client=AsyncClient(sys.argv[1]))
    """
)


def test_ctrl_c_stops_the_experiment_and_leaves_no_trial_running(stack, tmp_path: Path):
    import signal
    import subprocess

    from tests.e2e.helpers import wait_until

    code, markers = tmp_path / "slow_code", tmp_path / "markers"
    code.mkdir(), markers.mkdir()
    (code / "slow_objective.py").write_text(f"MARKERS = {str(markers)!r}\n" + SLOW)
    (code / "driver.py").write_text(DRIVER)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    env = {**stack.env(), "PYTHONPATH": str(Path.cwd())}
    driver = subprocess.Popen([sys.executable, "driver.py", stack.nats.url, storage], cwd=code, env=env)
    try:
        wait_until(lambda: len(list(markers.iterdir())) == 2, 60, "two trials running")
        driver.send_signal(signal.SIGINT)
        assert driver.wait(60) != 0
    finally:
        driver.kill()
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    with Client(stack.nats.url) as client:
        (experiment,) = client.list_experiments()
        assert experiment.status.value == "STOPPED"
        wait_until(lambda: all(t.status.terminal for t in client.list_trials(experiment.id)), 30, "trials stopped")
