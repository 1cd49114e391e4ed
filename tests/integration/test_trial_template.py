"""The trial template as adapters use it (``WarmPool``): real template processes forking real
keepers and trials, compared with the same trials started cold (``python -S -I trial_keeper.py``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.adapters.local_gpu import client
from services.trial_keeper import KEEPER_PATH, SHIM_PATH
from services.trial_keeper.warm_pool import WarmPool
from tests.fixtures.nni import nni_sdk

PYTHON = sys.executable
PARAMETERS = '{"parameter_id": 1, "parameter_source": "algorithm", "parameters": {"x": 2}, "parameter_index": 0}'

# What a trial sees of its process: everything a cold start fixes, as JSON on stdout.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    import nni
    first = {"modules_at_start": sorted(m for m in ("json_probe_mod", "numpy", "heavy") if m in sys.modules)}
    params = nni.get_next_parameter()
    def target(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None  # the descriptor listdir itself used
    fds = {fd: target(fd) for fd in sorted(int(fd) for fd in os.listdir("/proc/self/fd"))}
    print(json.dumps({
        **first, "argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__, "params": params,
        "trial": nni.get_trial_id(), "seq": nni.get_sequence_id(), "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NNI_", "CUDA_", "TRIALBUS_", "MULTI_", "USER_"))},
        "fds": [fd for fd in fds if fd < 3], "extra_fds": [t for fd, t in fds.items() if fd > 2 and t],
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "sid_is_pid": os.getsid(0) == os.getpid(), "stdin": os.readlink("/proc/self/fd/0"),
        "sigint": str(__import__("signal").getsignal(2)), "sigterm": str(__import__("signal").getsignal(15)),
    }), flush=True)
    nni.report_final_result(params["x"] * 10)
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "exit3":
        sys.exit(3)
    if mode == "os_exit":
        os._exit(7)
    if mode == "raise":
        raise ValueError("trial failed on purpose")
    if mode == "message":
        sys.exit("a message for stderr")
    """
)


class Host:
    """Trials on this host, warm (through a WarmPool) or cold (a keeper spawned per trial)."""

    def __init__(self, root: Path, code: Path, env: dict[str, str] | None = None) -> None:
        self.root, self.code, self.count = root, code, 0
        self.logs: list[str] = []
        self.pool = WarmPool(root / "templates", str(KEEPER_PATH), self.logs.append, shim=str(SHIM_PATH))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
        self.env.update(TRIALBUS_PYTHONPATH_PREPEND=str(SHIM_PATH), TRIALBUS_CODE_DIR=str(code),
                        TRIALBUS_EXPERIMENT_ID="exp1", **(env or {}))  # fmt: skip

    def environ(self, command: str, **extra: str) -> tuple[str, dict[str, str]]:
        self.count += 1
        trial_dir = self.root / f"t{self.count}"
        (trial_dir / ".trialbus").mkdir(parents=True)
        environ = dict(self.env, TRIALBUS_TRIAL_DIR=str(trial_dir), TRIALBUS_TRIAL_COMMAND=command,
                       TRIALBUS_TRIAL_ID=f"trial{self.count}", TRIALBUS_SEQUENCE_ID=str(self.count),
                       TRIALBUS_PARAMETERS=PARAMETERS, **extra)  # fmt: skip
        return str(trial_dir), environ

    def warm(self, command: str, preload=(), **extra: str) -> Trial:
        trial_dir, environ = self.environ(command, **extra)
        template = self.pool.template_for(command, environ, preload)
        assert template is not None, f"{command!r} should start warm"
        assert template.wait_ready(60), f"template not ready: {template.state} {self.template_log(template)}"
        return Trial(trial_dir, template.fork(environ), template.key)

    def cold(self, command: str, **extra: str) -> Trial:
        trial_dir, environ = self.environ(command, **extra)
        return Trial(trial_dir, client.spawn_keeper(PYTHON, str(KEEPER_PATH), environ, trial_dir), None)

    @staticmethod
    def template_log(template) -> str:
        path = template.folder / "template.log"
        return path.read_text() if path.exists() else ""


class Trial:
    def __init__(self, trial_dir: str, keeper_pid: int, template: str | None) -> None:
        self.dir, self.keeper_pid, self.template = Path(trial_dir), keeper_pid, template

    def state(self) -> dict:
        try:
            return json.loads((self.dir / ".trialbus/state.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait(self, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while not self.state().get("done"):
            assert time.monotonic() < deadline, f"trial in {self.dir} did not end: {self.state()}"
            time.sleep(0.01)
        with __import__("contextlib").suppress(ChildProcessError):
            os.waitpid(self.keeper_pid, 0)  # a cold keeper is our child
        return self.state()

    def out(self) -> str:
        return (self.dir / "stdout").read_text()

    def err(self) -> str:
        return (self.dir / "stderr").read_text()

    def probe(self) -> dict:
        return json.loads(self.out().splitlines()[0])

    def metrics(self) -> list[dict]:
        frames = (self.dir / ".nni/metrics").read_bytes().split(b"ME")[1:]
        return [json.loads(frame[6:]) for frame in frames]


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    return code


@pytest.fixture
def host(tmp_path: Path, code: Path):
    host = Host(tmp_path / "host", code)
    yield host
    host.pool.close()


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
    [("exit3", 3, ""), ("os_exit", 7, ""), ("raise", 1, "ValueError: trial failed on purpose"),
     ("message", 1, "a message for stderr")],
)  # fmt: skip
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
    (code / "dirty.py").write_text(textwrap.dedent("""
        import json, os, sys
        print(json.dumps([hasattr(json, "left_behind"), os.environ.get("LEFT_BEHIND"), "left_mod" in sys.modules]))
        json.left_behind = True
        os.environ["LEFT_BEHIND"] = "yes"
        sys.modules["left_mod"] = sys
        open("/proc/self/stat")  # a descriptor left open
    """))  # fmt: skip
    first, second = host.warm(f"{PYTHON} dirty.py"), host.warm(f"{PYTHON} dirty.py")
    assert first.wait()["exitCode"] == second.wait()["exitCode"] == 0
    assert json.loads(first.out()) == json.loads(second.out()) == [False, None, False]


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


def test_the_template_learns_what_trials_import(host, code, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "heavy.py").write_text("import time\ntime.sleep(0.3)  # an import worth preloading\n")
    host.env["PYTHONPATH"] = str(site)
    (code / "uses_heavy.py").write_text("import sys\nprint('heavy' in sys.modules)\nimport heavy\n")
    first = host.warm(f"{PYTHON} uses_heavy.py")
    first.wait()
    assert first.out() == "False\n"
    assert "heavy" in (first.dir / ".trialbus/imports").read_text().split()
    host.pool.learn(first.template, str(first.dir))
    fuller = host.pool.next[first.template]
    assert fuller.wait_ready(30), host.template_log(fuller)
    second = host.warm(f"{PYTHON} uses_heavy.py")  # swapped in: the first template is retired
    second.wait()
    assert second.out() == "True\n"
    assert not (second.dir / ".trialbus/imports").exists()  # nothing new to learn


def test_a_template_that_dies_is_replaced_and_said(host, code):
    first = host.warm(f"{PYTHON} probe.py")
    first.wait()
    guessed = host.pool.next.pop(first.template)  # the one its imports, read ahead, would bring
    guessed.close()
    template = host.pool.current[first.template]
    os.kill(template.process.pid, signal.SIGKILL)
    template.process.wait()
    _, environ = host.environ(f"{PYTHON} probe.py")
    with pytest.raises(OSError):
        template.fork(environ)  # what the adapter then does: start the trial cold
    second = host.warm(f"{PYTHON} probe.py")
    assert second.wait()["exitCode"] == 0
    assert any("is gone" in line for line in host.logs)


def test_commands_that_are_not_a_python_script_start_cold(host, code):
    for command in ("/bin/echo hi", f"{PYTHON} -c print(1)", f"{PYTHON} probe.py > out.txt", "probe.py",
                    f"{PYTHON} -i probe.py"):  # fmt: skip
        _, environ = host.environ(command)
        assert host.pool.template_for(command, environ) is None, command


def test_a_different_interpreter_or_environment_gets_its_own_template(host, code):
    a = host.warm(f"{PYTHON} probe.py")
    b = host.warm(f"{PYTHON} -u probe.py")
    c = host.warm(f"{PYTHON} probe.py", USER_SETTING="1")
    d = host.warm(f"{PYTHON} probe.py", TRIALBUS_GPUS="0")  # GPU placement is per trial: same template
    assert all(t.wait()["exitCode"] == 0 for t in (a, b, c, d))
    assert len({a.template, b.template, c.template}) == 3 and d.template == a.template
    assert c.probe()["env"]["USER_SETTING"] == "1" and d.probe()["env"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_an_import_that_opens_a_gpu_is_never_preloaded(host, code, tmp_path):
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("making a stand-in GPU device file needs root")
    device = Path(f"/dev/nvidia-trialbus-test-{os.getpid()}")
    device.write_bytes(b"")
    try:
        site = tmp_path / "site"
        site.mkdir()
        (site / "gpu_init.py").write_text(f"HANDLE = open({str(device)!r})  # as cuInit opens /dev/nvidiactl\n")
        host.env["PYTHONPATH"] = str(site)
        (code / "uses_gpu.py").write_text("import sys\nprint('gpu_init' in sys.modules)\nimport gpu_init\n")
        _, environ = host.environ(f"{PYTHON} uses_gpu.py")
        template = host.pool.template_for(f"{PYTHON} uses_gpu.py", environ, ["gpu_init"])
        assert not template.wait_ready(30) and template.unsafe == "gpu_init"
        trial = host.warm(f"{PYTHON} uses_gpu.py")  # the next template leaves it out
        assert trial.wait()["exitCode"] == 0 and trial.out() == "False\n"
        assert any("gpu_init" in line for line in host.logs)
    finally:
        device.unlink()


def test_numpy_sklearn_and_torch_work_in_forked_trials(host, code):
    host.env["PYTHONPATH"] = str(nni_sdk())
    (code / "work.py").write_text(textwrap.dedent("""
        import numpy, torch
        from sklearn.datasets import load_digits
        from sklearn.svm import SVC
        a = numpy.random.rand(300, 300)
        x = torch.randn(300, 300)
        digits = load_digits()
        score = SVC().fit(digits.data[:1000], digits.target[:1000]).score(digits.data[1000:], digits.target[1000:])
        print(round(float((a @ a).sum()) > 0, 3), round(float((x @ x).abs().sum()) > 0, 3), round(score, 4))
    """))  # fmt: skip
    preload = ["numpy", "torch", "sklearn.datasets", "sklearn.svm"]
    trials = [host.warm(f"{PYTHON} work.py", preload=preload) for _ in range(3)]  # at once: BLAS threads in each
    cold = host.cold(f"{PYTHON} work.py", PYTHONPATH=str(nni_sdk()))
    for trial in [*trials, cold]:
        assert trial.wait(120)["exitCode"] == 0, trial.err()
    assert {t.out() for t in trials} == {cold.out()}


def test_a_template_that_cannot_start_is_given_up_and_its_trials_start_cold(host, code, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "crasher.py").write_text("import os\nos._exit(9)  # kills whatever imports it\n")
    host.env["PYTHONPATH"] = str(site)
    command = f"{PYTHON} probe.py"
    for _ in range(2):
        _, environ = host.environ(command)
        template = host.pool.template_for(command, environ, ["crasher"])
        assert template is not None and not template.wait_ready(30)
    _, environ = host.environ(command)
    assert host.pool.template_for(command, environ, ["crasher"]) is None  # cold from now on
    assert any("failed to start twice" in line and "template.log" in line for line in host.logs), host.logs
    trial = host.cold(command)  # what the adapter then does
    assert trial.wait()["exitCode"] == 0


def test_a_code_directory_that_shadows_a_loaded_module_runs_its_own_cold(host, code):
    (code / "json.py").write_text("VALUE = 'the trial folder json'\n")  # the template has loaded the real json
    (code / "own_json.py").write_text("import json\nprint(json.VALUE)\n")
    trial = host.warm(f"{PYTHON} own_json.py")
    assert trial.wait()["exitCode"] == 0, trial.err()
    assert trial.out() == "the trial folder json\n" and trial.err() == ""
    assert "shadows the loaded module json" in (trial.dir / ".trialbus/keeper.log").read_text()


def test_a_warm_trial_ends_as_a_cold_one_threads_atexit_and_unclosed_files(host, code, tmp_path):
    (code / "ending.py").write_text(textwrap.dedent("""
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
    """))  # fmt: skip
    for how, start in (("cold", host.cold), ("warm", host.warm)):
        out = tmp_path / how
        trial = start(f"{PYTHON} ending.py {out}")
        assert trial.wait()["exitCode"] == 0, trial.err()
        assert trial.out() == "unflushed stdout", how
        assert Path(f"{out}.unclosed").read_text() == "written, never closed", how
        assert Path(f"{out}.thread").read_text() == "thread finished", how
        assert Path(f"{out}.atexit").read_text() == "atexit ran", how


def test_the_scripts_own_imports_are_read_ahead_for_the_next_template(host, code, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "slow_import.py").write_text("import time\ntime.sleep(0.2)\n")
    host.env["PYTHONPATH"] = str(site)
    runs = tmp_path / "model-runs"
    (code / "model.py").write_text(f"import slow_import\nopen({str(runs)!r}, 'a').write('ran\\n')\n")  # own code: read
    (code / "reads.py").write_text("import sys\nprint('slow_import' in sys.modules)\nimport model\n")
    _, environ = host.environ(f"{PYTHON} reads.py")
    bare = host.pool.template_for(f"{PYTHON} reads.py", environ)
    guessed = host.pool.next[bare.key]  # started at once, before any trial ran
    assert guessed.wait_ready(30) and "slow_import" in guessed.preload and "model" in guessed.preload
    trial = host.warm(f"{PYTHON} reads.py")
    assert trial.wait()["exitCode"] == 0 and trial.out() == "True\n"
    assert runs.read_text() == "ran\n"  # by the trial only: the template never runs the trial's code


def test_multiprocessing_works_in_a_warm_trial_with_every_start_method(host, code):
    (code / "pool.py").write_text(textwrap.dedent("""
        import multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":  # spawn and forkserver import this script again as __mp_main__
            for method in ("spawn", "fork", "forkserver"):
                with mp.get_context(method).Pool(2) as pool:
                    print(method, pool.map(square, range(4)))
    """))  # fmt: skip
    trial = host.warm(f"{PYTHON} pool.py")
    assert trial.wait(60)["exitCode"] == 0, trial.err()
    assert trial.out() == "spawn [0, 1, 4, 9]\nfork [0, 1, 4, 9]\nforkserver [0, 1, 4, 9]\n"
