"""Warm-start trials through the whole stack, as a user runs them: the same experiment with
``warmStart`` on (the default) and off, compared on what the REST API, the metrics and the
trial's own files show; and the template's failures, which must cost no trial."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import psutil

from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, trial, wait_until


def trial_dir(stack, experiment: str, trial_id: str) -> Path:
    found = list((stack.root / "data").glob(f"local-gpu/*/trials/{experiment}/{trial_id}-0"))
    assert found, f"no directory for trial {trial_id}"
    return found[0]


def warm_of(stack, experiment: str, trial_id: str) -> bool:
    return json.loads((trial_dir(stack, experiment, trial_id) / ".trialbus/state.json").read_text()).get("warm", False)


def metric_values(stack, trial_id: str) -> list:
    return [m["value"] for m in stack.rest("GET", f"/trials/{trial_id}/metrics").json()]


def templates(stack) -> list[int]:
    """Pids of this stack's trial templates: the adapter's children that run trial_template.py."""
    found = []
    for child in psutil.Process(stack.procs["adapter"].pid).children():
        with contextlib.suppress(psutil.Error):  # a retired one, exited and not yet reaped
            if any("trial_template.py" in arg for arg in child.cmdline()):
                found.append(child.pid)
    return found


def test_warm_and_cold_trials_report_the_same_parameters_metrics_and_exit_codes(stack, code_dir):
    cases = [{"x": 3, "intermediate": 4}, {"x": 5, "exit": 3, "stderr": "bad luck"}, {"x": 7, "intermediate": 2}]
    seen = {}
    for warm in (True, False):
        experiment = create(stack, config(code_dir, warmStart=warm, trialConcurrency=1, experimentName=f"w{warm}"))
        ids = [submit(stack, experiment, params) for params in cases]
        bodies = [ended(stack, trial_id, 60) for trial_id in ids]
        assert [warm_of(stack, experiment, t) for t in ids] == [warm] * 3
        seen[warm] = [
            (b["status"], b["exitCode"], b.get("finalMetric"), metric_values(stack, t), b["parameters"])
            for b, t in zip(bodies, ids, strict=True)
        ]
        assert "bad luck" in stack.rest("GET", f"/trials/{ids[1]}/log").text
    assert seen[True] == seen[False]
    assert [s[:3] for s in seen[True]] == [
        ("SUCCEEDED", 0, {"default": 3, "seq": 0}),
        ("FAILED", 3, None),
        ("SUCCEEDED", 0, {"default": 7, "seq": 2}),
    ]
    assert seen[True][0][3] == [3, 6, 9, 12, {"default": 3, "seq": 0}]


def test_cancel_and_max_trial_duration_stop_a_warm_trial_and_its_group(stack, code_dir, run_log):
    experiment = create(stack, config(code_dir, maxTrialDuration="3s"))
    canceled = submit(stack, experiment, {"x": 1, "sleep": 300, "child": True})
    wait_until(lambda: run_log.exists() and run_log.read_text().split(), 30, "trial started")
    _, pid, pgid = run_log.read_text().split()
    assert stack.rest("POST", f"/trials/{canceled}/cancel").status_code == 202
    assert ended(stack, canceled, 10)["status"] == "USER_CANCELED"
    wait_until(lambda: not _group_alive(int(pgid)), 5, "the canceled trial's group gone")
    assert warm_of(stack, experiment, canceled)
    slow = submit(stack, experiment, {"x": 2, "sleep": 300})
    body = ended(stack, slow, 20)
    assert body["status"] == "EARLY_STOPPED" and "maxTrialDuration (3s)" in body["message"]
    assert warm_of(stack, experiment, slow)


def test_gpu_placement_reaches_a_warm_trial_through_its_environment(stack, code_dir):
    (code_dir / "gpus.py").write_text(
        "import os, nni\nnni.get_next_parameter()\n"
        "nni.report_final_result({'default': 1, 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})\n"
    )
    command = config(code_dir)["trialCommand"].replace("trial.py", "gpus.py")
    hidden = create(stack, config(code_dir, trialCommand=command, trialGpuNumber=0))
    shown = create(stack, config(code_dir, trialCommand=command))
    a, b = submit(stack, hidden, {"x": 1}), submit(stack, shown, {"x": 1})
    assert ended(stack, a)["finalMetric"]["cuda"] == ""  # trialGpuNumber 0 hides every GPU, as cold
    assert ended(stack, b)["finalMetric"]["cuda"] == os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    assert warm_of(stack, hidden, a) and warm_of(stack, shown, b)


def test_a_template_killed_mid_experiment_costs_no_trial(stack, code_dir):
    experiment = create(stack, config(code_dir, trialConcurrency=1))
    first = submit(stack, experiment, {"x": 1})
    assert ended(stack, first)["status"] == "SUCCEEDED" and warm_of(stack, experiment, first)
    killed = templates(stack)
    assert killed
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    after = [submit(stack, experiment, {"x": i}) for i in range(2, 5)]
    assert [ended(stack, t)["status"] for t in after] == ["SUCCEEDED"] * 3
    assert [ended(stack, t)["finalMetric"]["default"] for t in after] == [2, 3, 4]
    wait_until(
        lambda: "is gone" in stack.log("adapter") or "starting the trial cold" in stack.log("adapter"),
        10,
        "the adapter's word on the template",
    )
    assert warm_of(stack, experiment, after[-1])  # a new template took over


def test_a_template_killed_while_its_trials_run_loses_none_of_their_outcomes(stack, code_dir, run_log):
    # Given two warm trials running, forked by their template for the keepers it keeps
    experiment = create(stack, config(code_dir, trialConcurrency=2))
    first = submit(stack, experiment, {"x": 1})
    assert ended(stack, first)["status"] == "SUCCEEDED"  # (the template started: the next ones fork)
    ok, failing = (
        submit(stack, experiment, {"x": 2, "sleep": 2}),
        submit(stack, experiment, {"x": 3, "sleep": 2, "exit": 3}),
    )
    wait_until(lambda: trial_pid(stack, experiment, ok) and trial_pid(stack, experiment, failing), 30, "both to run")
    parents = {psutil.Process(trial_pid(stack, experiment, t)).ppid() for t in (ok, failing)}
    assert parents <= set(templates(stack)), "a kept keeper's trial is its template's child"
    # When the templates are killed while they run
    for pid in templates(stack):
        os.kill(pid, signal.SIGKILL)
    # Then each trial ends as it would have: its exit status is not lost with its parent
    assert (ended(stack, ok)["status"], ended(stack, ok)["finalMetric"]["default"]) == ("SUCCEEDED", 2)
    assert (ended(stack, failing)["status"], ended(stack, failing)["exitCode"]) == ("FAILED", 3)


def test_a_code_change_between_trials_runs_the_new_code(stack, code_dir):
    # The code is snapshotted when an experiment is created: changed code is a new snapshot, whose
    # trials fork from a template of their own, while the first experiment's trials keep theirs.
    (code_dir / "helper.py").write_text("VALUE = 1\n")
    (code_dir / "versioned.py").write_text(
        "import nni, helper\nnni.get_next_parameter()\nnni.report_final_result(helper.VALUE)\n"
    )
    command = config(code_dir)["trialCommand"].replace("trial.py", "versioned.py")
    before = create(stack, config(code_dir, trialCommand=command, trialConcurrency=1))
    assert ended(stack, submit(stack, before, {"x": 1}))["finalMetric"] == 1
    (code_dir / "helper.py").write_text("VALUE = 2\n")
    after = create(stack, config(code_dir, trialCommand=command, trialConcurrency=1))
    changed, unchanged = submit(stack, after, {"x": 1}), submit(stack, before, {"x": 1})
    assert ended(stack, changed)["finalMetric"] == 2 and ended(stack, unchanged)["finalMetric"] == 1
    assert warm_of(stack, after, changed) and warm_of(stack, before, unchanged)


def state_of(stack, experiment: str, trial_id: str) -> dict:
    return json.loads((trial_dir(stack, experiment, trial_id) / ".trialbus/state.json").read_text())


def trial_pid(stack, experiment: str, trial_id: str) -> int | None:
    """The trial's pid once its keeper started it (None before: no directory or state yet)."""
    found = list((stack.root / "data").glob(f"local-gpu/*/trials/{experiment}/{trial_id}-0/.trialbus/state.json"))
    with contextlib.suppress(OSError, ValueError):
        return found and json.loads(found[0].read_text()).get("trialPid") or None
    return None


def test_a_keeper_keeps_trial_after_trial_and_a_late_stop_reaches_none_of_its_next(stack, code_dir, run_log):
    experiment = create(stack, config(code_dir, trialConcurrency=1))

    # Given trials one after the other, each with its own outcome: once their template settled
    # (a fuller one replaces the first after the first trial, with the keepers it forks), one
    # keeper keeps trial after trial
    def keeper_of(trial_id: str) -> int:
        return state_of(stack, experiment, trial_id)["keeperPid"]

    ids: list[str] = []
    for x in range(1, 9):
        ids.append(submit(stack, experiment, {"x": x}))
        assert ended(stack, ids[-1])["finalMetric"]["default"] == x and warm_of(stack, experiment, ids[-1])
        if len(ids) >= 3 and keeper_of(ids[-1]) == keeper_of(ids[-2]) == keeper_of(ids[-3]):
            break
    assert keeper_of(ids[-1]) == keeper_of(ids[-2]) == keeper_of(ids[-3]), [keeper_of(t) for t in ids]
    keeper = keeper_of(ids[-1])
    fds = len(os.listdir(f"/proc/{keeper}/fd"))  # (the keeper waits for its next trial)
    # When its next trial runs and a stop signal meant for one it kept before comes late (no
    # .trialbus/cancel in the running trial's directory, which the adapter writes before it signals)
    running = submit(stack, experiment, {"x": 40, "sleep": 2})
    wait_until(lambda: trial_pid(stack, experiment, running), 30, "the next trial to run")
    assert state_of(stack, experiment, running)["keeperPid"] == keeper
    os.kill(keeper, signal.SIGTERM)
    # Then that trial runs on to its end, and the keeper holds no more descriptors than before it
    assert ended(stack, running, 30)["finalMetric"]["default"] == 40
    wait_until(lambda: len(os.listdir(f"/proc/{keeper}/fd")) == fds, 5, "the keeper to close what the trial used")
    # When a trial it keeps is cancelled
    canceled = submit(stack, experiment, {"x": 50, "sleep": 300})
    wait_until(lambda: trial_pid(stack, experiment, canceled), 30, "the trial to run")
    assert stack.rest("POST", f"/trials/{canceled}/cancel").status_code == 202
    # Then it stops, and its keeper ends with it: a stop's second signal could come late
    assert ended(stack, canceled, 20)["status"] == "USER_CANCELED"
    wait_until(
        lambda: not psutil.pid_exists(keeper) or psutil.Process(keeper).status() == psutil.STATUS_ZOMBIE,
        10,
        "the keeper of a cancelled trial to end",
    )
    after = submit(stack, experiment, {"x": 60})
    assert ended(stack, after)["finalMetric"]["default"] == 60
    assert state_of(stack, experiment, after)["keeperPid"] != keeper


def test_warm_start_is_refused_with_a_clear_error_when_misconfigured(stack, code_dir):
    reply = stack.rest("POST", "/experiments", json=config(code_dir, warmStart={"preload": ["not a module"]}))
    assert reply.status_code == 422 and "not a Python module name: 'not a module'" in reply.text
    assert trial(stack, "nothere").get("status") is None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
