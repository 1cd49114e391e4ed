"""A Hydra app swept with ``--multirun hydra/launcher=trialbus``, as its user runs it: each job is a trial.

Given the stack and a small ``train.py`` with ``@hydra.main``, when the user sweeps it on Trialbus, then the
jobs are trials of one experiment (``trialbus trial ls`` lists them), their overrides are the trials' parameters,
their return values the final metrics, and their output directories are where Hydra puts them; a job that
raises fails its trial (traceback in the trial's log) and the sweep, as under Hydra's own launchers; Ctrl-C stops
the experiment, cancelling its trials.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.helpers import wait_until
from trialbus.client import Client

TRIALBUS = str(Path(sys.executable).parent / "trialbus")

TRAIN = textwrap.dedent(
    """
    from pathlib import Path

    import hydra
    from hydra.core.hydra_config import HydraConfig


    @hydra.main(version_base=None, config_path=".", config_name="config")
    def train(cfg):
        if cfg.x < 0:
            raise ValueError(f"x must not be negative, got {cfg.x}")
        out = Path(HydraConfig.get().runtime.output_dir)
        (out / "model.txt").write_text(f"x={cfg.x} lr={cfg.model.lr}")
        return cfg.x * cfg.scale


    if __name__ == "__main__":
        train()
    """
)
CONFIG = "x: 0\nscale: 2\nmodel:\n  lr: 0.1\n"


@pytest.fixture
def app(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    (app / "train.py").write_text(TRAIN)
    (app / "config.yaml").write_text(CONFIG)
    return app


def sweep(stack, app: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "train.py", "--multirun", "hydra/launcher=trialbus", *overrides]
    return subprocess.run(command, cwd=app, env=stack.env(), capture_output=True, text=True, timeout=120)


def experiments(stack) -> list:
    with Client(stack.nats.url, token=stack.token) as client:
        return [(e, client.list_trials(e.id)) for e in client.list_experiments()]


def test_a_sweep_runs_as_trials(stack, app: Path) -> None:
    settings = [
        "hydra.launcher.concurrency=2",
        "hydra.launcher.training_service={platform: local, useActiveGpu: true}",
        "hydra.launcher.experiment={maxTrialDuration: 10m, retry: {trial: 1}}",
    ]
    done = sweep(stack, app, "x=1,2,3", "model.lr=0.5", *settings, "hydra.sweep.dir=multirun")
    assert done.returncode == 0, done.stderr

    [(experiment, trials)] = experiments(stack)
    assert experiment.config.trial_concurrency == 2
    assert experiment.config.max_trial_duration == 600 and experiment.config.retry.trial == 1
    assert experiment.config.training_service.use_active_gpu is True
    assert [t.status.value for t in trials] == ["SUCCEEDED"] * 3
    assert [t.final_metric for t in trials] == [2, 4, 6]
    assert [{k: v for k, v in t.parameters.items() if k != "_hydra"} for t in trials] == [
        {"x": x, "model.lr": 0.5} for x in (1, 2, 3)
    ]
    # the batch's trials all ended: the experiment is DONE, not left running
    wait_until(lambda: experiments(stack)[0][0].status.value == "DONE", 10, "the experiment to be DONE")
    hydra_part = trials[0].parameters["_hydra"]
    assert hydra_part["job"] == 0 and hydra_part["overrides"] == ["x=1", "model.lr=0.5"]
    assert hydra_part["config"] == {"x": 1, "scale": 2, "model": {"lr": 0.5}}

    listed = subprocess.run(
        [TRIALBUS, "trial", "ls", experiment.id], env=stack.env(), capture_output=True, text=True, timeout=30
    )
    assert listed.returncode == 0, listed.stderr
    assert all(t.id in listed.stdout for t in trials)

    for num, x in enumerate((1, 2, 3)):
        out = app / "multirun" / str(num)
        assert (out / "model.txt").read_text() == f"x={x} lr=0.5"
        assert (out / ".hydra" / "overrides.yaml").exists()


def test_a_failing_job_fails_its_trial_and_the_sweep(stack, app: Path) -> None:
    done = sweep(stack, app, "x=1,-1", "hydra.sweep.dir=multirun")
    assert done.returncode == 1
    assert "x must not be negative, got -1" in done.stderr

    [(_, trials)] = experiments(stack)
    assert [t.status.value for t in trials] == ["SUCCEEDED", "FAILED"]
    with Client(stack.nats.url, token=stack.token) as client:
        assert "ValueError: x must not be negative, got -1" in client.trial_log(trials[1].id)


def test_ctrl_c_stops_the_sweeps_experiment(stack, app: Path) -> None:
    (app / "train.py").write_text(
        TRAIN.replace("    if cfg.x < 0:", "    import time\n    time.sleep(cfg.x)\n    if cfg.x < 0:")
    )
    command = [sys.executable, "train.py", "--multirun", "hydra/launcher=trialbus", "x=60,61", "hydra.sweep.dir=m"]
    sweeping = subprocess.Popen(command, cwd=app, env=stack.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(
            lambda: (found := experiments(stack)) and [t.status.value for t in found[0][1]] == ["RUNNING"] * 2,
            30,
            "both jobs to run",
        )
        sweeping.send_signal(signal.SIGINT)
        assert sweeping.wait(30) != 0
    finally:
        if sweeping.poll() is None:
            sweeping.kill()
            sweeping.wait()
        sweeping.stdout.close()
        sweeping.stderr.close()

    def stopped():
        [(experiment, trials)] = experiments(stack)
        return experiment.status.value == "STOPPED" and {t.status.value for t in trials} == {"USER_CANCELED"}

    wait_until(stopped, 30, "the experiment to stop and its trials to be cancelled")
