"""The trial keeper as adapters run it: ``python -S -I trial_keeper.py``, a real gateway
process, a real nats-server, and NNI-style trials that use the ``nni`` shim: the trial's
channels, exit codes and signals (how its records reach the gateway: ``test_keeper_delivery.py``).
"""

from __future__ import annotations

import shlex
import signal
import sys
import time

from tests.fixtures.keeper import (  # noqa: F401 - fixtures: running, gateway, nats_url, code_dir
    EXPECTED,
    PARAMETERS,
    Trial,
    code_dir_fixture,
    gateway_fixture,
    group_is_gone,
    nats_url_fixture,
    running_fixture,
    stored,
    summary,
)


def test_file_channel_trial_reports_through_the_gateway(tmp_path, code_dir, gateway, nats_url):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tfile1")
    assert trial.wait() == 0
    state = trial.state
    assert state["done"] is True and state["metricsFlushed"] is True
    assert (state["exitCode"], state["canceled"], state["error"]) == (0, False, None)
    assert state["startTime"] <= state["endTime"] and state["pgid"] == state["trialPid"]
    assert summary(stored(nats_url, "Tfile1")) == EXPECTED
    # The trial saw NNI's environment and the gateway's address (to ask its tuner, docs/optuna.md), never the
    # keeper's secrets (its TRIALBUS_TRIAL_TOKEN), in its code directory
    out = trial.read("stdout")
    assert (
        "env ['MULTI_PHASE', 'NNI_CODE_DIR', 'NNI_EXP_ID', 'NNI_OUTPUT_DIR', 'NNI_PLATFORM', 'NNI_SYS_DIR', "
        "'NNI_TRIAL_JOB_ID', 'NNI_TRIAL_SEQ_ID', 'TRIALBUS_GATEWAY_URL']" in out
    )
    assert "TRIAL_TOKEN" not in out
    assert f"cwd {code_dir}" in out
    assert trial.read("stderr") == "to stderr\n"
    assert "lastError" not in state  # a trial that succeeded has nothing to explain
    assert trial.read("parameter.cfg") == PARAMETERS
    exit_code, millis = trial.read(".nni/state").split()
    assert exit_code == "0" and abs(int(millis) / 1000 - state["endTime"]) < 1
    assert not (trial.dir / ".trialbus" / "keeper.log").exists()  # nothing went wrong: nothing to log


def test_stdout_channel_trial_reports_through_the_gateway(tmp_path, code_dir, gateway, nats_url):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tout1", TRIALBUS_NNI_PLATFORM="remote", TRIALBUS_GPUS="")
    assert trial.wait() == 0
    assert trial.state["metricsFlushed"] is True
    assert summary(stored(nats_url, "Tout1")) == EXPECTED
    assert trial.read("stdout").count("NNISDK_MEb'") == 4  # the output is kept whole
    assert "CUDA_VISIBLE_DEVICES" in trial.read("stdout")
    assert not (trial.dir / ".nni" / "metrics").exists()
    assert trial.read(".nni/state").startswith("0 ")  # NNI's layout all the same


def test_exit_codes_are_recorded(tmp_path, code_dir, gateway):
    failed = Trial(tmp_path, code_dir, gateway.url, "Texit3", TRIAL_EXIT="3")
    killed = Trial(tmp_path, code_dir, gateway.url, "Tsig9", command="kill -9 $$")
    assert failed.wait() == 3
    assert (failed.state["exitCode"], failed.state["metricsFlushed"]) == (3, True)
    assert failed.read(".nni/state").startswith("3 ")
    assert killed.wait() == 128 + 9
    assert killed.state["exitCode"] == -9
    assert killed.read(".nni/state").startswith("-9 ")


def test_a_plain_command_runs_without_a_shell(tmp_path, code_dir, gateway):
    (code_dir / "pid.py").write_text("import os\nprint(os.getpid())\n")
    trial = Trial(tmp_path, code_dir, gateway.url, "Tdirect", command=f"{shlex.quote(sys.executable)} pid.py")
    assert trial.wait() == 0
    assert int(trial.read("stdout")) == trial.state["trialPid"]  # the program itself, no /bin/sh between


def test_a_command_that_needs_a_shell_gets_one(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tshell", command='echo "$NNI_TRIAL_JOB_ID" | tr a-z A-Z')
    assert trial.wait() == 0
    assert trial.read("stdout") == "TSHELL\n"


def test_an_unknown_program_fails_127_with_the_shells_message(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tmissing", command="no-such-program-x1 --lr 0.1")
    assert trial.wait() == 127
    assert "no-such-program-x1" in trial.read("stderr") and "not found" in trial.read("stderr")
    assert trial.state["exitCode"] == 127
    assert "no-such-program-x1" in trial.state["lastError"] and "not found" in trial.state["lastError"]


def test_a_failed_trial_records_its_last_stderr_line(tmp_path, code_dir, gateway):
    missing = Trial(
        tmp_path,
        code_dir,
        gateway.url,
        "Timport",
        command=f"{shlex.quote(sys.executable)} -c 'import no_such_module_xyz'",
    )
    long = Trial(
        tmp_path,
        code_dir,
        gateway.url,
        "Tlong",
        command="for i in 1 2 3; do echo line $i >&2; done; printf '%0300d\\n\\n  \\n' 7 >&2; exit 2",
    )
    assert missing.wait() == 1 and long.wait() == 2
    assert missing.state["lastError"] == "ModuleNotFoundError: No module named 'no_such_module_xyz'"
    assert missing.state["lastError"] == missing.read("stderr").strip().splitlines()[-1]
    assert long.state["lastError"] == "0" * 199 + "7"  # the last non-empty line's end, 200 characters


def test_what_the_trial_leaves_behind_is_killed(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Torphan", command="sleep 300 & echo started")
    assert trial.wait() == 0
    assert trial.read("stdout") == "started\n"
    assert group_is_gone(trial.state["pgid"])


def test_sigterm_stops_the_whole_group(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tterm", command="sleep 300 & sleep 300 & echo up; wait")
    trial.wait_for(lambda: (trial.dir / "stdout").exists() and trial.read("stdout") == "up\n")
    trial.proc.send_signal(signal.SIGTERM)
    assert trial.wait(10) == 128 + signal.SIGTERM
    state = trial.state
    assert (state["canceled"], state["exitCode"], state["done"]) == (True, -signal.SIGTERM, True)
    assert group_is_gone(state["pgid"])


def test_a_trial_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, code_dir, gateway):
    trial = Trial(tmp_path, code_dir, gateway.url, "Tstub", command="trap '' TERM; echo up; sleep 300")
    trial.wait_for(lambda: (trial.dir / "stdout").exists() and trial.read("stdout") == "up\n")
    started = time.monotonic()
    trial.proc.send_signal(signal.SIGINT)
    assert trial.wait(10) == 128 + signal.SIGKILL
    assert 0.4 < time.monotonic() - started < 5  # TRIALBUS_KILL_GRACE=0.5
    assert (trial.state["canceled"], trial.state["exitCode"]) == (True, -signal.SIGKILL)
    assert group_is_gone(trial.state["pgid"])


def test_two_stop_signals_at_once_are_one_stop_and_a_later_one_kills_at_once(tmp_path, code_dir, gateway):
    # In a container the keeper may get a pod's SIGTERM twice (its group's, and its task shell's, passed on)
    trial = Trial(
        tmp_path, code_dir, gateway.url, "Ttwice", command="trap '' TERM; echo up; sleep 300", TRIALBUS_KILL_GRACE="3"
    )
    trial.wait_for(lambda: (trial.dir / "stdout").exists() and trial.read("stdout") == "up\n")
    trial.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    trial.proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)
    assert trial.proc.poll() is None, "the second signal of one stop must not cut the grace period short"
    stopped = time.monotonic()
    trial.proc.send_signal(signal.SIGTERM)  # a second stop, later: the user insists
    assert trial.wait(10) == 128 + signal.SIGKILL
    assert time.monotonic() - stopped < 1.0
    assert group_is_gone(trial.state["pgid"])
