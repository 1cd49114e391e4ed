"""A user's tuner and assessor classes (services/tuner/loading.py, nni_classes.py, choose.py): loaded as NNI loads
them, with a message that says what to fix when they are not there, and called with NNI's calls and arguments.

The classes here are plain Python (as NNI's ``Tuner`` is, they need no nni package): written to a folder that is the
config's ``codeDirectory``.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from contracts import ExperimentConfig, TrialStatus
from services.tuner import loading
from services.tuner.calls import Calls
from services.tuner.checks import check
from services.tuner.choose import for_experiment
from services.tuner.nni_classes import NniAssessor, NniTuner
from services.tuner.protocol import ClassFailed, TrialEnd

RECORDER = textwrap.dedent(
    """
    import threading, time

    class Recorder:
        '''Writes down every call NNI's dispatcher makes, with its arguments.'''

        def __init__(self, calls, pause=0.0, accept_customized=False):
            self.calls, self.pause = calls, pause
            if accept_customized:
                self._accept_customized = True  # what nni.tuner.Tuner._accept_customized_trials() sets

        def update_search_space(self, search_space):
            self.calls.append(("update_search_space", search_space))

        def generate_parameters(self, parameter_id, **kwargs):
            time.sleep(self.pause)
            self.calls.append(("generate_parameters", parameter_id, sorted(kwargs), threading.get_ident()))
            return {"x": parameter_id * 10}

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            self.calls.append(("receive_trial_result", parameter_id, parameters, value, kwargs))

        def trial_end(self, parameter_id, success, **kwargs):
            self.calls.append(("trial_end", parameter_id, success, kwargs))

        def import_data(self, data):
            self.calls.append(("import_data", data))

    class Broken:
        def __init__(self):
            raise RuntimeError("the model file is missing")

    class Refuses:
        def __init__(self, optimize_mode="maximize", seed=None):
            pass
    """
)


@pytest.fixture(autouse=True)
def own_sys_path(monkeypatch) -> None:
    """Loading puts code directories on sys.path, as NNI does: each test's on a copy."""
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "tuners"
    folder.mkdir()
    (folder / "recorder.py").write_text(RECORDER)
    return folder


def config(**fields) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "trialCommand": "python3 trial.py",
            "trialConcurrency": 2,
            "trainingService": {"platform": "local"},
            "searchSpace": {"x": [1, 100]},
            **fields,
        }
    )


def tuner(code: Path, class_name: str = "recorder.Recorder", **args) -> dict:
    return {"className": class_name, "codeDirectory": str(code), "classArgs": args}


# -- loading: what is not there is named, with what to do -------------------------------------------------------


def test_a_missing_code_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tuner.codeDirectory .*nowhere is not a folder.*recorder.py") as caught:
        loading.load(loading.spec(tuner(tmp_path / "nowhere"), "tuner"))
    assert "Recorder" in str(caught.value)


def test_a_missing_module_names_the_file_to_put_in_the_code_directory(code: Path) -> None:
    with pytest.raises(ValueError, match=r"no module my_tunr in codeDirectory .*tuners; it is the file my_tunr.py"):
        loading.load(loading.spec(tuner(code, "my_tunr.Recorder"), "tuner"))


def test_a_missing_class_lists_the_classes_the_module_defines(code: Path) -> None:
    with pytest.raises(ValueError, match=r"recorder.py has no class Recordr; it defines Broken, Recorder, Refuses"):
        loading.load(loading.spec(tuner(code, "recorder.Recordr"), "assessor"))


def test_class_args_the_class_does_not_take_are_named_with_what_it_takes(code: Path) -> None:
    spec = loading.spec(tuner(code, "recorder.Refuses", optimize_mode="minimize", population=8), "tuner")
    with pytest.raises(ValueError) as caught:
        loading.load(spec)
    message = str(caught.value)
    assert "tuner.classArgs" in message and "'population'" in message
    assert "it takes optimize_mode, seed" in message


def test_a_class_name_without_its_module_is_refused_before_anything_is_imported(code: Path) -> None:
    with pytest.raises(ValueError, match=r"tuner.className must be 'module.ClassName'.*'Recorder'"):
        loading.spec({"className": "Recorder", "codeDirectory": str(code)}, "tuner")
    with pytest.raises(ValueError, match=r"advisor.classArgs must be an object"):
        loading.spec({"className": "a.B", "classArgs": [1, 2]}, "advisor")
    with pytest.raises(ValueError, match=r"tuner has both name \(TPE\) and className \(a.B\)"):
        loading.spec({"name": "TPE", "className": "a.B"}, "tuner")


def test_a_constructor_that_raises_gives_the_users_traceback(code: Path) -> None:
    spec = loading.spec(tuner(code, "recorder.Broken"), "tuner")
    with pytest.raises(ClassFailed) as caught:
        loading.construct(spec, loading.load(spec))
    message = caught.value.message("the tuner cannot run: ")
    assert message.startswith("the tuner cannot run: tuner class recorder.Broken failed in __init__:\n")
    assert f'File "{code / "recorder.py"}", line 31, in __init__' in message
    assert message.endswith("RuntimeError: the model file is missing")


def test_a_module_that_fails_to_import_gives_its_traceback(code: Path) -> None:
    (code / "typo.py").write_text("import json\n\nclass T:\n    pass\n\nx = json.loads('{')\n")
    with pytest.raises(ClassFailed) as caught:
        loading.load(loading.spec(tuner(code, "typo.T"), "tuner"))
    assert "failed in the import of typo" in str(caught.value)
    assert f'File "{code / "typo.py"}", line 6' in str(caught.value) and "JSONDecodeError" in str(caught.value)


def test_each_load_reads_its_own_code_directory_as_it_is_now(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    for folder, value in ((first, 1), (second, 2)):
        folder.mkdir()
        (folder / "helper.py").write_text(f"VALUE = {value}\n")
        (folder / "same_name.py").write_text("from helper import VALUE\n\nclass T:\n    value = VALUE\n")
    assert loading.load(loading.spec(tuner(first, "same_name.T"), "tuner")).value == 1
    assert loading.load(loading.spec(tuner(second, "same_name.T"), "tuner")).value == 2  # not the first's modules
    (first / "helper.py").write_text("VALUE = 3\n")  # edited between two experiments
    assert loading.load(loading.spec(tuner(first, "same_name.T"), "tuner")).value == 3
    assert str(first) in sys.path


def test_a_failure_message_fits_the_dispatcher_and_keeps_where_the_users_code_failed() -> None:
    frames = "".join(f'  File "/code/deep.py", line {n}, in f{n}\n    f{n + 1}()\n' for n in range(60))
    failed = ClassFailed(
        "tuner class deep.T failed in generate_parameters",
        f"Traceback (most recent call last):\n{frames}ValueError: at the bottom",
    )
    message = failed.message("the tuner failed: ")
    assert len(message) <= 1000 and message.startswith("the tuner failed: tuner class deep.T failed in")
    assert message.endswith("line 59, in f59\n    f60()\nValueError: at the bottom")


# -- which tuner: classes get the search space as written ---------------------------------------------------------


def test_a_class_gets_its_own_search_space_format_and_a_built_in_name_does_not(code: Path) -> None:
    calls: list = []
    check(config(tuner=tuner(code, calls="unused")))  # what the CLI checks: no {_type, _value} for a class
    driven = for_experiment(config(tuner=tuner(code, calls=calls)))
    try:
        assert isinstance(driven, NniTuner) and calls == [("update_search_space", {"x": [1, 100]})]
    finally:
        driven.close(ended=False)
    with pytest.raises(ValueError, match=r'"x": expected \{"_type": ..., "_value": \[...\]\}, got \[1, 100\]'):
        check(config(tuner={"name": "TPE"}))


def test_a_tuner_class_beside_an_unknown_assessor_name_is_refused_by_the_check(code: Path) -> None:
    with pytest.raises(ValueError, match="unknown assessor 'Mediamstop'; the known assessors are Medianstop, Curve"):
        check(config(tuner=tuner(code, calls=[]), assessor={"name": "Mediamstop"}))


# -- NNI's calls and arguments -------------------------------------------------------------------------------------


def recorder(code: Path, threads: int = 1, **args) -> tuple[NniTuner, list]:
    calls: list = []
    spec = loading.spec(tuner(code, calls=calls, **args), "tuner")
    return NniTuner(loading.construct(spec, loading.load(spec)), {"x": [1, 100]}, Calls(spec.owner, threads)), calls


def test_results_and_ends_reach_the_tuner_as_nni_passes_them(code: Path) -> None:
    driven, calls = recorder(code)
    proposal = driven.propose(3)
    assert proposal.trials == [(0, {"x": 0}), (1, {"x": 10}), (2, {"x": 20})] and proposal.no_more is None
    assert [c[:3] for c in calls[1:]] == [("generate_parameters", i, ["st_callback"]) for i in range(3)]
    by_hand = driven.adopt({"x": 7}, 5, resumed=False)  # a person's trial: customized, not one of the tuner's ids
    before = driven.adopt({"x": 9}, 7, resumed=True)  # on the bus before the tuner started: its id kept
    assert before == 7 and driven.propose(1).trials == [(8, {"x": 80})]  # new ids follow the resumed ones
    del calls[:]
    driven.finish(
        [
            (0, TrialEnd("t0", TrialStatus.SUCCEEDED, 0.5)),
            (1, TrialEnd("t1", TrialStatus.FAILED, {"default": 0.2, "loss": 3})),  # final result, then failed
            (2, TrialEnd("t2", TrialStatus.EARLY_STOPPED)),
            (by_hand, TrialEnd("t3", TrialStatus.SUCCEEDED, 0.7)),
            (before, TrialEnd("t4", TrialStatus.SUCCEEDED, 0.9)),
        ]
    )
    assert calls == [
        ("import_data", [{"parameter": {"x": 9}, "value": 0.9}]),
        ("receive_trial_result", 0, {"x": 0}, 0.5, {"customized": False, "trial_job_id": "t0"}),
        (
            "receive_trial_result",
            1,
            {"x": 10},
            {"default": 0.2, "loss": 3},
            {"customized": False, "trial_job_id": "t1"},
        ),
        ("trial_end", 0, True, {}),
        ("trial_end", 1, False, {}),
        ("trial_end", 2, False, {}),
        ("trial_end", None, True, {}),  # its result is not the tuner's (NNI's rule without _accept_customized)
    ]
    driven.close(ended=True)


def test_a_tuner_that_accepts_customized_trials_gets_their_results_marked_customized(code: Path) -> None:
    driven, calls = recorder(code, accept_customized=True)
    by_hand = driven.adopt({"x": 7}, None, resumed=False)
    driven.finish([(by_hand, TrialEnd("t9", TrialStatus.SUCCEEDED, 0.7))])
    assert calls[1:] == [
        ("receive_trial_result", None, {"x": 7}, 0.7, {"customized": True, "trial_job_id": "t9"}),
        ("trial_end", None, True, {}),
    ]
    assert driven.propose(1).trials == [(0, {"x": 0})]  # the tuner's ids start at 0 all the same
    driven.close(ended=False)


def test_multi_thread_generates_the_trials_wanted_at_once_on_several_threads(code: Path) -> None:
    driven, calls = recorder(code, threads=4, pause=0.2)
    started = time.monotonic()
    proposal = driven.propose(4)
    took = time.monotonic() - started
    generated = [c for c in calls if c[0] == "generate_parameters"]
    assert sorted(c[1] for c in generated) == [0, 1, 2, 3]  # one id each: NNI's manager asks for one at a time
    assert len({c[3] for c in generated}) > 1 and took < 0.6, (took, generated)  # 4 × 0.2 s one after another
    assert sorted(p["x"] for _, p in proposal.trials) == [0, 10, 20, 30]
    single, one_calls = recorder(code, pause=0.05)
    single.propose(3)
    assert len({c[3] for c in one_calls if c[0] == "generate_parameters"}) == 1  # without it: one worker thread
    assert threading.get_ident() not in {c[3] for c in generated}
    driven.close(ended=False)
    single.close(ended=False)


def test_the_user_class_failing_later_names_the_call_and_the_line(code: Path) -> None:
    (code / "late.py").write_text(
        textwrap.dedent(
            """
        class Late:
            def update_search_space(self, search_space):
                pass

            def generate_parameters(self, parameter_id, **kwargs):
                return [1, 2] if parameter_id else {"a": 1}

            def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
                raise KeyError(parameter_id)
        """
        )
    )
    spec = loading.spec(tuner(code, "late.Late"), "tuner")
    driven = NniTuner(loading.construct(spec, loading.load(spec)), {}, Calls(spec.owner))
    assert driven.propose(1).trials == [(0, {"a": 1})]
    with pytest.raises(ClassFailed, match=r"failed in receive_trial_result:\n(.|\n)*late.py\", line 10(.|\n)*KeyError"):
        driven.finish([(0, TrialEnd("t0", TrialStatus.SUCCEEDED, 1.0))])
    with pytest.raises(ClassFailed, match=r"it returned \[1, 2\]; Trialbus trials receive a JSON object"):
        driven.propose(1)
    driven.close(ended=False, failed=True)


class _Judge:
    def __init__(self) -> None:
        self.seen: list = []

    def assess_trial(self, trial_job_id, trial_history):
        self.seen.append((trial_job_id, list(trial_history)))
        return len(trial_history) < 3

    def trial_end(self, trial_job_id, success):
        self.seen.append(("end", trial_job_id, success))


def test_an_assessor_judges_ordered_histories_without_gaps_as_nni_does(code: Path) -> None:
    tuned, _ = recorder(code)
    judge = _Judge()
    driven = NniAssessor(tuned, judge, Calls("assessor class a.Judge"))
    [(number, _)] = driven.propose(1).trials
    driven.report(number, 0, 1.0, trial_id="t0")
    assert not driven.should_prune(number, trial_id="t0")
    driven.report(number, 2, 3.0, trial_id="t0")  # #1 has not arrived: not judged
    assert not driven.should_prune(number, trial_id="t0")
    driven.report(number, 1, 2.0, trial_id="t0")
    assert driven.should_prune(number, trial_id="t0")  # [1, 2, 3]: three results, Bad
    driven.finish([(number, TrialEnd("t0", TrialStatus.EARLY_STOPPED))])
    assert judge.seen == [("t0", [1.0]), ("t0", [1.0, 2.0, 3.0]), ("end", "t0", False)]
    driven.close(ended=True)


def test_imported_results_reach_the_class_as_nni_passes_them(code: Path) -> None:
    driven, calls = recorder(code)
    rows = [{"parameter": {"x": 3}, "value": 0.5}, {"parameter": {"x": 4}, "value": {"default": 0.7, "loss": 1}}]
    driven.import_data(rows)  # the driver's first call, before any proposal (NNI's IMPORT_DATA)
    driven.propose(1)
    assert calls[1] == ("import_data", rows)
    assert calls[2][:2] == ("generate_parameters", 0)  # the tuner's own ids are not used up by the imported
    driven.close(ended=True)
