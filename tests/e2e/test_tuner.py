"""NNI experiments run unchanged: `trialbus experiment run -f` and `trialbus.Experiment` with the tuner service.

Each test runs the stack as processes (dispatcher, gateway, local adapter, tuner) on a real nats-server,
and NNI-style trial code that reads ``nni.get_next_parameter()`` and reports through the NNI trial API.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import wait_until
from tests.fixtures.nni import nni_sdk
from tests.fixtures.stack import Stack
from trialbus import Experiment
from trialbus.client import Client

TRIALBUS = str(Path(sys.executable).parent / "trialbus")

# The shape of NNI's examples/trials/mnist-pytorch: its search space, its config; the model is a
# known function of the parameters so that a run takes a second, not an epoch.
MNIST = textwrap.dedent(
    """
    import math, time
    import nni

    params = nni.get_next_parameter()
    score = 0.9 - abs(math.log10(params["lr"]) + 2.5) / 10 - abs(params["momentum"] - 0.6) / 5
    score += 0.01 * (params["hidden_size"] == 512) + 0.005 * (params["batch_size"] == 32)
    for epoch in range(3):
        nni.report_intermediate_result(score * (epoch + 1) / 3)
        time.sleep(params.get("pause", 0.05))
    nni.report_final_result(score)
    """
)
SEARCH_SPACE = {
    "batch_size": {"_type": "choice", "_value": [16, 32, 64, 128]},
    "hidden_size": {"_type": "choice", "_value": [128, 256, 512, 1024]},
    "lr": {"_type": "choice", "_value": [0.0001, 0.001, 0.01, 0.1]},
    "momentum": {"_type": "uniform", "_value": [0, 1]},
}


@pytest.fixture
def mnist(tmp_path: Path) -> Path:
    """An NNI example folder: mnist.py, search_space.json, config.yml (v2, as NNI ships it)."""
    folder = tmp_path / "mnist-pytorch"
    folder.mkdir()
    (folder / "mnist.py").write_text(MNIST)
    (folder / "search_space.json").write_text(json.dumps(SEARCH_SPACE))
    config = {
        "searchSpaceFile": "search_space.json",
        "trialCommand": f"{sys.executable} mnist.py",
        "trialCodeDirectory": ".",
        "trialGpuNumber": 0,
        "trialConcurrency": 4,
        "maxTrialNumber": 8,
        "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        "trainingService": {"platform": "local", "useActiveGpu": False},
    }
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    return folder


def paced(mnist: Path, pause: float, trials: int, concurrency: int) -> dict:
    """The example's config, inline (as a client sends it), with trials that take ``pause`` s per epoch."""
    config = yaml.safe_load((mnist / "config.yml").read_text())
    del config["searchSpaceFile"]
    return {
        **config,
        "searchSpace": {**SEARCH_SPACE, "pause": {"_type": "choice", "_value": [pause]}},
        "maxTrialNumber": trials,
        "trialConcurrency": concurrency,
        "trialCodeDirectory": str(mnist),
    }


def run_cli(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}
    return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def experiments(stack: Stack) -> list[dict]:
    return stack.rest("GET", "/experiments").json()


def trials_of(stack: Stack, experiment_id: str) -> list[dict]:
    return stack.rest("GET", f"/experiments/{experiment_id}/trials").json()["trials"]  # (one page: < 500 trials)


def in_space(params: dict) -> bool:
    return (
        params["batch_size"] in (16, 32, 64, 128)
        and params["hidden_size"] in (128, 256, 512, 1024)
        and params["lr"] in (0.0001, 0.001, 0.01, 0.1)
        and 0 <= params["momentum"] <= 1
    )


def test_experiment_run_drives_an_nni_example_config_to_max_trial_number(tuned: Stack, mnist: Path) -> None:
    done = run_cli(tuned, "experiment", "run", "-f", str(mnist / "config.yml"))
    assert done.returncode == 0, done.stdout + done.stderr + tuned.logs()
    [experiment] = experiments(tuned)
    assert experiment["status"] == "DONE"
    trials = trials_of(tuned, experiment["id"])
    assert len(trials) == 8 and all(t["status"] == "SUCCEEDED" for t in trials)
    assert all(in_space(t["parameters"]) for t in trials)
    assert sorted(t["parameterId"] for t in trials) == list(range(8))  # the tuner's numbers, as NNI's ids
    best = max(trials, key=lambda t: t["finalMetric"])
    assert "DONE" in done.stdout and "best" in done.stdout and best["id"] in done.stdout
    assert "8 succeeded" in done.stdout


def test_experiment_run_takes_an_nni_v1_config(tuned: Stack, mnist: Path) -> None:
    legacy = {
        "authorName": "default",
        "experimentName": "mnist-v1",
        "trialConcurrency": 2,
        "maxExecDuration": "1h",
        "maxTrialNum": 5,
        "trainingServicePlatform": "local",
        "searchSpacePath": "search_space.json",
        "useAnnotation": False,
        "tuner": {"builtinTunerName": "Random", "classArgs": {"optimize_mode": "maximize"}},
        "trial": {"command": f"{sys.executable} mnist.py", "codeDir": ".", "gpuNum": 0},
    }
    (mnist / "config_v1.yml").write_text(yaml.safe_dump(legacy))
    done = run_cli(tuned, "experiment", "run", "-f", str(mnist / "config_v1.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    [experiment] = experiments(tuned)
    assert experiment["config"]["tuner"]["name"] == "Random"
    trials = trials_of(tuned, experiment["id"])
    assert len(trials) == 5 and all(t["status"] == "SUCCEEDED" and in_space(t["parameters"]) for t in trials)


def test_detach_leaves_the_experiment_running_to_its_end(tuned: Stack, mnist: Path) -> None:
    config = yaml.safe_load((mnist / "config.yml").read_text())
    (mnist / "config.yml").write_text(yaml.safe_dump({**config, "maxTrialNumber": 4}))
    done = run_cli(tuned, "experiment", "run", "-f", str(mnist / "config.yml"), "--detach", timeout=30)
    assert done.returncode == 0, done.stderr
    [experiment] = experiments(tuned)
    assert experiment["id"] in done.stdout and "trialbus experiment stop" in done.stdout
    wait_until(lambda: experiments(tuned)[0]["status"] == "DONE", 90, "the detached experiment to finish")
    assert len(trials_of(tuned, experiment["id"])) == 4


def test_a_config_the_tuner_cannot_run_is_refused_before_anything_is_created(tuned: Stack, mnist: Path) -> None:
    config = yaml.safe_load((mnist / "config.yml").read_text())
    config["tuner"] = {"name": "TPE", "classArgs": {"optimize_mode": "sideways"}}
    (mnist / "bad.yml").write_text(yaml.safe_dump(config))
    done = run_cli(tuned, "experiment", "run", "-f", str(mnist / "bad.yml"))
    assert done.returncode == 1 and "optimize_mode" in done.stderr and "sideways" in done.stderr
    config["tuner"] = None
    (mnist / "none.yml").write_text(yaml.safe_dump(config))
    done = run_cli(tuned, "experiment", "run", "-f", str(mnist / "none.yml"))
    assert done.returncode == 1 and "no tuner" in done.stderr
    assert experiments(tuned) == []


def test_the_tuner_service_stops_an_experiment_it_cannot_run_with_the_reason(tuned: Stack, mnist: Path) -> None:
    config = yaml.safe_load((mnist / "config.yml").read_text())
    config["searchSpace"] = {"x": {"_type": "uniform", "_value": [1, 0]}}  # low > high
    del config["searchSpaceFile"]
    config["trialCodeDirectory"] = str(mnist)
    with Client(tuned.nats.url) as client:  # a client that does not check, unlike the CLI
        experiment_id = client.create_experiment(config)
    stopped = wait_until(lambda: (e := experiments(tuned)[0])["status"] == "STOPPED" and e, 20, "the stop")
    assert "low < high" in stopped["message"] and trials_of(tuned, experiment_id) == []


def test_medianstop_early_stops_a_clearly_bad_trial(tuned: Stack, tmp_path: Path) -> None:
    code = tmp_path / "curves"
    code.mkdir()
    (code / "trial.py").write_text(
        textwrap.dedent(
            """
        import time, nni
        quality = nni.get_next_parameter()["quality"]
        for step in range(8):
            nni.report_intermediate_result(quality * (step + 1))
            time.sleep(0.25)
        nni.report_final_result(quality * 8)
        """
        )
    )
    config = {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 1,
        "maxTrialNumber": 10,
        "searchSpace": {"quality": {"_type": "choice", "_value": [8, 9, 10, 0.1]}},
        "tuner": {"name": "GridSearch"},
        "assessor": {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize"}},
        "trainingService": {"platform": "local"},
    }
    with Experiment(config, nats_url=tuned.nats.url) as experiment:
        assert experiment.run() is True  # the grid is walked: DONE with 4 trials, not maxTrialNumber
        trials = {t.parameters["quality"]: t for t in experiment.list_trial_jobs()}
        assert len(trials) == 4
        assert [trials[q].status.value for q in (8, 9, 10)] == ["SUCCEEDED"] * 3
        bad = trials[0.1]
        assert bad.status.value == "EARLY_STOPPED", bad
        assert "assessor" in bad.message and bad.intermediate_count < 8
        assert experiment.best_trial().parameters == {"quality": 10}


def test_python_experiment_as_nni_scripts_write_it(tuned: Stack, mnist: Path) -> None:
    experiment = Experiment("local", nats_url=tuned.nats.url)
    experiment.config.experiment_name = "from python"
    experiment.config.trial_command = f"{sys.executable} mnist.py"
    experiment.config.trial_code_directory = str(mnist)
    experiment.config.search_space = SEARCH_SPACE
    experiment.config.tuner.name = "Anneal"
    experiment.config.tuner.class_args["optimize_mode"] = "maximize"
    experiment.config.max_trial_number = 6
    experiment.config.trial_concurrency = 3
    try:
        assert experiment.run() is True
        assert experiment.get_status() == "DONE"
        assert experiment.get_job_statistics() == [{"trialJobStatus": "SUCCEEDED", "trialJobNumber": 6}]
        data = experiment.export_data()
        assert len(data) == 6 and all(in_space(d["parameter"]) and isinstance(d["value"], float) for d in data)
        assert experiment.best_trial().final_metric == max(d["value"] for d in data)
        metrics = experiment.get_job_metrics(data[0]["trial_id"])
        assert [m.type.value for m in metrics] == ["PERIODICAL"] * 3 + ["FINAL"]
    finally:
        experiment.close()


def test_python_resume_runs_a_stopped_experiment_to_its_end(tuned: Stack, mnist: Path) -> None:
    config = paced(mnist, pause=0.2, trials=4, concurrency=1)
    with Client(tuned.nats.url) as client:
        experiment_id = client.create_experiment(config)
        wait_until(lambda: any(t.status.value == "SUCCEEDED" for t in client.list_trials(experiment_id)), 60, "a trial")
        client.stop_experiment(experiment_id)
    experiment = Experiment.resume(experiment_id, nats_url=tuned.nats.url)  # NNI's classmethod; waits for the end
    try:
        assert experiment.get_status() == "DONE"
        statuses = [t.status.value for t in experiment.list_trial_jobs()]
        assert len(statuses) == 4 and statuses.count("USER_CANCELED") <= 1, statuses  # the one the stop ended
        assert statuses.count("SUCCEEDED") >= 3
    finally:
        experiment.close()


def test_a_restarted_tuner_resumes_from_the_trials_on_the_bus(tuned: Stack, mnist: Path) -> None:
    config = paced(mnist, pause=0.4, trials=10, concurrency=2)
    with Client(tuned.nats.url) as client:
        experiment_id = client.create_experiment(config)
        wait_until(lambda: sum(t.status.terminal for t in client.list_trials(experiment_id)) >= 3, 60, "3 trials")
        tuned.kill("tuner")  # SIGKILL: no goodbye, its lease stays until it comes back under the same name
        before = len(client.list_trials(experiment_id))
        tuned.start("tuner")
        wait_until(lambda: client.get_experiment(experiment_id).status.value == "DONE", 90, "the experiment's end")
        trials = client.list_trials(experiment_id)
    assert len(trials) == 10 and all(t.status.value == "SUCCEEDED" for t in trials)
    assert 3 <= before < 10
    resumed = re.search(r"resumed from (\d+) trials", tuned.log("tuner", since_start=True))
    # every trial on the bus when it came back (a submit in flight at the kill may land after `before`)
    assert resumed and before <= int(resumed[1]) < 10, tuned.log("tuner", since_start=True)
    moments = [t.parameters["momentum"] for t in trials]
    assert len(set(moments)) == 10  # nothing proposed twice: the seeded sampler did not start over


def test_tuner_replicas_share_experiments_and_take_over_a_dead_ones(tmp_path: Path, nats_server, mnist: Path) -> None:
    stack = Stack(root=tmp_path, nats=nats_server)
    stack.start("dispatcher", "gateway", "adapter", "tuner@a", "tuner@b")
    try:
        config = paced(mnist, pause=0.3, trials=5, concurrency=2)
        with Client(stack.nats.url) as client:
            ids = [client.create_experiment(config) for _ in range(4)]
            drivers = wait_until(lambda: _drivers(stack, ids), 20, "every experiment to be driven")
            assert sorted(drivers) == sorted(ids)  # each by exactly one replica
            victim = drivers[ids[0]]
            stack.kill(f"tuner@{victim}")
            for experiment_id in ids:
                wait_until(lambda e=experiment_id: client.get_experiment(e).status.value == "DONE", 120, "all DONE")
            for experiment_id in ids:
                assert len(client.list_trials(experiment_id)) == 5
        survivor = "b" if victim == "a" else "a"
        assert f"driving experiment {ids[0]}" in stack.log(f"tuner@{survivor}")  # taken over after the lease expired
    finally:
        stack.stop()


def _drivers(stack: Stack, ids: list[str]) -> dict[str, str] | None:
    """experiment → the replica driving it, once each is driven by exactly one."""
    found: dict[str, list[str]] = {i: [] for i in ids}
    for replica in ("a", "b"):
        for experiment_id in ids:
            if f"driving experiment {experiment_id}" in stack.log(f"tuner@{replica}"):
                found[experiment_id].append(replica)
    if all(len(r) == 1 for r in found.values()):
        return {i: r[0] for i, r in found.items()}
    assert all(len(r) <= 1 for r in found.values()), found
    return None


NNI_TUNER = textwrap.dedent(
    """
    import json
    import nni
    from nni.tuner import Tuner

    class ListTuner(Tuner):
        '''Proposes the qualities it is given, in order, and writes down what NNI's manager tells it.'''

        def __init__(self, qualities, journal, optimize_mode="maximize"):
            self.qualities, self.journal = qualities, journal

        def _note(self, *entry):
            with open(self.journal, "a") as out:
                out.write(json.dumps(entry) + "\\n")

        def update_search_space(self, search_space):
            self._note("space", sorted(search_space))

        def generate_parameters(self, parameter_id, **kwargs):
            if parameter_id >= len(self.qualities):
                raise nni.NoMoreTrialError("the list is walked")
            return {"quality": self.qualities[parameter_id]}

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            self._note("result", parameter_id, parameters["quality"], value)

        def trial_end(self, parameter_id, success, **kwargs):
            self._note("end", parameter_id, success)
    """
)


def test_nni_tuner_and_assessor_classes_run_unchanged(tmp_path: Path, nats_server) -> None:
    # The tuner service and the trials find the real nni package; the rest of the suite does not.
    path = {"PYTHONPATH": str(nni_sdk())}
    stack = Stack(root=tmp_path, nats=nats_server, service_env={"tuner": path, "adapter": path})
    stack.start("dispatcher", "gateway", "adapter", "tuner")
    code, tuners, journal = tmp_path / "code", tmp_path / "tuners", tmp_path / "journal.jsonl"
    code.mkdir()
    tuners.mkdir()
    (code / "trial.py").write_text(
        textwrap.dedent(
            """
        import time, nni  # the shim serves the trial API; the real nni package behind it backs nni.Experiment
        assert "nni_shim" in nni.__file__ and hasattr(nni, "Experiment"), nni.__file__
        quality = nni.get_next_parameter()["quality"]
        for step in range(6):
            nni.report_intermediate_result(quality * (step + 1))
            time.sleep(0.3)
        nni.report_final_result(quality * 6)
        """
        )
    )
    (tuners / "list_tuner.py").write_text(NNI_TUNER)
    config = {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 1,
        "searchSpace": {"quality": {"_type": "choice", "_value": [8, 9, 10, 0.1]}},
        "tuner": {
            "className": "list_tuner.ListTuner",
            "codeDirectory": str(tuners),
            "classArgs": {"qualities": [8, 9, 10, 0.1], "journal": str(journal)},
        },
        "assessor": {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize"}},  # NNI's own class here
        "trainingService": {"platform": "local"},
    }
    try:
        with Experiment(config, nats_url=stack.nats.url) as experiment:
            assert experiment.run() is True
            trials = {t.parameters["quality"]: t for t in experiment.list_trial_jobs()}
        assert [trials[q].status.value for q in (8, 9, 10)] == ["SUCCEEDED"] * 3
        assert trials[0.1].status.value == "EARLY_STOPPED"
        notes = [json.loads(line) for line in journal.read_text().splitlines()]
        assert notes[0] == ["space", ["quality"]]
        assert [n for n in notes if n[0] == "result"] == [
            ["result", 0, 8, 48],
            ["result", 1, 9, 54],
            ["result", 2, 10, 60],
        ]
        assert ["end", 3, False] in notes
        assert "NniAssessor" in stack.log("tuner")
    finally:
        stack.stop()


def test_experiment_run_says_when_no_tuner_service_picks_the_experiment_up(
    tmp_path: Path, nats_server, mnist: Path, monkeypatch
) -> None:
    from rich.console import Console

    from trialbus.progress import RunView

    stack = Stack(root=tmp_path, nats=nats_server)
    stack.start("dispatcher", "gateway", "adapter")  # and no tuner service
    monkeypatch.setattr("trialbus.progress.NO_TUNER_AFTER", 1.0)
    try:
        with Experiment(mnist / "config.yml", nats_url=stack.nats.url) as experiment:
            view = RunView(experiment.start(), experiment.config)
            shown: list[str] = []

            def look(*seen) -> bool:
                view.update(*seen)
                console = Console(record=True, width=200, file=io.StringIO())
                console.print(view)
                shown.append(console.export_text())
                return "is the tuner service running" in shown[-1]

            wait_until(lambda: look(experiment.get_experiment_profile(), experiment.list_trial_jobs()), 10, "a hint")
            assert "waiting for the tuner's first trial" in shown[0]
            experiment.stop()
    finally:
        stack.stop()


def test_a_tuner_replica_that_stops_hands_its_experiments_over_at_once(tmp_path: Path, nats_server, mnist) -> None:
    stack = Stack(root=tmp_path, nats=nats_server)
    stack.start("dispatcher", "gateway", "adapter", "tuner@a", "tuner@b")
    try:
        config = paced(mnist, pause=0.3, trials=6, concurrency=1)
        with Client(stack.nats.url) as client:
            experiment_id = client.create_experiment(config)
            holder = wait_until(lambda: _drivers(stack, [experiment_id]), 20, "a driver")[experiment_id]
            other = "b" if holder == "a" else "a"
            stack.kill(f"tuner@{holder}", signal.SIGTERM)  # a rollout, a scale-down: it hands the lease back
            wait_until(
                lambda: f"driving experiment {experiment_id}" in stack.log(f"tuner@{other}"),
                5,
                "the other replica to take over well before the lease would have expired (15 s)",
            )
            wait_until(lambda: client.get_experiment(experiment_id).status.value == "DONE", 60, "the end")
            assert len(client.list_trials(experiment_id)) == 6
    finally:
        stack.stop()
