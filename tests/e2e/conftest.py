"""End-to-end fixtures: the stack as processes, a code directory with NNI-style trials."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.openpai import pai, pai_stack, share  # noqa: F401 - OpenPAI fixtures for every e2e test
from tests.fixtures.stack import Stack

TRIAL = textwrap.dedent(
    """
    import os, sys, time
    import nni

    params = nni.get_next_parameter()
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"{os.environ['NNI_TRIAL_JOB_ID']} {os.getpid()} {os.getpgid(0)}\\n")
    if params.get("child"):
        import subprocess
        subprocess.Popen(["sleep", "300"])
    for i in range(params.get("intermediate", 0)):
        nni.report_intermediate_result(params["x"] * (i + 1))
        time.sleep(params.get("pause", 0))
    time.sleep(params.get("sleep", 0))
    if params.get("stderr"):
        print(params["stderr"], file=sys.stderr, flush=True)
    if "exit" in params:
        sys.exit(params["exit"])
    nni.report_final_result({"default": params["x"], "seq": nni.get_sequence_id()})
    """
)


def write_code(tmp_path: Path, trial: str = TRIAL) -> Path:
    """A code directory holding ``trial.py``."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(trial)
    return code


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    return write_code(tmp_path)


@pytest.fixture
def run_log(tmp_path: Path) -> Path:
    return tmp_path / "runs.log"


@pytest.fixture
def stack(tmp_path: Path, nats_server, run_log: Path, request):
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"RUN_LOG": str(run_log)})
    stack.start()
    yield stack
    stack.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(stack.logs(), file=sys.stderr)


@pytest.fixture
def stacks(request):
    """Stacks a test starts; stopped at the end, their logs printed when it failed."""
    started: list[Stack] = []
    yield started
    for stack in started:
        stack.stop()
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(stack.logs(), file=sys.stderr)


def config(code_dir: Path, **overrides) -> dict:
    return {
        "experimentName": "e2e",
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(code_dir),
        "trialConcurrency": 4,
        "trainingService": {"platform": "local"},
        **overrides,
    }


def runs(run_log: Path) -> list[str]:
    """Trial ids in the order their processes started (one line per real run)."""
    return [line.split()[0] for line in run_log.read_text().splitlines()] if run_log.exists() else []


@pytest.fixture
def tuned(tmp_path: Path, nats_server):
    """The stack with the tuner service: experiments run as their config's tuner proposes."""
    stack = Stack(root=tmp_path, nats=nats_server)
    stack.start("dispatcher", "gateway", "adapter", "tuner")
    yield stack
    stack.stop()
