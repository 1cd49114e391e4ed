"""NNI's own ``multiThread`` case, run as a user runs it: a v1 config with ``multiThread: true`` and a tuner class
whose ``generate_parameters`` for every trial but the first waits until ``receive_trial_result`` of the first was
called. NNI's dispatcher handles every command on its thread pool, so the result reaches the tuner while the
second proposal waits; the experiment must end the same way here.

The stack runs as processes on a real nats-server; the tuner service alone finds the real nni package, the trials
use the keeper's nni shim as in the rest of the suite.
"""

from __future__ import annotations

import json
import os
import signal
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

# NNI's case in our words: the first trial's parameters at once; every later call polls (every 2 s, as NNI's does)
# until the first trial's final result came in.
WAITING_TUNER = textwrap.dedent(
    """
    import time
    from nni.tuner import Tuner

    class WaitingTuner(Tuner):
        def __init__(self):
            self.first_result_seen = False

        def update_search_space(self, search_space):
            pass

        def generate_parameters(self, parameter_id, **kwargs):
            if parameter_id == 0:
                return {"x": 0}
            while not self.first_result_seen:
                time.sleep(2)
            return {"x": 1}

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            if parameter_id == 0:
                self.first_result_seen = True
    """
)

TRIAL = textwrap.dedent(
    """
    import time
    import nni

    nni.get_next_parameter()
    time.sleep(1)
    nni.report_final_result(0.5)
    """
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with nni_tuner_stack(tmp_path_factory.mktemp("multi-thread")) as stack:
        yield stack


def run_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}
    return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(120)  # a tuner that never hears the first result hangs: the test fails here
def test_a_proposal_waiting_for_a_result_gets_it_while_it_waits(stack: Stack, tmp_path: Path) -> None:
    # Given NNI's multi_thread case: two trials at once, four in all, the tuner's later proposals waiting for the
    # first trial's result
    (tmp_path / "multi_thread_tuner.py").write_text(WAITING_TUNER)
    (tmp_path / "multi_thread_trial.py").write_text(TRIAL)
    (tmp_path / "search_space.json").write_text(json.dumps({"x": {"_type": "choice", "_value": [0, 1]}}))
    legacy = {
        "authorName": "nni",
        "experimentName": "multi_thread",
        "maxExecDuration": "5m",
        "maxTrialNum": 4,
        "trialConcurrency": 2,
        "searchSpacePath": "search_space.json",
        "useAnnotation": False,
        "multiThread": True,
        "trainingServicePlatform": "local",
        "tuner": {"codeDir": ".", "classFileName": "multi_thread_tuner.py", "className": "WaitingTuner"},
        "trial": {"codeDir": ".", "command": f"{sys.executable} multi_thread_trial.py", "gpuNum": 0},
    }
    (tmp_path / "config.yml").write_text(yaml.safe_dump(legacy))

    # When it runs as a user runs it
    done = run_cli(stack, "experiment", "run", "-f", str(tmp_path / "config.yml"))

    # Then it ends DONE with its four trials: the first with the first parameters, the others generated once the
    # first result reached the tuner
    assert done.returncode == 0, done.stdout + done.stderr + stack.logs()
    with Client(stack.nats.url) as client:
        experiment = client.list_experiments()[0]
        trials = client.list_trials(experiment.id)
    assert experiment.status.value == "DONE", experiment
    assert experiment.config.multi_thread is True
    ordered = sorted(trials, key=lambda t: t.parameter_id)
    assert [(t.parameter_id, t.parameters, t.status.value) for t in ordered] == [
        (0, {"x": 0}, "SUCCEEDED"),
        (1, {"x": 1}, "SUCCEEDED"),
        (2, {"x": 1}, "SUCCEEDED"),
        (3, {"x": 1}, "SUCCEEDED"),
    ]


FAILING_TRIAL = textwrap.dedent(
    """
    import sys
    import nni

    nni.get_next_parameter()
    sys.exit(1)  # no final result: the tuner's later proposals wait for ever
    """
)


@pytest.mark.timeout(120)
def test_a_tuner_that_waits_for_ever_lets_its_experiment_and_the_service_stop(stack: Stack, tmp_path: Path) -> None:
    from trialbus import Experiment

    # Given the same tuner, whose first trial fails without a result: its later proposals never return
    (tmp_path / "multi_thread_tuner.py").write_text(WAITING_TUNER)
    (tmp_path / "failing_trial.py").write_text(FAILING_TRIAL)
    (tmp_path / "search_space.json").write_text(json.dumps({"x": {"_type": "choice", "_value": [0, 1]}}))
    legacy = {
        "maxTrialNum": 4,
        "trialConcurrency": 2,
        "searchSpacePath": "search_space.json",
        "multiThread": True,
        "trainingServicePlatform": "local",
        "tuner": {"codeDir": ".", "classFileName": "multi_thread_tuner.py", "className": "WaitingTuner"},
        "trial": {"codeDir": ".", "command": f"{sys.executable} failing_trial.py"},
    }
    (tmp_path / "config.yml").write_text(yaml.safe_dump(legacy))
    try:
        with (
            Experiment(tmp_path / "config.yml", nats_url=stack.nats.url) as experiment,
            Client(stack.nats.url) as client,
        ):
            experiment_id = experiment.start()
            wait_until(
                lambda: [t.status.value for t in client.list_trials(experiment_id)] == ["FAILED"],
                60,
                "the first trial to fail",
            )

            # When the user stops the experiment while its tuner waits, and then the tuner service is stopped
            experiment.stop()
            stopped = wait_until(
                lambda: (e := client.get_experiment(experiment_id)).status.value != "RUNNING" and e,
                30,
                "the experiment to stop",
            )
            trials = client.list_trials(experiment_id)
            proc = stack.procs.pop("tuner")
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(15)  # its stop bound is TRIALBUS_STOP_TIMEOUT=5 s; a joined blocked thread: never
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise

        # Then the experiment stopped with its one trial, and the service exited cleanly, its tuner still waiting
        assert stopped.status.value == "STOPPED"
        assert [t.status.value for t in trials] == ["FAILED"], trials
        assert code == 0, stack.log("tuner")[-4000:]
    finally:
        if "tuner" not in stack.procs:
            stack.start("tuner")
