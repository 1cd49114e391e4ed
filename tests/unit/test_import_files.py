"""The files ``trialbus experiment import -f`` reads (trialbus/imports.py): nnictl's JSON and CSV, an export of an
earlier experiment as it is, and files that are none of these, refused naming the row."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts import TrialState, TrialStatus
from trialbus import export
from trialbus.imports import read_results


def trial(number: int, params: dict, status: TrialStatus, final: object) -> TrialState:
    return TrialState(
        id=f"t{number}",
        experiment_id="e",
        sequence_id=number,
        status=status,
        parameters=params,
        platform="local",
        submit_time=datetime(2026, 1, 1, tzinfo=UTC),
        final_metric=final,
    )


TRIALS = [
    trial(0, {"lr": 0.1, "layer": "conv"}, TrialStatus.SUCCEEDED, {"default": 0.8, "loss": 0.3}),
    trial(1, {"lr": 0.01, "layer": "pool"}, TrialStatus.FAILED, None),
    trial(2, {"lr": 0.001, "layer": "conv"}, TrialStatus.SUCCEEDED, {"default": 0.9, "loss": 0.2}),
]
EXPECTED = [
    {"parameter": {"lr": 0.1, "layer": "conv"}, "value": {"default": 0.8, "loss": 0.3}},
    {"parameter": {"lr": 0.001, "layer": "conv"}, "value": {"default": 0.9, "loss": 0.2}},
]


@pytest.mark.parametrize("kind", ["json", "csv"])
def test_an_export_of_an_earlier_experiment_imports_as_it_is(tmp_path: Path, kind: str) -> None:
    written = export.records(TRIALS, {})
    path = tmp_path / f"earlier.{kind}"
    path.write_text(export.as_json(written) if kind == "json" else export.as_csv(written))
    assert read_results(path) == (EXPECTED, 1)  # the failed trial is no result


def test_nnictl_json_and_a_csv_with_a_reward_column(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text('[{"parameter": {"x": 1}, "value": 0.5}, {"parameter": {"x": 2}, "value": "0.7"}]')
    assert read_results(tmp_path / "r.json") == (
        [{"parameter": {"x": 1}, "value": 0.5}, {"parameter": {"x": 2}, "value": 0.7}],
        0,
    )
    (tmp_path / "r.csv").write_text('x,opt,reward,trialJobId\n1,,0.5,a\n2,"[1, 2]",0.7,b\n')
    assert read_results(tmp_path / "r.csv") == (
        [{"parameter": {"x": 1}, "value": 0.5}, {"parameter": {"x": 2, "opt": [1, 2]}, "value": 0.7}],
        0,
    )


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("a.json", "", "the file is empty"),
        ("a.json", "{", "not JSON"),
        ("a.json", '[{"parameter": {"x": 1}, "value": 1}, {"value": 2}]', "row 2 has no"),
        ("a.json", '[{"parameter": {"x": 1}, "value": "high"}]', "row 1: the value 'high' is not a number"),
        ("a.csv", "x,loss\n1,2\n", "no metric column"),
        ("a.csv", "reward,x\n1,2\n", "no parameter before reward"),
        ("a.csv", "x,reward\n1,2\n3,\n", "line 3: reward is '', not a number"),
        ("a.csv", "x,reward\n1,2,3\n", "line 2 has more cells"),
        ("a.csv", "x,reward,status\n1,2,FAILED\n", "no results in the file (1 rows of trials that did not succeed)"),
    ],
)
def test_a_file_that_is_no_results_is_refused_saying_where(tmp_path: Path, name: str, text: str, said: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as raised:
        read_results(tmp_path / name)
    assert said in str(raised.value)


def test_a_missing_file_is_said(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        read_results(tmp_path / "nothing.json")
