"""Warm templates through the whole stack, across experiments: an experiment's first trials wait
for the template that is importing their modules (never import them beside it), a second
experiment of the same code forks from the first's templates, one of other code or another
interpreter does not, and the adapter leaves no exited process of its own unreaped."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, wait_until
from tests.e2e.test_warm_start import templates, warm_of
from tests.fixtures.stack import Stack

#: A package whose import costs seconds of CPU (as scikit-learn's does), outside the code directory.
HEAVY = "import time\nend = time.process_time() + 3.0\nwhile time.process_time() < end:\n    pass\n"
#: What the trial sees at its first line: whether its template imported ``heavy``, and its parent.
TRIAL = (
    "import os, sys\n"
    "seen = {'heavy': 'heavy' in sys.modules, 'parent': os.getppid()}\n"
    "import heavy\n"
    "import nni\n"
    "nni.get_next_parameter()\n"
    "nni.report_final_result({'default': 1, **seen})\n"
)


@pytest.fixture
def heavy_stack(tmp_path: Path, nats_server, stacks) -> Stack:
    site = tmp_path / "site"
    site.mkdir()
    (site / "heavy.py").write_text(HEAVY)
    path = os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"PYTHONPATH": path})
    stacks.append(stack)
    stack.start()
    return stack


def run_wave(stack: Stack, code: Path, command: str, count: int = 4) -> list[dict]:
    """``count`` trials of an experiment at concurrency ``count``: what each saw at its first line."""
    experiment = create(stack, config(code, trialCommand=command, trialConcurrency=count))
    ids = [submit(stack, experiment, {"x": i}) for i in range(count)]
    bodies = [ended(stack, trial_id, 120) for trial_id in ids]
    assert [b["status"] for b in bodies] == ["SUCCEEDED"] * count, bodies
    assert all(warm_of(stack, experiment, t) for t in ids)
    return [b["finalMetric"] for b in bodies]


def settled_templates(stack: Stack) -> set[int]:
    """The stack's templates once none started or ended for 2 s (learned ones swapped in)."""
    seen, since = set(templates(stack)), time.monotonic()
    deadline = since + 60
    while time.monotonic() - since < 2:
        assert time.monotonic() < deadline, "the templates never settled"
        time.sleep(0.2)
        if (now := set(templates(stack))) != seen:
            seen, since = now, time.monotonic()
    return seen


def test_first_trials_wait_for_their_template_and_later_experiments_of_the_same_code_reuse_it(heavy_stack, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    command = f"{sys.executable} trial.py"
    # Given a fresh stack: its first wave of trials finds its heavy import done by the template
    # (which read it from the script ahead), rather than importing it beside the template
    first = run_wave(heavy_stack, code, command)
    assert [seen["heavy"] for seen in first] == [True] * 4, first
    kept = settled_templates(heavy_stack)
    # When a second experiment of the same code runs: its trials fork from those templates
    second = run_wave(heavy_stack, code, command)
    assert [seen["heavy"] for seen in second] == [True] * 4, second
    assert {seen["parent"] for seen in second} <= kept, (second, kept)
    # And neither other code nor another interpreter's options share them
    (code / "other.py").write_text("VALUE = 1\n")  # a new snapshot
    changed = run_wave(heavy_stack, code, command, count=1)
    options = run_wave(heavy_stack, code, f"{sys.executable} -B trial.py", count=1)
    assert changed[0]["parent"] not in kept and options[0]["parent"] not in kept
    assert changed[0]["heavy"] and options[0]["heavy"]  # (their own templates read it ahead)


def zombies(stack) -> dict[int, str]:
    """The adapter's children that exited and were not reaped: pid → name."""
    found = {}
    for child in psutil.Process(stack.procs["adapter"].pid).children():
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                found[child.pid] = child.name()
    return found


def test_the_adapter_reaps_what_it_started_while_a_warm_trial_runs(stack, code_dir, run_log):
    experiment = create(stack, config(code_dir, trialConcurrency=1))
    running = submit(stack, experiment, {"x": 1, "sleep": 12})
    wait_until(lambda: run_log.exists() and run_log.read_text().split(), 30, "the trial to run")
    time.sleep(2)  # (a template the pool closed as the trial started has exited by now)
    before = zombies(stack)
    time.sleep(3)
    lasting = {pid: name for pid, name in zombies(stack).items() if pid in before}
    assert lasting == {}, f"zombie children of the adapter for 3 s while a trial runs: {lasting}"
    assert warm_of(stack, experiment, running)
    assert stack.rest("POST", f"/trials/{running}/cancel").status_code == 202
    ended(stack, running, 20)
