"""What a Hydra job's return value becomes as a trial's final result, and the JobReturn a launcher makes from a
trial that left none of its own (a remote host, a cancelled trial)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra.core.utils import JobStatus
from omegaconf import OmegaConf

from contracts import TrialStatus
from contracts.state import default_metric
from hydra_plugins.trialbus_launcher.launcher import Job, TrialbusLauncher
from trialbus.hydra_job import as_final, from_final
from trialbus.watcher import TrialOutcome


@pytest.mark.parametrize(
    "value, final, metric",
    [
        (0.5, 0.5, 0.5),
        (3, 3, 3.0),
        ({"default": 0.9, "loss": 0.1}, {"default": 0.9, "loss": 0.1}, 0.9),
        (True, {"returned": True}, None),
        ("done", {"returned": "done"}, None),
        ({"loss": 0.1}, {"returned": {"loss": 0.1}}, None),
        ((1, 2), {"returned": [1, 2]}, None),
        (OmegaConf.create({"a": 1}), {"returned": {"a": 1}}, None),
        (object, {"returned": repr(object)}, None),
        (None, None, None),
    ],
)
def test_a_return_value_as_a_final_result(value, final, metric) -> None:
    assert as_final(value) == final
    assert default_metric(final) == metric


def test_a_final_result_back_as_the_return_value() -> None:
    assert from_final(as_final("done")) == "done"
    assert from_final(as_final({"loss": 0.1})) == {"loss": 0.1}
    assert from_final(as_final(0.5)) == 0.5
    assert from_final(as_final({"default": 1, "x": 2})) == {"default": 1, "x": 2}


def test_nan_is_no_default_metric() -> None:
    assert default_metric(as_final(math.nan)) is None


class _Client:
    def __init__(self, outcome: TrialOutcome) -> None:
        self.outcome = outcome

    def wait_trial(self, trial_id: str, experiment_id: str | None = None) -> TrialOutcome:
        return self.outcome


def _job() -> Job:
    config = OmegaConf.create(
        {"x": 2, "hydra": {"sweep": {"dir": "multirun", "subdir": "0"}, "job": {"name": "train", "num": 0}}}
    )
    return Job(0, ["x=2"], config)


@pytest.mark.parametrize(
    "outcome, status, value",
    [
        (TrialOutcome(TrialStatus.SUCCEEDED, 4, 0, None), JobStatus.COMPLETED, 4),
        (TrialOutcome(TrialStatus.SUCCEEDED, {"returned": "ok"}, 0, None), JobStatus.COMPLETED, "ok"),
        (TrialOutcome(TrialStatus.SUCCEEDED, None, 0, None), JobStatus.COMPLETED, None),
    ],
)
def test_a_job_return_from_a_trial_that_left_none(tmp_path: Path, outcome, status, value) -> None:
    job_return = TrialbusLauncher()._outcome(_Client(outcome), "exp", tmp_path, _job(), "t1")
    assert job_return.status == status and job_return.return_value == value
    assert job_return.overrides == ["x=2"] and job_return.cfg == {"x": 2}
    assert job_return.working_dir == "multirun/0" and job_return.task_name == "train"


def test_a_failed_trial_without_a_job_return_fails_the_job(tmp_path: Path) -> None:
    outcome = TrialOutcome(TrialStatus.USER_CANCELED, None, None, "the experiment was stopped")
    job_return = TrialbusLauncher()._outcome(_Client(outcome), "exp", tmp_path, _job(), "t1")
    assert job_return.status == JobStatus.FAILED
    # (by name: Hydra's plugin discovery, run by another test in this process, may have imported the module anew)
    with pytest.raises(Exception, match="trial t1 ended USER_CANCELED: the experiment was stopped") as raised:
        _ = job_return.return_value
    assert type(raised.value).__name__ == "TrialFailed"
