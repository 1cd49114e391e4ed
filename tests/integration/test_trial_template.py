"""The trial template (``trial_template.py``, ``warm_trial.py``): real templates forking real keepers
and trials, compared with the same trials started cold (``python -S -I trial_keeper.py``)."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.nni import nni_sdk
from tests.fixtures.warm import PYTHON, Host, code, host  # noqa: F401 - fixtures


def comparable(probe: dict) -> dict:
    """A probe without what differs between any two runs (ids, directories)."""
    per_trial = ("NNI_TRIAL_JOB_ID", "NNI_SYS_DIR", "NNI_OUTPUT_DIR", "NNI_TRIAL_SEQ_ID")
    probe = dict(probe, env={k: v for k, v in probe["env"].items() if k not in per_trial})
    return {k: v for k, v in probe.items() if k not in ("trial", "seq", "extra_fds")}


@pytest.mark.parametrize("args", ["", "a b"])
def test_a_warm_trial_sees_what_a_cold_one_sees(host, code, args):
    command = f"{PYTHON} probe.py {args}".strip()
    cold, warm = host.cold(command), host.warm(command)
    assert cold.wait()["exitCode"] == 0 and warm.wait()["exitCode"] == 0
    assert warm.state()["warm"] is True and "warm" not in cold.state()
    cold_probe, warm_probe = cold.probe(), warm.probe()
    assert comparable(warm_probe) == comparable(cold_probe)
    assert warm_probe["argv"] == ["probe.py", *args.split()] and warm_probe["name"] == "__main__"
    assert warm_probe["path0"] == str(code) and warm_probe["file"] == f"{code}/probe.py"
    assert warm_probe["trial"] == f"trial{host.count}" and warm_probe["seq"] == host.count
    assert warm_probe["env"]["NNI_SYS_DIR"] == str(warm.dir) and warm_probe["params"] == {"x": 2}
    assert warm_probe["fds"] == [0, 1, 2] and warm_probe["extra_fds"] == []  # nothing of the keeper's or template's
    assert warm_probe["pgid_is_pid"] and warm_probe["sid_is_pid"] and warm_probe["stdin"] == "/dev/null"
    assert [dict(m, trial_job_id="") for m in warm.metrics()] == [dict(m, trial_job_id="") for m in cold.metrics()]
    assert warm.metrics()[0]["trial_job_id"] == f"trial{host.count}"


def test_python_dash_m_runs_the_module_as_main(host, code):
    cold, warm = host.cold(f"{PYTHON} -m probe x"), host.warm(f"{PYTHON} -m probe x")
    assert cold.wait()["exitCode"] == warm.wait()["exitCode"] == 0
    assert comparable(warm.probe()) == comparable(cold.probe())
    assert warm.probe()["argv"] == [f"{code}/probe.py", "x"]


@pytest.mark.parametrize(
    ("mode", "status", "stderr"),
    [
        ("exit3", 3, ""),
        ("os_exit", 7, ""),
        ("raise", 1, "ValueError: trial failed on purpose"),
        ("message", 1, "a message for stderr"),
    ],
)
def test_exit_codes_and_tracebacks_are_those_of_a_cold_run(host, mode, status, stderr):
    cold, warm = host.cold(f"{PYTHON} probe.py {mode}"), host.warm(f"{PYTHON} probe.py {mode}")
    assert cold.wait()["exitCode"] == warm.wait()["exitCode"] == status
    assert warm.err() == cold.err()  # the same traceback: no frame of the template in it
    assert stderr in warm.err()


def test_a_crash_in_one_trial_touches_no_other(host, code):
    (code / "crash.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    crashed = host.warm(f"{PYTHON} crash.py")
    assert crashed.wait()["exitCode"] == -signal.SIGSEGV
    after = host.warm(f"{PYTHON} probe.py")
    assert after.wait()["exitCode"] == 0 and after.template == crashed.template


def test_sibling_trials_get_distinct_random_streams(host, code):
    sdk = nni_sdk()
    (code / "rand.py").write_text(
        "import random, numpy, torch\n"
        "print(random.random(), numpy.random.rand(), torch.rand(1).item(), torch.initial_seed())\n"
    )
    host.env["PYTHONPATH"] = str(sdk)
    trials = [host.warm(f"{PYTHON} rand.py", preload=["numpy", "torch"]) for _ in range(3)]
    outs = [t.wait() and t.out().split() for t in trials]
    assert all(t.state()["exitCode"] == 0 for t in trials), trials[0].err()
    for column in range(4):
        assert len({out[column] for out in outs}) == 3, f"column {column} repeats across siblings: {outs}"


def test_global_state_of_one_trial_never_reaches_the_next(host, code):
    (code / "dirty.py").write_text(
        textwrap.dedent("""
        import json, os, sys
        print(json.dumps([hasattr(json, "left_behind"), os.environ.get("LEFT_BEHIND"), "left_mod" in sys.modules]))
        json.left_behind = True
        os.environ["LEFT_BEHIND"] = "yes"
        sys.modules["left_mod"] = sys
        open("/proc/self/stat")  # a descriptor left open
    """)
    )
    first, second = host.warm(f"{PYTHON} dirty.py"), host.warm(f"{PYTHON} dirty.py")
    assert first.wait()["exitCode"] == second.wait()["exitCode"] == 0
    assert json.loads(first.out()) == json.loads(second.out()) == [False, None, False]


ENV_DUMP = "import json, os\nprint(json.dumps(dict(os.environ), sort_keys=True))\n"


@pytest.mark.parametrize("import_sets_env", [False, True])
def test_a_warm_trial_has_the_whole_environment_of_a_cold_one(code, tmp_path, import_sets_env):
    # Whatever a preloaded import did to the environment is undone in each trial, and what the pool
    # sets for the template alone (LD_BIND_NOW) never reaches one.
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "envmod.py").write_text(
        "import os\nos.environ['SET_BY_IMPORT'] = '1'\nos.environ.pop('USER_GONE', None)\n"
        "os.environ['USER_KEPT'] = 'changed'\n"
        if import_sets_env
        else ""
    )
    (code / "env.py").write_text(ENV_DUMP)
    host = Host(tmp_path / "envhost", code, env={"PYTHONPATH": str(lib), "USER_GONE": "here", "USER_KEPT": "kept"})
    try:
        command = f"{PYTHON} env.py"
        cold = host.cold(command, TRIALBUS_GPUS="1", TRIALBUS_ATTEMPT="2")
        first = host.warm(command, preload=["envmod"], TRIALBUS_GPUS="1", TRIALBUS_ATTEMPT="2")
        second = host.warm(command, preload=["envmod"])  # no GPU, no attempt: none of the first's
        for trial in (cold, first, second):
            assert trial.wait()["exitCode"] == 0, trial.err()
        assert first.state()["warm"] is True and second.state()["warm"] is True
        per_trial = ("NNI_TRIAL_JOB_ID", "NNI_SYS_DIR", "NNI_OUTPUT_DIR", "NNI_TRIAL_SEQ_ID")
        envs = [{k: v for k, v in json.loads(t.out()).items() if k not in per_trial} for t in (cold, first, second)]
        assert envs[1] == envs[0]
        assert envs[0]["CUDA_VISIBLE_DEVICES"] == "1" and envs[0]["TRIALBUS_ATTEMPT"] == "2"
        assert envs[0]["USER_GONE"] == "here" and envs[0]["USER_KEPT"] == "kept" and "SET_BY_IMPORT" not in envs[0]
        without = {k: v for k, v in envs[0].items() if k not in ("CUDA_VISIBLE_DEVICES", "TRIALBUS_ATTEMPT")}
        assert envs[2] == without
        assert json.loads(second.out())["NNI_SYS_DIR"] == str(second.dir)
    finally:
        host.pool.close()


def test_a_code_change_between_trials_runs_the_new_code(host, code):
    (code / "helper.py").write_text("VERSION = 1\n")
    (code / "versioned.py").write_text("import helper\nprint('script 1 helper', helper.VERSION)\n")
    first = host.warm(f"{PYTHON} versioned.py")
    first.wait()
    (code / "helper.py").write_text("VERSION = 2\n")
    (code / "versioned.py").write_text("import helper\nprint('script 2 helper', helper.VERSION)\n")
    host.pool.learn(first.template, str(first.dir))  # what the adapter does at a trial's end
    second = host.warm(f"{PYTHON} versioned.py")
    second.wait()
    assert first.out() == "script 1 helper 1\n" and second.out() == "script 2 helper 2\n"
    listed = first.dir / ".trialbus/imports"
    assert "helper" not in (listed.read_text().split() if listed.exists() else [])  # own code: never preloaded


def test_numpy_sklearn_and_torch_work_in_forked_trials(host, code):
    host.env["PYTHONPATH"] = str(nni_sdk())
    (code / "work.py").write_text(
        textwrap.dedent("""
        import numpy, torch
        from sklearn.datasets import load_digits
        from sklearn.svm import SVC
        a = numpy.random.rand(300, 300)
        x = torch.randn(300, 300)
        digits = load_digits()
        score = SVC().fit(digits.data[:1000], digits.target[:1000]).score(digits.data[1000:], digits.target[1000:])
        print(round(float((a @ a).sum()) > 0, 3), round(float((x @ x).abs().sum()) > 0, 3), round(score, 4))
    """)
    )
    preload = ["numpy", "torch", "sklearn.datasets", "sklearn.svm"]
    trials = [host.warm(f"{PYTHON} work.py", preload=preload) for _ in range(3)]  # at once: BLAS threads in each
    cold = host.cold(f"{PYTHON} work.py", PYTHONPATH=str(nni_sdk()))
    for trial in [*trials, cold]:
        assert trial.wait(120)["exitCode"] == 0, trial.err()
    assert {t.out() for t in trials} == {cold.out()}


def test_a_code_directory_that_shadows_a_loaded_module_runs_its_own_cold(host, code):
    (code / "json.py").write_text("VALUE = 'the trial folder json'\n")  # the template has loaded the real json
    (code / "own_json.py").write_text("import json\nprint(json.VALUE)\n")
    trial = host.warm(f"{PYTHON} own_json.py")
    assert trial.wait()["exitCode"] == 0, trial.err()
    assert trial.out() == "the trial folder json\n" and trial.err() == ""
    assert "shadows the loaded module json" in (trial.dir / ".trialbus/keeper.log").read_text()


def test_a_warm_trial_ends_as_a_cold_one_threads_atexit_and_unclosed_files(host, code, tmp_path):
    (code / "ending.py").write_text(
        textwrap.dedent("""
        import atexit, sys, threading, time
        out = sys.argv[1]
        left_open = open(out + ".unclosed", "w")
        left_open.write("written, never closed")  # buffered: only the exit flushes it
        def late():
            time.sleep(0.3)
            with open(out + ".thread", "w") as f:
                f.write("thread finished")
        threading.Thread(target=late).start()  # not a daemon: the exit waits for it
        atexit.register(lambda: open(out + ".atexit", "w").write("atexit ran"))
        print("unflushed stdout", end="")
    """)
    )
    for how, start in (("cold", host.cold), ("warm", host.warm)):
        out = tmp_path / how
        trial = start(f"{PYTHON} ending.py {out}")
        assert trial.wait()["exitCode"] == 0, trial.err()
        assert trial.out() == "unflushed stdout", how
        assert Path(f"{out}.unclosed").read_text() == "written, never closed", how
        assert Path(f"{out}.thread").read_text() == "thread finished", how
        assert Path(f"{out}.atexit").read_text() == "atexit ran", how


def test_multiprocessing_works_in_a_warm_trial_with_every_start_method(host, code):
    (code / "pool.py").write_text(
        textwrap.dedent("""
        import multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":  # spawn and forkserver import this script again as __mp_main__
            for method in ("spawn", "fork", "forkserver"):
                with mp.get_context(method).Pool(2) as pool:
                    print(method, pool.map(square, range(4)))
    """)
    )
    trial = host.warm(f"{PYTHON} pool.py")
    assert trial.wait(60)["exitCode"] == 0, trial.err()
    assert trial.out() == "spawn [0, 1, 4, 9]\nfork [0, 1, 4, 9]\nforkserver [0, 1, 4, 9]\n"
