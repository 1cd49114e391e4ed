"""A user's own tuner, assessor and advisor classes run as NNI runs them: their search space as written, NNI's calls
and arguments, v1 configs with ``classFileName`` and ``multiThread``, and a failing class stopping its experiment
with its traceback.

The stack runs as processes on a real nats-server; the tuner service alone finds the real nni package (the
classes derive from NNI's), the trials use the keeper's nni shim as in the rest of the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import wait_until
from tests.fixtures.nni import nni_tuner_stack
from tests.fixtures.stack import Stack
from trialbus.client import Client

TRIALBUS = str(Path(sys.executable).parent / "trialbus")

# A trial as NNI's examples write one: x from the tuner, intermediate results x·1, x·2…, the final result x;
# "mode" makes it fail (after its final result, or without one); "fail-first" reports x and fails on its first
# attempt, then reports 10·x and succeeds on the next.
TRIAL = textwrap.dedent(
    """
    import os, sys, time
    import nni

    params = nni.get_next_parameter()
    x = params["x"]
    if params.get("mode") == "fail-first":
        retried = os.environ["TRIALBUS_ATTEMPT"] != "0"
        nni.report_final_result(10 * x if retried else x)
        sys.exit(0 if retried else 1)
    for step in range(params.get("steps", 0)):
        nni.report_intermediate_result(x * (step + 1))
        time.sleep(0.3)
    if params.get("mode") != "fail":
        nni.report_final_result(x)
    sys.exit(1 if params.get("mode") in ("fail", "final-then-fail") else 0)
    """
)

# Every class writes what it is called with to its journal, one JSON list a line.
NOTE = textwrap.dedent(
    """
    import json, threading

    _lock = threading.Lock()

    def note(journal, *entry):
        with _lock, open(journal, "a") as out:
            out.write(json.dumps(entry) + "\\n")
    """
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    """One stack for the module (each test its own experiment); the tuner service with the real nni package
    on its path."""
    with nni_tuner_stack(tmp_path_factory.mktemp("custom-tuners")) as stack:
        yield stack


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An experiment folder: trial.py, and tuners/ with the journal helper."""
    root = tmp_path / "experiment"
    (root / "tuners").mkdir(parents=True)
    (root / "trial.py").write_text(TRIAL)
    (root / "tuners" / "note.py").write_text(NOTE)
    return root


def journal(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_cli(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}
    return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def finished(client: Client, experiment_id: str, timeout: float = 90):
    return wait_until(
        lambda: (e := client.get_experiment(experiment_id)).status.value != "RUNNING" and e,
        timeout,
        f"experiment {experiment_id} to end",
    )


def v2(folder: Path, tuner: dict, **fields) -> dict:
    return {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(folder),
        "trialConcurrency": 1,
        "tuner": tuner,
        "trainingService": {"platform": "local"},
        **fields,
    }


RANGE_TUNER = textwrap.dedent(
    """
    import random
    from nni.tuner import Tuner
    from note import note

    class RangeTuner(Tuner):
        '''Its own search-space format: {"name": [low, high]}, integers.'''

        def __init__(self, journal, seed=0):
            self.journal, self.rng = journal, random.Random(seed)

        def update_search_space(self, search_space):
            note(self.journal, "space", search_space)
            self.space = search_space

        def generate_parameters(self, parameter_id, **kwargs):
            return {name: self.rng.randint(low, high) for name, (low, high) in self.space.items()}

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            note(self.journal, "result", parameters["x"], value)
    """
)


def test_a_custom_tuner_gets_its_own_search_space_format(stack: Stack, folder: Path) -> None:
    (folder / "tuners" / "range_tuner.py").write_text(RANGE_TUNER)
    notes = folder / "journal.jsonl"
    config = v2(
        folder,
        {"className": "range_tuner.RangeTuner", "codeDirectory": "tuners", "classArgs": {"journal": str(notes)}},
        searchSpace={"x": [1, 100]},
        trialConcurrency=2,
        maxTrialNumber=4,
    )
    config["trialCodeDirectory"] = "."
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    done = run_cli(stack, "experiment", "run", "-f", str(folder / "config.yml"))  # the CLI checks it first
    assert done.returncode == 0, done.stdout + done.stderr + stack.logs()
    with Client(stack.nats.url) as client:
        experiment = client.list_experiments()[0]  # the newest: the one just run (the stack is shared)
        trials = client.list_trials(experiment.id)
    assert experiment.status.value == "DONE" and len(trials) == 4
    assert all(t.status.value == "SUCCEEDED" and 1 <= t.parameters["x"] <= 100 for t in trials)
    assert all(t.final_metric == t.parameters["x"] for t in trials)  # the tuner's parameters reached the trials
    calls = wait_until(lambda: len(c := journal(notes)) == 5 and c, 10, "the last result told")
    assert calls[0] == ["space", {"x": [1, 100]}]  # as written, not NNI's {_type, _value}
    assert sorted(n[1:] for n in calls[1:]) == sorted([t.parameters["x"]] * 2 for t in trials)


LIST_TUNER = textwrap.dedent(
    """
    import nni
    from nni.tuner import Tuner
    from note import note

    class ListTuner(Tuner):
        '''Proposes the parameters it is given, in order; writes down what NNI's dispatcher calls it with.'''

        def __init__(self, trials, journal, accept_customized=False):
            self.trials, self.journal = trials, journal
            if accept_customized:
                self._accept_customized_trials()

        def update_search_space(self, search_space):
            note(self.journal, "update_search_space", search_space)

        def generate_parameters(self, parameter_id, **kwargs):
            note(self.journal, "generate_parameters", parameter_id, sorted(kwargs))
            if parameter_id >= len(self.trials):
                raise nni.NoMoreTrialError("the list is walked")
            return self.trials[parameter_id]

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            note(self.journal, "receive_trial_result", parameter_id, parameters, value, kwargs)

        def trial_end(self, parameter_id, success, **kwargs):
            note(self.journal, "trial_end", parameter_id, success, kwargs)

        def _on_exit(self):
            note(self.journal, "_on_exit")
    """
)


def test_a_v1_config_with_class_file_name_runs_to_its_end(stack: Stack, folder: Path) -> None:
    (folder / "tuners" / "list_tuner.py").write_text(LIST_TUNER)
    (folder / "search_space.json").write_text(json.dumps({"x": {"_type": "choice", "_value": [1, 2, 3]}}))
    notes = folder / "journal.jsonl"
    legacy = {
        "authorName": "default",
        "experimentName": "v1-class",
        "trialConcurrency": 1,
        "maxExecDuration": "1h",
        "maxTrialNum": 5,
        "trainingServicePlatform": "local",
        "searchSpacePath": "search_space.json",
        "useAnnotation": False,
        "tuner": {
            "codeDir": "tuners",
            "classFileName": "list_tuner.py",
            "className": "ListTuner",
            "classArgs": {"trials": [{"x": 3}, {"x": 1}, {"x": 2}], "journal": str(notes)},
        },
        "trial": {"command": f"{sys.executable} trial.py", "codeDir": ".", "gpuNum": 0},
    }
    (folder / "config_v1.yml").write_text(yaml.safe_dump(legacy))
    done = run_cli(stack, "experiment", "run", "-f", str(folder / "config_v1.yml"))
    assert done.returncode == 0, done.stdout + done.stderr + stack.logs()
    with Client(stack.nats.url) as client:
        experiment = client.list_experiments()[0]  # the newest: the one just run (the stack is shared)
        trials = client.list_trials(experiment.id)
    assert experiment.status.value == "DONE"  # the list walked: DONE with 3 trials, not maxTrialNum's 5
    assert experiment.config.tuner == {
        "className": "list_tuner.ListTuner",
        "codeDirectory": str(folder / "tuners"),
        "classArgs": legacy["tuner"]["classArgs"],
    }
    assert [(t.parameter_id, t.parameters, t.status.value) for t in sorted(trials, key=lambda t: t.sequence_id)] == [
        (0, {"x": 3}, "SUCCEEDED"),
        (1, {"x": 1}, "SUCCEEDED"),
        (2, {"x": 2}, "SUCCEEDED"),
    ]
    wait_until(lambda: ["_on_exit"] in journal(notes), 10, "the tuner's _on_exit")
    assert journal(notes)[0] == ["update_search_space", {"x": {"_type": "choice", "_value": [1, 2, 3]}}]


def test_results_and_ends_reach_the_tuner_in_nni_order_with_nni_arguments(stack: Stack, folder: Path) -> None:
    (folder / "tuners" / "list_tuner.py").write_text(LIST_TUNER)
    notes = folder / "journal.jsonl"
    planned = [{"x": 5, "steps": 2}, {"x": 6, "mode": "final-then-fail"}, {"x": 7, "mode": "fail"}]
    config = v2(
        folder,
        {
            "className": "list_tuner.ListTuner",
            "codeDirectory": str(folder / "tuners"),
            "classArgs": {"trials": planned, "journal": str(notes), "accept_customized": True},
        },
        searchSpace={"x": "the tuner's own"},
    )
    with Client(stack.nats.url) as client:
        experiment_id = client.create_experiment(config)
        wait_until(lambda: client.list_trials(experiment_id), 20, "the tuner's first trial")
        by_hand = client.submit_trial(experiment_id, {"x": 9})  # a person's trial: NNI's customized trial
        assert finished(client, experiment_id).status.value == "DONE"
        trials = {t.parameters["x"]: t for t in client.list_trials(experiment_id)}
    wait_until(lambda: ["_on_exit"] in journal(notes), 10, "the tuner's _on_exit")
    assert {x: t.status.value for x, t in trials.items()} == {5: "SUCCEEDED", 6: "FAILED", 7: "FAILED", 9: "SUCCEEDED"}
    calls = [n for n in journal(notes) if n[0] != "generate_parameters"]
    generated = [n for n in journal(notes) if n[0] == "generate_parameters"]
    assert [n[1] for n in generated] == [0, 1, 2, 3]  # 3: NoMoreTrialError, and the experiment ends
    assert all(n[2] == ["st_callback"] for n in generated)  # NNI's dispatcher passes its send-trial callback
    expected = {
        0: [
            ["receive_trial_result", 0, planned[0], 5, {"customized": False, "trial_job_id": trials[5].id}],
            ["trial_end", 0, True, {}],
        ],
        1: [
            ["receive_trial_result", 1, planned[1], 6, {"customized": False, "trial_job_id": trials[6].id}],
            ["trial_end", 1, False, {}],
        ],  # a final result, then a failure: both, as NNI
        2: [["trial_end", 2, False, {}]],  # no final result: only its end
        None: [
            ["receive_trial_result", None, {"x": 9}, 9, {"customized": True, "trial_job_id": by_hand.id}],
            ["trial_end", None, True, {}],
        ],  # NNI's customized trial: no parameter id, marked customized
    }
    assert calls[0] == ["update_search_space", {"x": "the tuner's own"}]
    assert {k: [n for n in calls if len(n) > 1 and n[1] == k] for k in expected} == expected
    assert calls[-1] == ["_on_exit"]


def test_a_retried_trial_reaches_the_tuner_once_with_its_last_attempt_s_result(stack: Stack, folder: Path) -> None:
    # Given a trial that reports 5 and fails on its first attempt, in an experiment that retries the trial's own
    # failures once, then reports 50 and succeeds
    (folder / "tuners" / "list_tuner.py").write_text(LIST_TUNER)
    notes = folder / "journal.jsonl"
    planned = [{"x": 5, "mode": "fail-first"}]
    config = v2(
        folder,
        {
            "className": "list_tuner.ListTuner",
            "codeDirectory": str(folder / "tuners"),
            "classArgs": {"trials": planned, "journal": str(notes)},
        },
        searchSpace={"x": "the tuner's own"},
        retry={"trial": 1, "backoff": "0s"},
    )
    with Client(stack.nats.url) as client:
        experiment_id = client.create_experiment(config)
        assert finished(client, experiment_id).status.value == "DONE"
        [trial] = client.list_trials(experiment_id)
    wait_until(lambda: ["_on_exit"] in journal(notes), 10, "the tuner's _on_exit")
    # Then the tuner heard of it once: the result and the end of the attempt that finished
    assert (trial.status.value, trial.attempt, trial.final_metric) == ("SUCCEEDED", 1, 50)
    told = [n for n in journal(notes) if n[0] in ("receive_trial_result", "trial_end")]
    assert told == [
        ["receive_trial_result", 0, planned[0], 50, {"customized": False, "trial_job_id": trial.id}],
        ["trial_end", 0, True, {}],
    ]


THREADED_TUNER = textwrap.dedent(
    """
    import threading, time
    from nni.tuner import Tuner
    from note import note

    class ThreadedTuner(Tuner):
        '''Slow to propose (0.3 s each); writes down the thread of each generate_parameters call.'''

        def __init__(self, journal):
            self.journal = journal

        def update_search_space(self, search_space):
            pass

        def generate_parameters(self, parameter_id, **kwargs):
            start = time.monotonic()
            time.sleep(0.3)
            note(self.journal, parameter_id, threading.get_ident(), start, time.monotonic())
            return {"x": parameter_id + 1}

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            pass
    """
)


def test_multi_thread_calls_the_tuner_from_several_threads_at_once(stack: Stack, folder: Path) -> None:
    from trialbus import Experiment

    (folder / "tuners" / "threaded_tuner.py").write_text(THREADED_TUNER)
    (folder / "search_space.json").write_text(json.dumps({"x": {"_type": "randint", "_value": [1, 100]}}))
    notes = folder / "journal.jsonl"
    legacy = {
        "trialConcurrency": 3,
        "maxTrialNum": 6,
        "trainingServicePlatform": "local",
        "multiThread": True,
        "searchSpacePath": "search_space.json",
        "tuner": {
            "codeDir": "tuners",
            "classFileName": "threaded_tuner.py",
            "className": "ThreadedTuner",
            "classArgs": {"journal": str(notes)},
        },
        "trial": {"command": f"{sys.executable} trial.py", "codeDir": "."},
    }
    (folder / "config_v1.yml").write_text(yaml.safe_dump(legacy))
    with Experiment(folder / "config_v1.yml", nats_url=stack.nats.url) as experiment:
        assert experiment.config.multi_thread is True
        assert experiment.run() is True
        trials = experiment.list_trial_jobs()
    calls = journal(notes)
    assert len({thread for _, thread, _, _ in calls}) > 1, calls  # more than one thread called it
    first = sorted(calls, key=lambda c: c[2])[:3]  # the three asked for at the start, at once
    assert max(start for _, _, start, _ in first) < min(end for _, _, _, end in first), first  # they overlapped
    assert len(trials) == 6 and all(t.status.value == "SUCCEEDED" for t in trials)
    assert sorted(t.parameters["x"] for t in trials) == [1, 2, 3, 4, 5, 6]  # distinct parameters, distinct ids
    assert sorted(t.parameter_id for t in trials) == sorted(c[0] for c in calls) == list(range(6))


FLOOR_ASSESSOR = textwrap.dedent(
    """
    from nni.assessor import Assessor, AssessResult
    from note import note

    class FloorAssessor(Assessor):
        '''Stops a trial whose second result is under the floor.'''

        def __init__(self, floor, journal):
            self.floor, self.journal = floor, journal

        def assess_trial(self, trial_job_id, trial_history):
            note(self.journal, "assess_trial", trial_job_id, trial_history)
            return AssessResult.Bad if len(trial_history) >= 2 and trial_history[-1] < self.floor else AssessResult.Good

        def trial_end(self, trial_job_id, success):
            note(self.journal, "trial_end", trial_job_id, success)
    """
)


def test_an_assessor_class_of_the_users_early_stops_a_trial_and_hears_of_its_end(stack: Stack, folder: Path) -> None:
    (folder / "tuners" / "floor_assessor.py").write_text(FLOOR_ASSESSOR)
    notes = folder / "journal.jsonl"
    config = v2(
        folder,
        {"name": "GridSearch"},  # a built-in tuner beside the user's assessor
        searchSpace={"x": {"_type": "choice", "_value": [4, 0.1]}, "steps": {"_type": "choice", "_value": [6]}},
        assessor={
            "className": "floor_assessor.FloorAssessor",
            "codeDirectory": str(folder / "tuners"),
            "classArgs": {"floor": 1, "journal": str(notes)},
        },
    )
    with Client(stack.nats.url) as client:
        experiment_id = client.create_experiment(config)
        assert finished(client, experiment_id).status.value == "DONE"
        trials = {t.parameters["x"]: t for t in client.list_trials(experiment_id)}
    good, bad = trials[4], trials[0.1]
    assert good.status.value == "SUCCEEDED"
    assert bad.status.value == "EARLY_STOPPED" and "assessor" in bad.message, bad
    calls = journal(notes)
    histories = [n[2] for n in calls if n[0] == "assess_trial" and n[1] == good.id]
    assert histories[-1] == [4, 8, 12, 16, 20, 24]  # the results so far, in order, as NNI hands them
    assert all(h == [4 * (i + 1) for i in range(len(h))] for h in histories), histories
    assert [len(h) for h in histories] == sorted({len(h) for h in histories})  # one judgement per new result
    assert calls[-2] == ["assess_trial", bad.id, [0.1, 0.2]]  # Bad: stopped, not judged again
    assert [n for n in calls if n[0] == "trial_end"] == [["trial_end", good.id, True], ["trial_end", bad.id, False]]


BAD_TUNER = textwrap.dedent(
    """
    from nni.tuner import Tuner
    from note import note

    class BadTuner(Tuner):
        def __init__(self, journal, broken=False):
            self.journal = journal
            if broken:
                raise FileNotFoundError("model.pt")

        def update_search_space(self, search_space):
            pass

        def generate_parameters(self, parameter_id, **kwargs):
            if parameter_id == 1:
                raise RuntimeError("no idea what to try next")
            return {"x": 1}

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            pass

        def _on_error(self):
            note(self.journal, "_on_error")
    """
)


def test_a_tuner_class_that_raises_stops_its_experiment_with_the_traceback(stack: Stack, folder: Path) -> None:
    (folder / "tuners" / "bad_tuner.py").write_text(BAD_TUNER)
    notes, source = folder / "journal.jsonl", folder / "tuners" / "bad_tuner.py"
    tuner = {
        "className": "bad_tuner.BadTuner",
        "codeDirectory": str(folder / "tuners"),
        "classArgs": {"journal": str(notes)},
    }
    with Client(stack.nats.url) as client:
        later = client.create_experiment(v2(folder, tuner, searchSpace={}))
        stopped = finished(client, later)
        assert stopped.status.value == "STOPPED"
        assert stopped.message.startswith(
            "the tuner failed: tuner class bad_tuner.BadTuner failed in generate_parameters:\nTraceback"
        )
        assert f'File "{source}", line 16, in generate_parameters' in stopped.message
        assert stopped.message.endswith("RuntimeError: no idea what to try next")
        assert [t.status.value for t in client.list_trials(later)] == ["SUCCEEDED"]  # the first trial ran
        wait_until(lambda: journal(notes) == [["_on_error"]], 10, "the tuner's _on_error")

        at_load = client.create_experiment(
            v2(folder, {**tuner, "classArgs": {"journal": "-", "broken": True}}, searchSpace={})
        )
        stopped = finished(client, at_load)
        assert stopped.status.value == "STOPPED" and client.list_trials(at_load) == []
        assert stopped.message.startswith("the tuner cannot run: tuner class bad_tuner.BadTuner failed in __init__")
        assert f'File "{source}", line 9, in __init__' in stopped.message
        assert stopped.message.endswith("FileNotFoundError: model.pt")
    assert stack.procs["tuner"].poll() is None  # the service goes on for the other experiments


LIST_ADVISOR = textwrap.dedent(
    """
    import json
    import nni
    from nni.runtime.msg_dispatcher_base import MsgDispatcherBase
    from nni.runtime.tuner_command_channel import CommandType
    from note import note

    class ListAdvisor(MsgDispatcherBase):
        '''Sends the qualities it is given as trials (ids "list-0"…), kills a trial whose result is under 1.'''

        def __init__(self, qualities, journal):
            super().__init__()
            self.qualities, self.journal, self.sent = qualities, journal, 0

        def handle_initialize(self, data):
            note(self.journal, "initialize", data)
            self.send(CommandType.Initialized, "")

        def handle_request_trial_jobs(self, data):
            note(self.journal, "request", data)
            for _ in range(data):
                if self.sent == len(self.qualities):
                    self.send(CommandType.NoMoreTrialJobs, "")
                    return
                trial = {"parameter_id": f"list-{self.sent}", "parameter_source": "algorithm",
                         "parameters": {"x": self.qualities[self.sent], "steps": 4}}
                self.send(CommandType.NewTrialJob, nni.dump(trial))
                self.sent += 1

        def handle_update_search_space(self, data):
            pass

        def handle_report_metric_data(self, data):
            value = nni.load(data["value"])
            note(self.journal, "metric", data["parameter_id"], data["type"], data["sequence"], value)
            if data["type"] == "PERIODICAL" and value < 1:
                self.send(CommandType.KillTrialJob, nni.dump(data["trial_job_id"]))

        def handle_trial_end(self, data):
            note(self.journal, "end", data["trial_job_id"], data["event"], json.loads(data["hyper_params"]))

        def handle_import_data(self, data):
            pass

        def handle_add_customized_trial(self, data):
            pass
    """
)


def test_an_advisor_class_is_driven_as_nnis_manager_drives_it(stack: Stack, folder: Path) -> None:
    (folder / "tuners" / "list_advisor.py").write_text(LIST_ADVISOR)
    notes = folder / "journal.jsonl"
    config = v2(
        folder,
        None,
        searchSpace={"x": "any"},
        advisor={
            "className": "list_advisor.ListAdvisor",
            "codeDirectory": str(folder / "tuners"),
            "classArgs": {"qualities": [3, 0.1, 2], "journal": str(notes)},
        },
    )
    del config["tuner"]
    with Client(stack.nats.url) as client:
        experiment_id = client.create_experiment(config)
        assert finished(client, experiment_id).status.value == "DONE"  # "no more" once nothing ran
        trials = {t.parameter_id: t for t in client.list_trials(experiment_id)}
    assert {k: (t.parameters["x"], t.status.value) for k, t in trials.items()} == {
        "list-0": (3, "SUCCEEDED"),
        "list-1": (0.1, "EARLY_STOPPED"),
        "list-2": (2, "SUCCEEDED"),
    }
    assert "advisor" in trials["list-1"].message
    calls = journal(notes)
    assert calls[0] == ["initialize", {"x": "any"}]
    assert [n[1] for n in calls if n[0] == "request"] == [1, 1, 1, 1]  # trialConcurrency, then one per end
    assert ["metric", "list-0", "FINAL", 0, 3] in calls and ["metric", "list-0", "PERIODICAL", 3, 12] in calls
    ends = [(n[1], n[2], n[3]["parameter_id"], n[3]["parameters"]["x"]) for n in calls if n[0] == "end"]
    assert ends == [
        (trials["list-0"].id, "SUCCEEDED", "list-0", 3),
        (trials["list-1"].id, "EARLY_STOPPED", "list-1", 0.1),
        (trials["list-2"].id, "SUCCEEDED", "list-2", 2),
    ]
