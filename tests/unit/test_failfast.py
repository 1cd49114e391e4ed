"""The fail-fast guard's decision (services/dispatcher/failfast.py): which first ends stop an
experiment, and which leave it running as NNI would."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from contracts.experiment import ExperimentConfig
from contracts.messages import ERROR_LINE_MAX, TrialEvent, error_line
from contracts.state import ExperimentState, ExperimentStatus, TrialState, TrialStatus
from services.adapters.keeper import outcome_of
from services.dispatcher.failfast import FailFast

MISSING = "ModuleNotFoundError: No module named 'sklearn'"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def ended(n: int, status: TrialStatus = TrialStatus.FAILED, line: str | None = MISSING, exp: str = "e1") -> TrialState:
    return TrialState(
        id=f"t{n}", experiment_id=exp, sequence_id=n, platform="local", submit_time=NOW, status=status, last_error=line
    )


def guard() -> FailFast:
    async def never(experiment_id: str, why: str) -> None:
        raise AssertionError("decide() never stops anything")

    return FailFast(never)


def decisions(trials: list[TrialState], limit: int = 3) -> list[str | None]:
    g = guard()
    return [g.decide(t, limit) for t in trials]


def test_the_first_trials_failing_alike_stop_the_experiment_once_with_the_line_and_the_first_trial():
    said = decisions([ended(n) for n in range(5)])
    assert said[:2] == [None, None]
    assert said[2] is not None and MISSING in said[2] and "trial t0" in said[2] and "failFast: 0" in said[2]
    assert said[3:] == [None, None]  # once: resumed, it runs on


def test_a_success_or_an_early_stop_first_turns_it_off():
    for fine in (TrialStatus.SUCCEEDED, TrialStatus.EARLY_STOPPED):
        assert decisions([ended(0), ended(1, fine, None), *(ended(n) for n in range(2, 8))]) == [None] * 8


def test_different_lines_turn_it_off():
    assert decisions([ended(0), ended(1, line="ValueError: bad lr"), *(ended(n) for n in range(2, 8))]) == [None] * 8


def test_cancels_and_failures_without_a_line_are_not_counted():
    trials = [
        ended(0),
        ended(1, TrialStatus.USER_CANCELED, None),
        ended(2, TrialStatus.FAILED, None),
        ended(3, TrialStatus.SYS_CANCELED, None),
        ended(4),
    ]
    assert decisions(trials) == [None] * 5
    assert decisions([*trials, ended(5)])[-1] is not None  # the third counted end


def test_zero_turns_it_off_and_a_limit_of_one_stops_at_the_first_failure():
    assert decisions([ended(n) for n in range(10)], limit=0) == [None] * 10
    assert decisions([ended(0)], limit=1)[0] is not None


def test_experiments_are_watched_apart():
    g = guard()
    said = [g.decide(ended(n, exp=f"e{n % 2}"), 2) for n in range(4)]
    assert said == [None, None, said[2], said[3]] and all(said[2:])


def test_after_a_restart_an_experiment_past_its_first_ends_is_not_stopped_again():
    g = guard()
    for n in range(3):
        g.load(ended(n), 3)
    assert g.decide(ended(3), 3) is None
    fresh = guard()
    fresh.load(ended(0), 3)  # one end before the restart: two more decide
    assert [fresh.decide(ended(n), 3) for n in (1, 2)][-1] is not None


@pytest.mark.parametrize("failfast, limit", [(None, 3), (False, 0), (True, 3), (0, 0), (5, 5)])
def test_the_setting(failfast, limit):
    config = {"trialCommand": "python3 t.py", "trialConcurrency": 1, "trainingService": {"platform": "local"}}
    if failfast is not None:
        config["failFast"] = failfast
    assert ExperimentConfig.model_validate(config).fail_fast_trials == limit


def test_a_bad_setting_is_refused_with_its_name():
    config = {"trialCommand": "x", "trialConcurrency": 1, "trainingService": {"platform": "local"}, "failFast": -1}
    with pytest.raises(ValueError, match="failFast"):
        ExperimentConfig.model_validate(config)


async def test_ended_stops_a_running_experiment_through_the_stop_it_was_given():
    stopped: list[tuple[str, str]] = []

    async def stop(experiment_id: str, why: str) -> None:
        stopped.append((experiment_id, why))

    g = FailFast(stop)
    config = ExperimentConfig.model_validate(
        {"trialCommand": "x", "trialConcurrency": 2, "trainingService": {"platform": "local"}, "failFast": 2}
    )
    running = ExperimentState(id="e1", config=config, start_time=NOW)
    g.ended(ended(0), running)
    g.ended(ended(1), running)
    await asyncio.sleep(0)
    assert [(e, MISSING in why) for e, why in stopped] == [("e1", True)]
    done = running.model_copy(update={"status": ExperimentStatus.DONE})
    other = FailFast(stop)
    other.ended(ended(0), done)
    other.ended(ended(1), done)  # the last trial of a finished experiment: nothing to stop
    await asyncio.sleep(0)
    assert len(stopped) == 1


def test_the_line_on_the_wire_is_one_bounded_printable_line():
    assert error_line("Traceback…\n  File x\n\x1b[31mKeyError: 'lr'\x1b[0m\n\n") == "KeyError: 'lr'"
    assert error_line("\n  \n") is None and error_line(None) is None
    long = error_line("x" * 1000 + "END")
    assert len(long) == ERROR_LINE_MAX and long.endswith("END") and long.startswith("…")
    event = TrialEvent(experiment_id="e", trial_id="t", status=TrialStatus.FAILED, time=NOW, last_error="a\x07b\nc\td")
    assert TrialEvent.decode(event.encode()).last_error == "c d"


@pytest.mark.parametrize(
    ("state", "last_error"),
    [
        ({"exitCode": 1, "done": True, "endTime": 1.0, "lastError": "boom"}, "boom"),
        (
            {"exitCode": 127, "done": True, "error": "cannot start the trial: [Errno 2]", "lastError": "cannot start"},
            "cannot start",
        ),
        ({"exitCode": 0, "done": True, "lastError": "a warning"}, None),  # succeeded: nothing to explain
        ({"exitCode": 1, "done": True, "lastError": ["not", "a", "line"]}, None),
    ],  # a trial wrote it: checked
)
def test_the_keeper_s_last_stderr_line_goes_with_a_failure_only(state: dict, last_error: str | None):
    assert outcome_of(state, 0).last_error == last_error
