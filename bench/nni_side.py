"""NNI 3.0 itself running a real scikit-learn workload: the figure Trialbus's is printed beside.

The workload is NNI's own example (``examples/trials/sklearn/classification``): an SVC on
scikit-learn's digits, five hyper-parameters, tuned by TPE (as the example's config does, and
as the Trialbus side runs it). Its first line notes the wall clock and the CPU its process has
spent so far, and it reports, with its score, that CPU and the CPU of its imports and of its
work (:class:`TrialTimes`): where a warm start saves, and where it cannot.

Both sides run the trial with one interpreter, :func:`trial_python`: a venv of the bench's base
Python that imports ``nni`` and scikit-learn from ``.nni-sdk`` through a ``.pth`` file (the
bench's own venv holds only our shim, and ``.nni-sdk`` must never be on the stack's
``PYTHONPATH``: its services would import those packages). NNI runs through its Python API,
``Experiment('local')``, in a subprocess of that interpreter (nnictl-free).

The clock starts just before ``experiment.start()`` and stops at the last trial's end as NNI
records it: NNI's manager start-up (a node process, its REST server, the tuner's process) is
part of NNI's cost, as submitting the experiment is the start on the Trialbus side. Nothing of
NNI outlives a call, error or Ctrl-C included: the driver and NNI's manager (with its tuner and
trials, which share its process group) are each killed by process group at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from trialbus.stack.processes import free_port

SDK = Path(__file__).resolve().parents[1] / ".nni-sdk"

#: The first line of a timed trial: the wall clock, and the CPU its process spent before the line
#: (a cold trial: the interpreter's start and ``site``; a forked one: its set-up since the fork, as
#: a child's CPU counters start at zero). ``FINAL`` is what it reports beside its ``default``.
FIRST_LINE = "import time; STARTED, CPU_AT_START = time.time(), time.process_time()\n"
_FINAL = (
    '"started": STARTED, "cpu_before": CPU_AT_START, "cpu_imports": CPU_IMPORTED - CPU_AT_START, '
    '"cpu_work": time.process_time() - CPU_IMPORTED, "reported": time.time()'
)

SKLEARN_TRIAL = FIRST_LINE + textwrap.dedent(
    """
    # Scores one SVC configuration on scikit-learn's handwritten digits (NNI's sklearn classification example).
    import nni
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    CPU_IMPORTED = time.process_time()
    digits = load_digits()
    x_fit, x_held, y_fit, y_held = train_test_split(digits.data, digits.target, test_size=0.25, random_state=99)
    scaler = StandardScaler().fit(x_fit)  # scaled on the training quarter-three only
    x_fit, x_held = scaler.transform(x_fit), scaler.transform(x_held)

    params = {"C": 1.0, "kernel": "linear", "degree": 3, "gamma": 0.01, "coef0": 0.01}  # what the tuner leaves out
    params.update(nni.get_next_parameter() or {})
    model = SVC()
    for name in ("C", "kernel", "degree", "gamma", "coef0"):
        setattr(model, name, params[name])
    model.fit(x_fit, y_fit)
    nni.report_final_result({"default": model.score(x_held, y_held), FINAL})
    """
).lstrip().replace("FINAL", _FINAL)

#: A no-op trial timed as the sklearn one is: its imports are ``nni``'s alone.
NOOP_TRIAL = FIRST_LINE + textwrap.dedent(
    """
    import nni

    CPU_IMPORTED = time.process_time()
    nni.get_next_parameter()
    nni.report_final_result({"default": 1.0, FINAL})
    """
).lstrip().replace("FINAL", _FINAL)

#: NNI's search space for the example, as its ``search_space.json`` has it.
SKLEARN_SEARCH_SPACE: dict[str, dict] = {
    "C": {"_type": "uniform", "_value": [0.1, 1]},
    "kernel": {"_type": "choice", "_value": ["linear", "rbf", "poly", "sigmoid"]},
    "degree": {"_type": "choice", "_value": [1, 2, 3, 4]},
    "gamma": {"_type": "uniform", "_value": [0.01, 0.1]},
    "coef0": {"_type": "uniform", "_value": [0.01, 0.1]},
}

# Runs under the trial interpreter (argv[1]: the settings as JSON); writes its findings to settings["result"].
# Status is polled every 0.2 s (Experiment.run's own wait polls every 10 s), but the figure is
# taken from the trials' end times NNI records, so the polling period does not enter it.
_DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from nni.experiment import Experiment

    settings = json.loads(sys.argv[1])
    experiment = Experiment("local")
    config = experiment.config
    config.experiment_name = "bench-sklearn"
    config.trial_command = settings["command"]
    config.trial_code_directory = settings["code_dir"]
    config.search_space = settings["search_space"]
    config.tuner.name = settings["tuner"]
    if settings["tuner"] == "TPE":
        config.tuner.class_args = {"optimize_mode": "maximize"}
    config.trial_concurrency = settings["concurrency"]
    config.max_trial_number = settings["trials"]
    config.experiment_working_directory = settings["experiments_dir"]
    begin = time.time()
    try:
        experiment.start(settings["port"])
        started = time.time()
        tuner_log = os.path.join(settings["experiments_dir"], experiment.id, "log", "dispatcher.log")
        status = experiment.get_status()
        while status not in ("DONE", "STOPPED", "ERROR", "TUNER_CRASHED") and time.time() - begin < settings["timeout"]:
            time.sleep(0.2)
            status = experiment.get_status()
            if os.path.exists(tuner_log) and "Traceback" in open(tuner_log).read():
                status = "TUNER_CRASHED"  # its manager would wait for ever
        seen = time.time()
        trials = [(t.trialJobId, t.status, t.startTime, t.endTime,
                   t.finalMetricData[0].data if t.finalMetricData else None) for t in experiment.list_trial_jobs()]
    finally:
        experiment.stop()
    result = {"status": status, "begin": begin, "started": started, "seen": seen, "trials": trials}
    with open(settings["result"], "w") as out:
        json.dump(result, out)
    """
)


@dataclass(frozen=True)
class TrialTimes:
    """What one timed trial reported, with its start and end as its platform recorded them (epoch seconds)."""

    start: float  # the platform's start (Trialbus: the keeper's, right after the spawn or fork)
    end: float
    first_line: float  # the trial's wall clock at its first line
    reported: float  # … as it reported its result (what follows is its exit and the platform's noticing)
    cpu_before: float  # seconds of CPU its process spent before its first line
    cpu_imports: float  # … on its imports (nni; scikit-learn)
    cpu_work: float  # … from there to its report (the data, the training, the score)
    warm: bool = False  # forked from a template (Trialbus's warm start)

    @classmethod
    def parse(cls, metric: Any, start: float, end: float, warm: bool = False) -> TrialTimes | None:
        """From a trial's final metric; None when it is not a timed trial's."""
        if not isinstance(metric, dict) or "cpu_before" not in metric:
            return None
        names = ("started", "reported", "cpu_before", "cpu_imports", "cpu_work")
        first_line, reported, before, imports, work = (float(metric[name]) for name in names)
        return cls(start, end, first_line, reported, before, imports, work, warm)


@dataclass
class NniFigures:
    wall: float  # seconds from just before experiment.start() to the last trial's end
    startup: float  # of which experiment.start(): NNI's manager up, the experiment posted
    succeeded: int
    failed: int  # trials that ended otherwise (FAILED, USER_CANCELED, …)
    failure: str = ""  # the tail of the first failed trial's stderr, where one failed
    trials: list[TrialTimes] = field(default_factory=list)  # the succeeded ones
    crashed: int = 0  # runs before this one lost to a crash of NNI's tuner (TunerCrashed)
    command_wall: float = 0.0  # seconds from its driver's start (a Python importing NNI's API) to the last trial's end


def trial_python(root: Path, sdk: Path = SDK) -> Path:
    """The interpreter of a venv at ``root/trial-venv`` (made once) that imports ``nni`` and
    scikit-learn from ``sdk``: the bench's base Python, no pip, a ``.pth`` naming ``sdk``.

    Raises RuntimeError when ``sdk`` has no nni, or the venv cannot import nni and scikit-learn.
    """
    if not (sdk / "nni" / "__init__.py").exists():
        raise RuntimeError(f"the nni package is missing at {sdk}: `make test` installs it there")
    venv = root / "trial-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)  # the Python the bench's venv was made from
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        (venv / "lib" / version / "site-packages" / "nni-sdk.pth").write_text(f"{sdk.resolve()}\n")
    probe = subprocess.run([str(python), "-c", "import nni, sklearn.svm"], capture_output=True, text=True)
    if probe.returncode:
        raise RuntimeError(f"{python} cannot import nni and scikit-learn from {sdk}:\n{probe.stderr[-2000:]}")
    return python


def write_trial(code_dir: Path, python: Path, text: str = SKLEARN_TRIAL, name: str = "main.py") -> str:
    """Write the trial ``text`` as ``name`` in ``code_dir``; return the command that runs it there."""
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / name).write_text(text)
    return f"{python} {name}"


class TunerCrashed(RuntimeError):
    """NNI's tuner process died mid-run (NNI 3.0's TPE raises KeyError in ``receive_trial_result`` now
    and then: microsoft/nni#5739, #5798); NNI's manager then waits for ever."""


def nni_wall_time(
    code_dir: Path,
    work_dir: Path,
    python: Path,
    trials: int = 40,
    concurrency: int = 4,
    timeout: float = 900,
    attempts: int = 3,
    tuner: str = "TPE",
    text: str = SKLEARN_TRIAL,
    space: dict | None = None,
) -> NniFigures:
    """Run NNI 3.0 (TPE, local) on the sklearn trial in ``code_dir``, ``concurrency`` at a time, until
    ``trials`` have ended (``tuner``: NNI's name for it; ``text``: the trial, ``space``: its search
    space, NNI's example's by default); ``python`` (:func:`trial_python`) runs NNI and the trials;
    NNI's state and logs go under ``work_dir``, nothing to ``~``. A run whose tuner crashed is run again, up to
    ``attempts`` runs in all; :attr:`NniFigures.crashed` counts them.

    Raises RuntimeError, with the tail of NNI's logs, when NNI itself fails, does not finish within
    ``timeout`` seconds, or records fewer trials than asked. Failed trials are counted, not raised.
    """
    command = write_trial(code_dir, python, text)
    # A `timeout` or kill must not leave NNI's node and tuner behind (they have their own sessions).
    term = signal.signal(signal.SIGTERM, _exit) if threading.current_thread() is threading.main_thread() else None
    try:
        attempt = 0
        while True:
            try:
                figures = _run_nni(
                    command,
                    code_dir,
                    work_dir / f"run-{attempt}",
                    python,
                    trials,
                    concurrency,
                    timeout,
                    tuner,
                    space or SKLEARN_SEARCH_SPACE,
                )
            except TunerCrashed:
                attempt += 1
                if attempt == attempts:
                    raise
                continue
            figures.crashed = attempt
            return figures
    finally:
        if term is not None:
            signal.signal(signal.SIGTERM, term)


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run_nni(
    command: str,
    code_dir: Path,
    work_dir: Path,
    python: Path,
    trials: int,
    concurrency: int,
    timeout: float,
    tuner: str = "TPE",
    space: dict | None = None,
) -> NniFigures:
    experiments_dir, home = work_dir / "nni-experiments", work_dir / "nni-home"
    home.mkdir(parents=True, exist_ok=True)
    result, log = work_dir / "nni-result.json", work_dir / "nni-driver.log"
    settings = {
        "command": command,
        "code_dir": str(code_dir.resolve()),
        "search_space": space or SKLEARN_SEARCH_SPACE,
        "tuner": tuner,
        "concurrency": concurrency,
        "trials": trials,
        "experiments_dir": str(experiments_dir.resolve()),
        "port": free_port(),
        "timeout": timeout,
        "result": str(result),
    }
    # HOME and NNI_CONFIG_DIR: NNI keeps its experiment lists in ~/nni-experiments (manager) and
    # the config dir (the Python side, else inside the venv); both go under work_dir instead.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nni comes from the venv's .pth
    env.update(HOME=str(home), NNI_CONFIG_DIR=str(home / "config"))
    launched = time.time()
    with log.open("wb") as out:
        driver = subprocess.Popen(
            [str(python), "-c", _DRIVER, json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            code = driver.wait(timeout + 60)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _end_groups([driver.pid, *_manager_pids(experiments_dir)])
    if code != 0 or not result.exists():
        raise RuntimeError(f"NNI's run failed (driver exit {code}):\n{_tails(log, experiments_dir)}")
    found = json.loads(result.read_text())
    if found["status"] == "TUNER_CRASHED":
        raise TunerCrashed(f"NNI's tuner crashed:\n{_tails(log, experiments_dir)}")
    ended = [t for t in found["trials"] if t[3]]
    if found["status"] != "DONE" or len(ended) < trials:
        raise RuntimeError(
            f"NNI ended {found['status']} with {len(ended)} of {trials} trials ended:\n{_tails(log, experiments_dir)}"
        )
    failed = [t[0] for t in ended if t[1] != "SUCCEEDED"]
    times = [TrialTimes.parse(t[4], t[2] / 1000, t[3] / 1000) for t in ended if t[1] == "SUCCEEDED"]
    return NniFigures(
        wall=max(t[3] for t in ended) / 1000 - found["begin"],
        startup=found["started"] - found["begin"],
        succeeded=len(ended) - len(failed),
        failed=len(failed),
        failure=_tail(next(experiments_dir.glob(f"**/trials/{failed[0]}/trial.stderr"), None)) if failed else "",
        trials=[t for t in times if t is not None],
        command_wall=max(t[3] for t in ended) / 1000 - launched,
    )


def _manager_pids(experiments_dir: Path) -> list[int]:
    """NNI's node processes started for ``experiments_dir`` (their command line names it)."""
    wanted = str(experiments_dir.resolve())
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "--experiments-directory" in (p.info["cmdline"] or ()) and wanted in p.info["cmdline"]
    ]


def _end_groups(pids: list[int]) -> None:
    """SIGKILL the process group of each pid (never ours), then wait up to 5 s for them to be gone."""
    groups = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    groups.discard(os.getpgrp())
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + 5
    for group in groups:
        while time.monotonic() < deadline and _group_alive(group):
            time.sleep(0.05)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _tails(log: Path, experiments_dir: Path) -> str:
    parts = [f"--- {log}\n{_tail(log)}"]
    for name in ("nnimanager.log", "dispatcher.log", "experiment.log"):
        for path in experiments_dir.glob(f"*/log/{name}"):
            parts.append(f"--- {path}\n{_tail(path)}")
    return "\n".join(parts)


def main() -> int:
    """``python -m bench.nni_side``: NNI's wall time for 40 sklearn trials at concurrency 4."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="trialbus-bench-nni-"))
    figures = nni_wall_time(work / "code", work, trial_python(work))
    print(
        f"NNI 3.0, TPE, 40 sklearn trials at concurrency 4: {figures.wall:.1f} s "
        f"(manager start {figures.startup:.1f} s); {figures.succeeded} succeeded, {figures.failed} failed"
    )
    if figures.failure:
        print(f"first failed trial's stderr:\n{figures.failure}")
    return 1 if figures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
