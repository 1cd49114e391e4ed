"""``python -m bench warm``: warm-started trials (issue 21) beside cold ones and beside NNI 3.0,
all measured in one run on one machine.

1. **The scikit-learn workload** (:data:`bench.nni_side.SKLEARN_TRIAL`, NNI's SVC example and
   search space), ``sklearn_trials`` trials (40) at ``sklearn_concurrency`` (4), tuned by TPE on
   both sides: NNI 3.0 (:func:`bench.nni_side.nni_wall_time`), then Trialbus cold
   (``warmStart: false``), then Trialbus warm (the default: the experiment's first trials fork
   from a bare template, later ones from one that has learned their imports), then warm with the
   imports named ahead (``warmStart: {preload: [sklearn.…]}``: what a template that has learned
   them gives from the first trial on). Wall time: from just before the experiment is created
   (NNI: started, its manager's start-up included) to the last trial's end as the platform
   records it. The ratios are printed beside the target (warm ≥ 10× faster than NNI), and per
   run how many trials were forked and how many found their imports loaded (< 50 ms of CPU).
2. **Per trial**, from what each trial reports (:class:`bench.nni_side.TrialTimes`), mean and
   p50: the CPU its process spent before its first line (``time.process_time()`` there: a cold
   trial's interpreter start and ``site``; a forked trial's set-up since the fork, as a child's
   CPU counters start at zero), the CPU of its imports (``nni``, scikit-learn: where a warm
   start saves), the CPU of its work (data, fit, score: what no start can save), and its run
   time from the platform's start to its end. Not in these: the keeper's CPU (one beside every
   trial, cold or warm) and the template's (its imports once per template, the fork call once
   per trial), which a trial's own counters cannot see. Then where a slot's wall time goes (p50):
   a trial's end → the next submit (the tuner's proposal), submit → start, start → first line,
   first line → its report, its report → its end (its exit, the keeper noticing).
3. **Start overhead at concurrency 1**: ``serial_trials`` (40) timed no-op trials
   (:data:`bench.nni_side.NOOP_TRIAL`), one at a time, cold and warm: submit → the trial's first
   line (wall clock; p50), split at the keeper's start time (written right after the spawn or
   fork returned) into submit → start (the dispatcher, the adapter, the keeper's start, the
   spawn or fork call) and start → first line (a cold interpreter's start, or a forked child's
   set-up). The target (≤ 10 ms) is held against the whole of it, dispatch included: stricter
   than the fork, set-up and keeper alone, and what a user waits for.
4. **No-op trials at concurrency** ``wide`` (16), ``wide_trials`` (480) of them, timed once the
   experiment's first ``wide_warmup`` (32) trials ended (a long experiment's steady state: its
   templates started and settled, which a few hundred trials would otherwise pay): trials per
   second warm and cold, beside the rate at which the machine merely spawns the same command
   (:func:`bench.trials.spawn_rate`, just before and just after, averaged: the host's speed
   drifts). Target: warm ≥ 2× spawn-only. Then the CPU per trial of each run, by the stack's
   parts (``/proc/<pid>/stat``) and the rest of the host (``/proc/stat``: keepers, templates and
   trials, and whatever else runs there): where a trial's cost is once its start is a fork.

The no-op trials run on the bench's own interpreter with our ``nni`` shim, as ``python -m bench
trials`` runs them; the sklearn ones on :func:`bench.nni_side.trial_python` (the real ``nni``
and scikit-learn), on both sides. Sklearn trials are proposed by the tuner service (TPE), as
NNI's tuner proposes them (Trialbus's TPE is Optuna's, NNI's its own: the parameters differ, so
the work differs a little; the per-trial table shows it side by side); no-op trials are submitted
by the client directly, ``concurrency`` lanes as in :func:`bench.trials.trial_rate`, so that no
tuner's proposal time is in their rate.

Warm start is asked for (or against) with the experiment key ``warmStart``. Every trial's
``.trialbus/state.json`` says whether the keeper forked it from a template (``warm: true``):
each run prints how many were, so no figure labelled warm is a cold one in disguise.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.nni_side import NOOP_TRIAL, SDK, SKLEARN_SEARCH_SPACE, NniFigures, TrialTimes, nni_wall_time, trial_python
from bench.nni_side import write_trial as write_timed_trial
from bench.trials import spawn_rate
from bench.warm_report import CPU_PARTS, PRELOADED, print_serial, print_sklearn, print_wide
from contracts import TrialState, TrialStatus
from services.adapters import trialdir
from services.trial_keeper import SHIM_PATH
from trialbus.client import AsyncClient

#: The sklearn trial's imports, named ahead of time in the third Trialbus run (``warmStart.preload``).
SKLEARN_MODULES = ["sklearn.datasets", "sklearn.model_selection", "sklearn.preprocessing", "sklearn.svm"]


@dataclass(frozen=True)
class Sizes:
    """How many trials each figure runs, and how many at a time."""

    sklearn_trials: int = 40
    sklearn_concurrency: int = 4
    serial_trials: int = 40
    wide: int = 16
    wide_trials: int = 480
    wide_warmup: int = 32  # trials of the same experiment before the timed ones


@dataclass
class Run:
    """One Trialbus experiment as it ran."""

    wall: float  # seconds: just before the experiment was created → the last trial's end
    trials: list[TrialState]
    times: list[TrialTimes]  # the succeeded trials' reports, with their start, end and warm flag
    submits: list[float] = field(default_factory=list)  # when each of ``times`` was submitted (epoch s)
    failure: str = ""  # the log tail of the first trial that did not succeed
    rate: float = 0.0  # trials per second, first submit → last end seen (direct submission only)

    @property
    def failed(self) -> list[TrialState]:
        return [t for t in self.trials if t.status != TrialStatus.SUCCEEDED]

    @property
    def forked(self) -> int:
        return sum(t.warm for t in self.times)

    @property
    def preloaded(self) -> int:
        return sum(t.cpu_imports < PRELOADED for t in self.times)


@dataclass
class WarmFigures:
    nni: NniFigures
    sklearn: dict[str, Run] = field(default_factory=dict)  # "cold", "warm", "warm, preload"
    serial: dict[str, Run] = field(default_factory=dict)  # "cold", "warm"
    wide: dict[str, Run] = field(default_factory=dict)
    spawn_only: float = 0.0  # trials per second, the no-op command merely spawned at ``wide``
    #: Seconds of CPU per trial of each ``wide`` run, by the stack's part (``services``), "others"
    #: (the other parts), "bench" (this process: the client), "rest" (the rest of the host: keepers,
    #: templates, trials) and "total".
    wide_cpu: dict[str, dict[str, float]] = field(default_factory=dict)


def warm_start(
    console: Console,
    nats_url: str,
    data_dir: Path,
    root: Path,
    sizes: Sizes = Sizes(),
    sdk: Path = SDK,
    services: dict[str, int] | None = None,
) -> WarmFigures:
    """Measure and print every figure of the module docstring against the stack at ``nats_url``
    (its data in ``data_dir``); trial code, NNI's state and the trial venv (``nni`` from ``sdk``) go
    under ``root``. ``services``: the stack's processes by name, whose CPU per no-op trial at
    concurrency ``wide`` is printed beside the rest of the host's."""
    python = trial_python(root, sdk)
    console.print(f"[bold]warm start[/] (issue 21); trials run by {python}", soft_wrap=True)
    n, c = sizes.sklearn_trials, sizes.sklearn_concurrency
    figures = WarmFigures(nni_wall_time(root / "nni-code", root / "nni", python, n, c))
    code = root / "sklearn-code"
    command = write_timed_trial(code, python)
    modes: dict[str, bool | dict[str, Any]] = {
        "cold": False,
        "warm": True,
        "warm, preload": {"preload": SKLEARN_MODULES},
    }
    for name, warm in modes.items():
        figures.sklearn[name] = asyncio.run(tuned(nats_url, data_dir, command, code, c, n, name, warm))
    print_sklearn(console, figures, sizes)

    code = root / "noop-code"
    command = write_timed_trial(code, Path(sys.executable), NOOP_TRIAL, "noop.py")
    for name in ("cold", "warm"):
        figures.serial[name] = asyncio.run(
            direct(nats_url, data_dir, command, code, 1, sizes.serial_trials, name, modes[name])
        )
    print_serial(console, figures.serial)

    spawn_env = {**os.environ, "PYTHONPATH": str(SHIM_PATH)}  # as the adapter runs it, minus the keeper
    spawned = spawn_rate(command, code, spawn_env, sizes.wide, sizes.wide_trials)
    marks: list[dict[str, float]] = []  # the stack's CPU as each timed run starts

    def mark() -> None:
        if services:
            marks.append(_cpu(services))

    for name in ("cold", "warm"):
        marks.clear()
        figures.wide[name] = asyncio.run(
            direct(
                nats_url,
                data_dir,
                command,
                code,
                sizes.wide,
                sizes.wide_trials,
                name,
                modes[name],
                warmup=sizes.wide_warmup,
                timing=mark,
            )
        )
        if marks and services:  # (marks are taken only with services)
            figures.wide_cpu[name] = _per_trial(marks[0], _cpu(services), sizes.wide_trials)
    figures.spawn_only = (spawned + spawn_rate(command, code, spawn_env, sizes.wide, sizes.wide_trials)) / 2
    print_wide(console, figures, sizes)
    return figures


def start_mode(warm: bool | dict) -> dict[str, bool | dict]:
    """The experiment key that asks for (or against) warm start."""
    return {"warmStart": warm}


async def tuned(
    nats_url: str,
    data_dir: Path,
    command: str,
    code: Path,
    concurrency: int,
    count: int,
    name: str,
    warm: bool | dict,
    timeout: float = 900,
) -> Run:
    """``count`` trials of ``command`` proposed by the tuner service (TPE over NNI's sklearn space)."""
    async with AsyncClient(nats_url) as client:
        begin = time.time()
        experiment = await client.create_experiment(
            {
                "experimentName": f"bench-sklearn-{name}",
                "trialCommand": command,
                "trialCodeDirectory": str(code),
                "trialConcurrency": concurrency,
                "maxTrialNumber": count,
                "searchSpace": SKLEARN_SEARCH_SPACE,
                "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
                "trainingService": {"platform": "local"},
                **start_mode(warm),
            }
        )
        while (await client.get_experiment(experiment)).status.value == "RUNNING":
            if time.time() - begin > timeout:
                raise RuntimeError(f"experiment {experiment} did not end within {timeout:.0f} s")
            await asyncio.sleep(0.2)  # the figure is the trials' own end times, not this poll
        return await _run(client, data_dir, experiment, begin, count)


async def direct(
    nats_url: str,
    data_dir: Path,
    command: str,
    code: Path,
    concurrency: int,
    count: int,
    name: str,
    warm: bool | dict,
    trial_timeout: float = 60,
    warmup: int = 0,
    timing: Callable[[], object] = lambda: None,
) -> Run:
    """``count`` trials of ``command`` submitted by the client, ``concurrency`` lanes each submitting
    its next trial when its last one ended; one not ended after ``trial_timeout`` seconds is cancelled.
    The rate is the timed ``count``'s, once ``warmup`` trials of the same experiment ended (then
    ``timing`` is called, as the clock starts); the run's trials are all of them."""
    async with AsyncClient(nats_url) as client:
        begin = time.time()
        experiment = await client.create_experiment(
            {
                "experimentName": f"bench-noop-c{concurrency}-{name}",
                "trialCommand": command,
                "trialCodeDirectory": str(code),
                "trialConcurrency": concurrency,
                "maxTrialNumber": count + warmup,
                "trainingService": {"platform": "local"},
                **start_mode(warm),
            }
        )

        async def lane(trials: int) -> None:
            for _ in range(trials):
                trial = await client.submit_trial(experiment, {})
                try:
                    await client.wait_trial(trial.id, timeout=trial_timeout)
                except TimeoutError:  # a stuck trial is a failed one, not the end of the bench
                    await client.cancel_trial(trial.id)
                    await client.wait_trial(trial.id, timeout=30)

        def lanes(trials: int) -> list[Awaitable[None]]:
            return [lane(trials // concurrency + (i < trials % concurrency)) for i in range(concurrency)]

        await asyncio.gather(*lanes(warmup))
        timing()
        first = time.perf_counter()
        await asyncio.gather(*lanes(count))
        elapsed = time.perf_counter() - first
        run = await _run(client, data_dir, experiment, begin, count + warmup)
    run.rate = count / elapsed
    return run


async def _run(client: AsyncClient, data_dir: Path, experiment: str, begin: float, count: int) -> Run:
    """The experiment's trials as they ran, read once all ``count`` have ended (the client sees an end
    as it is published, the trial list a moment later; 30 s at most)."""
    deadline = time.monotonic() + 30
    trials = await client.list_trials(experiment)
    while (len(trials) < count or not all(t.status.terminal for t in trials)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        trials = await client.list_trials(experiment)
    forked = _forked(data_dir, experiment)
    times, submits = [], []
    for trial in trials:
        if trial.status != TrialStatus.SUCCEEDED or trial.start_time is None or trial.end_time is None:
            continue
        timed = TrialTimes.parse(
            trial.final_metric, trial.start_time.timestamp(), trial.end_time.timestamp(), trial.id in forked
        )
        if timed is not None:
            times.append(timed)
            submits.append(trial.submit_time.timestamp())
    ends = [t.end_time.timestamp() for t in trials if t.end_time is not None]
    failed = next((t for t in trials if t.status != TrialStatus.SUCCEEDED), None)
    failure = "" if failed is None else f"{failed.id} {failed.status.value}: {await client.trial_log(failed.id, 1500)}"
    return Run(max(ends, default=begin) - begin, trials, times, submits=submits, failure=failure)


def _forked(data_dir: Path, experiment: str) -> set[str]:
    """The experiment's trials whose keeper forked them from a template, as their state files in the
    local adapter's work dir say (``<work dir>/trials/<experiment>/<trial>-<attempt>``; the stack's
    work dir is ``<data dir>/trials``, a lone adapter's ``<data dir>/local-gpu/<replica>``)."""
    found = set()
    for state in data_dir.glob(f"**/trials/{experiment}/*/{trialdir.STATE}"):
        try:
            warm = json.loads(state.read_text()).get("warm")
        except (OSError, ValueError):
            continue
        if warm:
            found.add(state.parents[1].name.rsplit("-", 1)[0])  # <trial id>-<attempt>
    return found


def _cpu(services: dict[str, int]) -> dict[str, float]:
    """Seconds of CPU each of ``services`` (name → pid) has spent, this process ("bench") and the
    whole host ("host")."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {"bench": time.process_time()}
    for name, pid in services.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone: counted in the rest
            continue
        found[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    busy = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    found["host"] = sum(int(busy[i]) for i in (0, 1, 2, 5, 6, 7)) / tick  # user nice system irq softirq steal
    return found


def _per_trial(before: dict[str, float], after: dict[str, float], count: int) -> dict[str, float]:
    """CPU seconds per trial between two :func:`_cpu` readings: the main parts, "others", "bench",
    "rest", "total"."""
    spent = {name: (after[name] - before[name]) / count for name in after if name in before}
    total, bench = spent.pop("host"), spent.pop("bench")
    split = {name: spent.pop(name, 0.0) for name in CPU_PARTS}
    split["others"] = sum(spent.values())
    split["bench"] = bench
    split["rest"] = total - sum(split.values())
    split["total"] = total
    return split


# -- printing -------------------------------------------------------------------------------
