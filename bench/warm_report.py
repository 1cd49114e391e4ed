"""The tables and lines ``python -m bench warm`` prints (:mod:`bench.warm` measures them)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from bench.trials import percentile

if TYPE_CHECKING:
    from bench.nni_side import NniFigures
    from bench.warm import Run, Sizes, WarmFigures
    from contracts import TrialState

#: The stack's parts whose CPU per trial is printed apart (the others are summed), with their column names.
CPU_PARTS = {
    "nats-server": "nats-server",
    "dispatcher": "dispatcher",
    "local-gpu": "the local adapter",
    "metrics-gateway": "the metrics gateway",
}
#: A trial whose imports took less CPU than this (s) found them loaded (cold: ~0.9 s here).
PRELOADED = 0.05


def _ms(values: list[float]) -> str:
    """Mean / p50 of seconds, in ms."""
    if not values:
        return "–"
    return f"{statistics.fmean(values) * 1000:.0f} / {percentile(values, 50) * 1000:.0f}"


def _p50(values: list[float]) -> str:
    """The median of seconds, in ms."""
    return f"{percentile(values, 50) * 1000:.0f}" if values else "–"


def _failed(run: Run) -> str:
    return f" [red]({len(run.failed)} failed)[/]" if run.failed else ""


def _failures(console: Console, runs: dict[str, Run]) -> None:
    """The first failed trial's log of each run that had one."""
    for name, run in runs.items():
        if run.failure:
            console.print(f"  [red]{name}: {len(run.failed)} trials did not succeed; the first, trial[/] {run.failure}")


def print_sklearn(console: Console, figures: WarmFigures, sizes: Sizes) -> None:
    nni, runs = figures.nni, figures.sklearn
    n, c = sizes.sklearn_trials, sizes.sklearn_concurrency
    table = Table(title=f"NNI's sklearn example (SVC, digits), TPE, {n} trials at concurrency {c}")
    for column in ("", "wall s", "succeeded", "forked", "imports found loaded"):
        table.add_column(column, justify="right")
    loaded = sum(t.cpu_imports < PRELOADED for t in nni.trials)
    table.add_row("NNI 3.0", f"{nni.wall:.1f}", f"{nni.succeeded}/{n}", "", str(loaded))
    for name, run in runs.items():
        ok = f"{len(run.trials) - len(run.failed)}/{n}{_failed(run)}"
        table.add_row(f"Trialbus {name}", f"{run.wall:.1f}", ok, str(run.forked), str(run.preloaded))
    console.print(table)
    cold, warm = runs["cold"].wall, runs["warm"].wall
    console.print(
        f"  NNI (its manager's start {nni.startup:.1f} s included) / cold [bold]{nni.wall / cold:.1f}×[/], "
        f"NNI / warm [bold]{nni.wall / warm:.1f}×[/] (target ≥ 10×), "
        f"NNI / warm with preload [bold]{nni.wall / runs['warm, preload'].wall:.1f}×[/], "
        f"cold / warm [bold]{cold / warm:.1f}×[/]",
        soft_wrap=True,
    )
    if nni.crashed:
        console.print(
            f"  NNI's TPE tuner crashed in {nni.crashed} run(s) before this one (microsoft/nni#5798): "
            "each was run again from the start"
        )
    per_trial = Table(title="per sklearn trial, ms, mean / p50")
    for column in ("", "NNI 3.0", *runs):
        per_trial.add_column(column, justify="right")
    rows = (
        ("CPU before line 1", lambda t: t.cpu_before),
        ("CPU of imports", lambda t: t.cpu_imports),
        ("CPU of work", lambda t: t.cpu_work),
        ("start → end (wall)", lambda t: t.end - t.start),
    )
    columns = (nni.trials, *(run.times for run in runs.values()))
    for label, value in rows:
        per_trial.add_row(label, *(_ms([value(t) for t in times]) for times in columns))
    console.print(per_trial)
    console.print(
        "  CPU: the trial process's own (process_time); before line 1: a cold interpreter's start and site, or a "
        "forked trial's set-up since its fork; imports: nni and sklearn; work: data, fit, score",
        soft_wrap=True,
    )
    print_slots(console, nni, runs, c)
    _failures(console, runs)


def print_slots(console: Console, nni: NniFigures, runs: dict[str, Run], concurrency: int) -> None:
    """Where a slot's time goes, p50: waiting for the next trial, its start, its own run, its end."""
    table = Table(title="a sklearn trial's slot, ms p50 (wall)")
    for column in ("", "end → next submit", "submit → start", "start → line 1", "line 1 → report", "report → end"):
        table.add_column(column, justify="right")
    own = (lambda t: t.first_line - t.start, lambda t: t.reported - t.first_line, lambda t: t.end - t.reported)
    table.add_row("NNI 3.0", "–", "–", *(_p50([span(t) for t in nni.trials]) for span in own))
    for name, run in runs.items():
        starts = [t.start - submit for t, submit in zip(run.times, run.submits, strict=True)]
        table.add_row(
            name,
            _p50(_refills(run.trials, concurrency)),
            _p50(starts),
            *(_p50([span(t) for t in run.times]) for span in own),
        )
    console.print(table)


def _refills(trials: list[TrialState], concurrency: int) -> list[float]:
    """Seconds from a trial's end to the submit of the trial that took its slot (as bench.tuner)."""
    ends = sorted(t.end_time for t in trials if t.end_time)
    ordered = sorted(trials, key=lambda t: t.sequence_id)[concurrency:]
    gaps = [
        (t.submit_time - ends[t.sequence_id - concurrency]).total_seconds()
        for t in ordered
        if t.sequence_id - concurrency < len(ends)
    ]
    return [max(gap, 0.0) for gap in gaps]


def print_serial(console: Console, runs: dict[str, Run]) -> None:
    table = Table(title="no-op trials at concurrency 1, ms p50")
    for column in ("", "ok", "forked", "submit → start", "start → line 1", "submit → line 1", "CPU before line 1"):
        table.add_column(column, justify="right")
    for name, run in runs.items():
        pairs = list(zip(run.times, run.submits, strict=True))
        spans = (
            [t.start - submit for t, submit in pairs],
            [t.first_line - t.start for t in run.times],
            [t.first_line - submit for t, submit in pairs],
            [t.cpu_before for t in run.times],
        )
        ok = f"{len(run.trials) - len(run.failed)}/{len(run.trials)}{_failed(run)}"
        table.add_row(name, ok, str(run.forked), *(f"{percentile(span, 50) * 1000:.1f}" for span in spans))
    console.print(table)
    warm = [t.first_line - submit for t, submit in zip(runs["warm"].times, runs["warm"].submits, strict=True)]
    console.print(
        f"  start overhead, warm: submit → the trial's first line p50 [bold]{percentile(warm, 50) * 1000:.1f}[/] ms "
        "(target ≤ 10 ms; dispatch included)",
        soft_wrap=True,
    )
    _failures(console, runs)


def print_wide(console: Console, figures: WarmFigures, sizes: Sizes) -> None:
    cold, warm, spawn = figures.wide["cold"], figures.wide["warm"], figures.spawn_only
    console.print(
        f"no-op trials at concurrency {sizes.wide}, {sizes.wide_trials} each timed after {sizes.wide_warmup} of the "
        f"same experiment: warm [bold]{warm.rate:.1f}[/] trials/s ({warm.forked} of {len(warm.trials)} forked"
        f"{_failed(warm)}), cold {cold.rate:.1f} trials/s{_failed(cold)}, spawn-only "
        f"{spawn:.1f}/s: warm / spawn-only [bold]{warm.rate / spawn:.2f}×[/] (target ≥ 2×), "
        f"cold / spawn-only {cold.rate / spawn:.2f}×",
        soft_wrap=True,
    )
    if figures.wide_cpu:
        print_cpu(console, figures, sizes)
    _failures(console, figures.wide)


def print_cpu(console: Console, figures: WarmFigures, sizes: Sizes) -> None:
    """CPU per no-op trial of the ``wide`` runs, one row per part, one column per run."""
    table = Table(title=f"CPU per no-op trial at concurrency {sizes.wide}, ms")
    table.add_column("")
    for name in figures.wide_cpu:
        table.add_column(name, justify="right")
    labels = {
        **CPU_PARTS,
        "others": "the stack's other services",
        "bench": "the client (this bench)",
        "rest": "the rest: keepers, templates, trials",
        "total": "total (the host's)",
    }
    for key, label in labels.items():
        table.add_row(label, *(f"{cpu[key] * 1000:.1f}" for cpu in figures.wide_cpu.values()))
    own = (
        statistics.fmean([t.cpu_before + t.cpu_imports + t.cpu_work for t in run.times] or [0.0])
        for run in figures.wide.values()
    )
    table.add_row("of the rest, the trial to its report", *(f"{cpu * 1000:.1f}" for cpu in own))
    console.print(table)
