"""What ``trialbus experiment run`` shows: a live progress view, then the best trial."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from contracts import ExperimentConfig, TrialState, TrialStatus
from contracts.state import default_metric
from trialbus.client import ExperimentView
from trialbus.experiment import best_trial
from trialbus.failures import failure_line, first_failures

#: Seconds without a trial after which the view asks whether a tuner service is running.
NO_TUNER_AFTER = 10.0
#: Statuses in the order the counts line shows them, with their colour.
STATUSES = {
    "WAITING": "dim",
    "RUNNING": "cyan",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "EARLY_STOPPED": "magenta",
    "USER_CANCELED": "yellow",
    "SYS_CANCELED": "yellow",
}


class RunView:
    """Trials ended out of ``maxTrialNumber`` (or of those submitted), counts by status, the best so far."""

    def __init__(self, experiment_id: str, config: ExperimentConfig) -> None:
        self.experiment_id = experiment_id
        self.config = config
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("trials"),
            TimeElapsedColumn(),
        )
        name = f" {escape(config.experiment_name)}" if config.experiment_name else ""
        self.task = self.progress.add_task(f"experiment [bold]{experiment_id}[/]{name}", total=config.max_trial_number)
        self.counts: dict[str, int] = {}
        self.best: TrialState | None = None
        #: While no trial succeeded: the first failure, and why (the fix is often one line away).
        self.failed: TrialState | None = None
        self.trials: list[TrialState] = []
        self.view: ExperimentView | None = None
        self.started = time.monotonic()

    def update(self, view: ExperimentView, trials: list[TrialState]) -> None:
        self.view, self.trials = view, trials
        self.counts = {s: n for s, n in view.trial_counts.items() if n}
        ended = sum(t.status.terminal for t in trials)
        total = self.config.max_trial_number or (len(trials) if view.no_more_trials else None)
        self.progress.update(self.task, completed=ended, total=total)
        self.best = best_trial(trials, self.config)
        if self.counts.get("FAILED") and not self.counts.get("SUCCEEDED"):
            self.failed = next(iter(first_failures(trials, 1)), None)
        else:
            self.failed = None

    def __rich__(self) -> RenderableType:
        counts = (
            "  ".join(
                f"[{STATUSES.get(s, 'white')}]{s.lower()}[/] {self.counts[s]}" for s in STATUSES if s in self.counts
            )
            or self._no_trials()
        )
        lines: list[RenderableType] = [self.progress, Text.from_markup(f"  {counts}")]
        if self.best is not None:
            lines.append(Text.from_markup(f"  best {_best_line(self.best)}"))
        if self.failed is not None:
            lines.append(Text.from_markup(f"  {failure_line(self.failed)}"))
        return Group(*lines)

    def _no_trials(self) -> str:
        if time.monotonic() - self.started < NO_TUNER_AFTER:
            return "[dim]waiting for the tuner's first trial[/]"
        return (
            f"[yellow]no trial after {NO_TUNER_AFTER:.0f} s: is the tuner service running? (`trialbus up` "
            "starts it; alone: `python -m services.tuner`)[/]"
        )


def _best_line(trial: TrialState) -> str:
    return (
        f"[bold]{_number(default_metric(trial.final_metric))}[/] trial {trial.id} (#{trial.sequence_id}) "
        f"{escape(json.dumps(trial.parameters))}"
    )


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def summary(view: ExperimentView, trials: list[TrialState], config: ExperimentConfig) -> RenderableType:
    """The end: status and duration, counts, why it stopped (and how to resume it), the first
    failures (:mod:`trialbus.failures`), the best trial with its parameters, and the next five."""
    end = view.end_time or datetime.now(UTC)
    seconds = int((end - view.start_time).total_seconds())
    status = "green" if view.status.value == "DONE" else "yellow"
    head = Text.from_markup(
        f"experiment [bold]{view.id}[/] [{status}]{view.status.value}[/] after {seconds // 60}m{seconds % 60:02d}s: "
        + ", ".join(f"{n} {s.lower()}" for s, n in view.trial_counts.items() if n)
        + (f"\n[yellow]{escape(view.message)}[/]" if view.message else "")
        + (
            f"\nto run it again: [bold]trialbus resume {view.id}[/]"
            if view.message and view.status.value == "STOPPED"
            else ""
        )
        + "".join(f"\n{failure_line(t)}" for t in first_failures(trials))
    )
    ranked = sorted(
        (t for t in trials if t.status == TrialStatus.SUCCEEDED and default_metric(t.final_metric) is not None),
        key=lambda t: default_metric(t.final_metric) or 0.0,
        reverse=config.optimize_mode == "maximize",
    )
    if not ranked:
        return Group(head, Text("no trial reported a final result", style="yellow"))
    names = sorted({name for t in ranked[:6] for name in t.parameters})
    table = Table("", "trial", "#", "final", *names, title=f"best trials ({config.optimize_mode})", box=None)
    for rank, trial in enumerate(ranked[:6]):
        table.add_row(
            "best" if rank == 0 else str(rank + 1),
            trial.id,
            str(trial.sequence_id),
            _number(default_metric(trial.final_metric)),
            *(_value(trial.parameters.get(name)) for name in names),
        )
    return Group(head, table)


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return escape(json.dumps(value)) if value is not None else ""
