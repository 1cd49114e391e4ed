"""``python -m bench sklearn``: NNI's scikit-learn classification example as a user times it, on a
freshly started stack, beside NNI 3.0 in the same run (issue 34).

The figure is the wall time of the whole ``trialbus experiment run -f config.yml`` command (the
CLI's start, the experiment's creation, its ``trials`` trials at ``concurrency``, tuned by Random,
and the best trials printed at the end), on a stack started just before it: its first
experiment (the templates start with it) and then a second one of the same code and config (what
the first left behind, templates and learned imports, may serve it). Then the stack is stopped and
NNI 3.0 runs the same trials with the same tuner (:func:`bench.nni_side.nni_wall_time`), timed from
the start of its driver process (a Python that imports NNI's API and calls ``Experiment.start``)
to the last trial's end as NNI records it. Targets: first experiment ≥ 10× faster than NNI,
second ≥ 15×.

The trial is :data:`EXAMPLE`: NNI's ``examples/trials/sklearn/classification/main.py`` (an SVC
on scikit-learn's digits) as a user writes it, with no timing code of ours, and its search space
(:data:`bench.nni_side.SKLEARN_SEARCH_SPACE`). ``TRIALBUS_BENCH_SKLEARN_EXAMPLE`` may name a
folder holding NNI's own ``main.py`` and ``search_space.json`` (a checkout of NNI's examples):
they are then used as they are, on both sides.

Runs on its own: ``python -m bench.sklearn``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from bench.nni_side import SDK, SKLEARN_SEARCH_SPACE, nni_wall_time, trial_python
from bench.warm import _forked
from contracts import TrialStatus
from trialbus.client import AsyncClient
from trialbus.stack import Stack, StackOptions
from trialbus.stack.processes import free_port

#: NNI's classification example, as it is shaped: its imports, the data, the defaults the tuner's
#: parameters update, the model, the score reported. No timing code: the figure is the command's.
EXAMPLE = textwrap.dedent(
    '''
    """NNI's scikit-learn classification example: an SVC on the handwritten digits."""
    import nni
    from sklearn.model_selection import train_test_split
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC
    import logging
    import numpy as np

    LOG = logging.getLogger("sklearn_classification")


    def load_data():
        digits = load_digits()
        x_train, x_test, y_train, y_test = train_test_split(digits.data, digits.target, random_state=99, test_size=0.25)
        scaler = StandardScaler()
        return scaler.fit_transform(x_train), scaler.transform(x_test), y_train, y_test


    def get_default_parameters():
        return {"C": 1.0, "kernel": "linear", "degree": 3, "gamma": 0.01, "coef0": 0.01}


    def get_model(params):
        model = SVC()
        for name in ("C", "kernel", "degree", "gamma", "coef0"):
            setattr(model, name, params.get(name))
        return model


    def run(x_train, x_test, y_train, y_test, model):
        model.fit(x_train, y_train)
        score = model.score(x_test, y_test)
        LOG.debug("score: %s", score)
        nni.report_final_result(score)


    if __name__ == "__main__":
        x_train, x_test, y_train, y_test = load_data()
        try:
            received = nni.get_next_parameter()
            LOG.debug(received)
            params = get_default_parameters()
            params.update(received)
            model = get_model(params)
            run(x_train, x_test, y_train, y_test, model)
        except Exception as exception:
            LOG.exception(exception)
            raise
    '''
).lstrip()


@dataclass
class SklearnFigures:
    first: float  # seconds, the first experiment's `trialbus experiment run` on a fresh stack
    second: float  # … the second, same code and config, same stack
    nni: float  # NNI 3.0: its driver's start → the last trial's end
    trials: int
    concurrency: int
    outcomes: list[tuple[int, int]]  # per experiment, trials succeeded and trials forked from a template


def write_example(code: Path) -> dict:
    """The example's ``main.py`` in ``code`` (NNI's own from ``TRIALBUS_BENCH_SKLEARN_EXAMPLE``
    when set); its search space."""
    code.mkdir(parents=True, exist_ok=True)
    source = os.environ.get("TRIALBUS_BENCH_SKLEARN_EXAMPLE")
    if source:
        shutil.copy(Path(source) / "main.py", code / "main.py")
        return json.loads((Path(source) / "search_space.json").read_text())
    (code / "main.py").write_text(EXAMPLE)
    return SKLEARN_SEARCH_SPACE


def experiment_run(stack: Stack, config: Path, timeout: float = 900) -> float:
    """Seconds the whole ``trialbus experiment run -f config`` took, as a shell's ``time`` says.
    Raises RuntimeError with its output when it fails."""
    trialbus = Path(sys.executable).with_name("trialbus")
    begin = time.perf_counter()
    done = subprocess.run(
        [str(trialbus), "experiment", "run", "-f", str(config)],
        env=stack.client_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    took = time.perf_counter() - begin
    if done.returncode:
        raise RuntimeError(f"trialbus experiment run exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr}")
    return took


def sklearn_figure(
    console: Console, root: Path, trials: int = 40, concurrency: int = 4, sdk: Path = SDK, nni: bool = True
) -> SklearnFigures:
    """Measure and print the module docstring's figure; everything goes under ``root``."""
    python = trial_python(root, sdk)
    code = root / "sklearn-example"
    space = write_example(code)
    config = root / "sklearn-config.yml"
    config.write_text(
        json.dumps(
            {  # YAML's superset
                "experimentName": "sklearn-classification",
                "trialCommand": f"{python} main.py",
                "trialCodeDirectory": str(code),
                "trialConcurrency": concurrency,
                "maxTrialNumber": trials,
                "searchSpace": space,
                "tuner": {"name": "Random"},
                "trainingService": {"platform": "local"},
            }
        )
    )
    options = StackOptions(
        data_dir=root / "sklearn-stack",
        nats_port=free_port(),
        api_port=free_port(),
        gateway_port=free_port(),
        webui_port=free_port(),
        stop_grace=5,
    )
    stack = Stack(options, Console(quiet=True))  # its parts' start lines are not the figure
    stack.start()
    try:
        first, second = experiment_run(stack, config), experiment_run(stack, config)
        outcomes = asyncio.run(outcomes_of(stack, options.nats_url))
    finally:
        stack.stop()
    if outcomes != [(trials, trials)] * 2:  # no figure labelled warm is a cold one in disguise
        raise RuntimeError(f"of {trials} trials per experiment, (succeeded, forked): {outcomes}")
    wall = float("nan")
    if nni:
        wall = nni_wall_time(
            root / "nni-code",
            root / "nni",
            python,
            trials,
            concurrency,
            tuner="Random",
            text=(code / "main.py").read_text(),
            space=space,
        ).command_wall
    figures = SklearnFigures(first, second, wall, trials, concurrency, outcomes)
    console.print(
        f"NNI's sklearn example, Random, {trials} trials at concurrency {concurrency}, `trialbus experiment run` "
        f"on a fresh stack: first [bold]{first:.1f}[/] s, second [bold]{second:.1f}[/] s; NNI 3.0 {wall:.1f} s: "
        f"[bold]{wall / first:.1f}×[/] (target ≥ 10×), [bold]{wall / second:.1f}×[/] (target ≥ 15×)"
    )
    return figures


async def outcomes_of(stack: Stack, nats_url: str) -> list[tuple[int, int]]:
    """(trials succeeded, trials forked from a template) of each experiment on ``stack``, oldest first."""
    os.environ["TRIALBUS_DATA_DIR"] = str(stack.data_dir)  # where the client finds the stack's credentials
    found = []
    async with AsyncClient(nats_url) as client:
        for experiment in reversed(await client.list_experiments()):
            trials = await client.list_trials(experiment.id)
            succeeded = sum(t.status == TrialStatus.SUCCEEDED for t in trials)
            found.append((succeeded, len(_forked(stack.data_dir, experiment.id))))
    return found


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-sklearn-"))
    console = Console()
    console.print(f"[bold]Trialbus bench, sklearn[/] on {os.cpu_count()} cores; work dir {root}")
    sklearn_figure(console, root, nni="--no-nni" not in sys.argv)


if __name__ == "__main__":
    main()
