"""A built-in tuner handed a new search space while it runs (``trialbus update searchspace``, NNI's
``update_search_space``): its next proposals come from the new space; one it cannot search changes nothing."""

from __future__ import annotations

import pytest

from services.tuner.algorithms import NoMoreTrials, tuner
from services.tuner.space import SearchSpaceError, parse_search_space

OLD = {"x": {"_type": "choice", "_value": [1, 2, 3]}}
NEW = {"x": {"_type": "choice", "_value": [2, 100]}, "y": {"_type": "uniform", "_value": [5, 6]}}


@pytest.mark.parametrize("name", ["Random", "TPE", "Anneal"])
def test_a_sampler_proposes_from_the_new_space_after_the_change(name: str) -> None:
    t = tuner({"name": name}, parse_search_space(OLD), seed=1)
    for _ in range(3):
        number, params = t.ask()
        assert params["x"] in (1, 2, 3)
        t.tell(number, float(params["x"]))
    t.update_search_space(NEW)
    for _ in range(10):
        number, params = t.ask()
        assert params["x"] in (2, 100) and 5 <= params["y"] <= 6, params
        t.tell(number, float(params["x"]))


def test_grid_search_walks_the_new_grid_leaving_out_the_points_it_ran() -> None:
    t = tuner({"name": "GridSearch"}, parse_search_space({"x": {"_type": "choice", "_value": [1, 2]}}))
    assert t.ask()[1] == {"x": 1}
    t.update_search_space({"x": {"_type": "choice", "_value": [1, 3, 4]}})
    assert [t.ask()[1] for _ in range(2)] == [{"x": 3}, {"x": 4}]
    with pytest.raises(NoMoreTrials):
        t.ask()


def test_a_space_the_tuner_cannot_search_changes_nothing() -> None:
    t = tuner({"name": "GridSearch"}, parse_search_space(OLD))
    with pytest.raises(SearchSpaceError):
        t.update_search_space({"lr": {"_type": "uniform", "_value": [0, 1]}})  # no grid in a continuum
    assert t.ask()[1] == {"x": 1}
