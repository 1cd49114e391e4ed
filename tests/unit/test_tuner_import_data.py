"""Imported earlier results (``trialbus experiment import``) in the built-in tuners (services/tuner/algorithms.py):
completed trials of the study, counted among TPE's start-up trials; rows the space cannot hold are skipped."""

from __future__ import annotations

import logging

import pytest

from services.tuner import algorithms
from services.tuner.space import parse_search_space

SPACE = parse_search_space({"x": {"_type": "uniform", "_value": [0, 1]}})
XS = [round(i / 20 + 0.025, 3) for i in range(20)]
ROWS = [{"parameter": {"x": x}, "value": -abs(x - 0.9)} for x in XS]


def tpe(seed: int) -> algorithms.Tuner:
    return algorithms.tuner({"name": "TPE", "classArgs": {"optimize_mode": "maximize", "seed": seed}}, SPACE)


@pytest.mark.parametrize("seed", range(5))
def test_tpe_proposes_near_the_best_imported_results_from_its_first_trial(seed: int) -> None:
    tuner = tpe(seed)
    tuner.import_data(ROWS)  # 20 imported: TPE's 20 start-up trials are done
    xs = [params["x"] for _, params in tuner.propose(4).trials]
    assert sum(abs(x - 0.9) for x in xs) / 4 < 0.12, xs
    assert tuner.best() == ({"x": 0.875}, pytest.approx(-0.025))


def test_rows_outside_the_space_or_without_a_number_are_skipped_with_one_warning(caplog) -> None:
    tuner = tpe(0)
    bad = [{"parameter": {"x": 2.0}, "value": 1.0}, {"parameter": {"x": 0.5}, "value": {"loss": 1}}]
    with caplog.at_level(logging.WARNING):
        tuner.import_data([*ROWS[:3], *bad])
    assert len(tuner.study.trials) == 3
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("2 of 5 imported results are not modelled by the tuner: row 4 (")
    assert "row 5 (" in warning


def test_grid_search_does_not_propose_an_imported_point_again() -> None:
    space = parse_search_space({"n": {"_type": "choice", "_value": [1, 2, 3]}})
    grid = algorithms.tuner({"name": "GridSearch"}, space)
    grid.import_data([{"parameter": {"n": 2}, "value": 0.5}])
    proposal = grid.propose(3)
    assert [params for _, params in proposal.trials] == [{"n": 1}, {"n": 3}]
    assert proposal.no_more is not None
