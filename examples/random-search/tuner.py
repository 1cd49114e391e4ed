"""Random search over the search space of config.yml, driven through the Trialbus client.

    trialbus up -- python tuner.py          # start the stack, run this, stop the stack
    TRIALBUS_NATS_URL=nats://host:4222 python tuner.py   # against a running stack

It creates the experiment (the code directory is packed and uploaded), keeps
``trialConcurrency`` trials in flight until ``maxTrialNumber`` were submitted, shows
progress, and prints every trial's final metric and the best trial. The exit code is 0
only when every trial SUCCEEDED with a final metric. ``TUNER_SEED`` makes runs repeatable.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contracts import TrialStatus, load_experiment_config
from trialbus.client import DEFAULT_NATS_URL, AsyncClient, TrialbusError, TrialOutcome

HERE = Path(__file__).resolve().parent
#: Seconds one trial may take from submission to its end before the tuner gives up on it.
TRIAL_TIMEOUT = 600.0


def sample(space: dict[str, dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """One point of an NNI search space (``_type``/``_value``), drawn as NNI's Random tuner does."""
    params: dict[str, Any] = {}
    for name, spec in space.items():
        kind, args = spec["_type"], spec["_value"]
        if kind == "choice":
            params[name] = rng.choice(args)
        elif kind == "randint":  # [lower, upper)
            params[name] = rng.randrange(args[0], args[1])
        elif kind == "uniform":
            params[name] = rng.uniform(args[0], args[1])
        elif kind == "quniform":
            low, high, q = args
            params[name] = min(max(round(rng.uniform(low, high) / q) * q, low), high)
        elif kind == "loguniform":
            params[name] = math.exp(rng.uniform(math.log(args[0]), math.log(args[1])))
        elif kind == "qloguniform":
            low, high, q = args
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
            params[name] = min(max(round(value / q) * q, low), high)
        elif kind == "normal":
            params[name] = rng.gauss(args[0], args[1])
        else:
            raise ValueError(f"search space parameter {name!r}: _type {kind!r} is not supported by this tuner")
    return params


def score(final: Any) -> float | None:
    """NNI's rule: a number, or a dict whose ``default`` is the number to optimise."""
    value = final.get("default") if isinstance(final, dict) else final
    return float(value) if isinstance(value, int | float) else None


async def search(client: AsyncClient, console: Console) -> int:
    config = load_experiment_config(HERE / "config.yml")
    space = config.search_space or {}
    total, concurrency = config.max_trial_number or 10, config.trial_concurrency
    rng = random.Random(os.environ.get("TUNER_SEED"))
    experiment_id = await client.create_experiment(config)
    console.print(f"experiment [bold]{experiment_id}[/]: {total} trials, {concurrency} at a time")

    trials: dict[str, tuple[int, dict[str, Any]]] = {}
    outcomes: dict[str, TrialOutcome | None] = {}
    waits: dict[asyncio.Task[TrialOutcome], str] = {}
    best: tuple[float, str] | None = None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task("starting", total=total)
            while len(trials) < total or waits:
                while len(trials) < total and len(waits) < concurrency:
                    params = sample(space, rng)
                    trial = await client.submit_trial(experiment_id, params, parameter_id=len(trials))
                    trials[trial.id] = (trial.sequence_id, params)
                    waits[asyncio.create_task(client.wait_trial(trial.id, TRIAL_TIMEOUT))] = trial.id
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    trial_id = waits.pop(task)
                    outcomes[trial_id] = None if task.exception() else task.result()
                    value = score(outcomes[trial_id].final) if outcomes[trial_id] else None
                    if value is not None and (best is None or value > best[0]):
                        best = (value, trial_id)
                best_text = f"best {best[0]:.4f} ({best[1]})" if best else "no result yet"
                progress.update(bar, completed=len(outcomes),
                                description=f"{len(waits)} running · {best_text}")
    except asyncio.CancelledError:
        for task in waits:
            task.cancel()
        await client.stop_experiment(experiment_id)
        raise
    report(console, trials, outcomes, best)
    ok = all(o is not None and o.status is TrialStatus.SUCCEEDED and o.final is not None for o in outcomes.values())
    return 0 if ok else 1


def report(console: Console, trials: dict, outcomes: dict, best: tuple[float, str] | None) -> None:
    table = Table("seq", "trial", "status", "final", "parameters", title="trials")
    for trial_id, (seq, params) in sorted(trials.items(), key=lambda item: item[1][0]):
        outcome = outcomes.get(trial_id)
        status = outcome.status.value if outcome else "NO OUTCOME"
        value = score(outcome.final) if outcome else None
        style = "bold green" if best and trial_id == best[1] else None
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
        table.add_row(str(seq), trial_id, status, "" if value is None else f"{value:.4f}", shown, style=style)
    console.print(table)
    if best:
        console.print(f"best trial: [bold]{best[1]}[/] with {best[0]:.4f} ({trials[best[1]][1]})")
    else:
        console.print("[red]no trial reported a final metric[/]")


async def main() -> int:
    console = Console()
    url = os.environ.get("TRIALBUS_NATS_URL", DEFAULT_NATS_URL)
    try:
        async with AsyncClient(url) as client:
            return await search(client, console)
    except (TrialbusError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        return 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(130)
