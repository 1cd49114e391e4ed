"""``trialbus watch EXP``: a live table of one experiment's trials, from the event and metric streams."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trialbus.commands.common import console, duration, metric, status, with_client

if TYPE_CHECKING:  # rich and the client load when the command runs, not with the CLI (trialbus.cli)
    from rich.console import Console
    from rich.table import Table

    from trialbus.client import AsyncClient


@dataclass
class Row:
    id: str
    seq: int | None = None
    status: str = "WAITING"  # TrialStatus.WAITING: the contracts load when the command runs
    intermediate: int = 0
    latest: Any = None
    final: Any = None
    start: datetime | None = None
    end: datetime | None = None


class WatchView:
    """Trial rows kept up to date from the event and metric streams."""

    def __init__(self, experiment_id: str, max_rows: int) -> None:
        self.experiment_id = experiment_id
        self.max_rows = max_rows
        self.status = "?"
        self.name = ""
        self.rows: dict[str, Row] = {}
        #: The first failure with its last stderr line, as :func:`trialbus.failures.said` says it.
        self.failure: str | None = None

    def row(self, trial_id: str) -> Row:
        return self.rows.setdefault(trial_id, Row(trial_id))

    def __rich__(self) -> Table:
        from rich.markup import escape
        from rich.table import Table

        rows = sorted(self.rows.values(), key=lambda r: (r.seq is None, r.seq or 0, r.id))
        shown = rows[-self.max_rows :]
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.status] = counts.get(r.status, 0) + 1
        summary = "  ".join(f"{status(s)} {n}" for s, n in sorted(counts.items())) or "no trials yet"
        more = f" (last {len(shown)} of {len(rows)})" if len(shown) < len(rows) else ""
        table = Table(
            "trial",
            "seq",
            "status",
            "intermediate",
            "latest",
            "final",
            "duration",
            title=f"experiment {self.experiment_id} {escape(self.name)} {status(self.status)}",
            caption=summary + more + (f"\n{self.failure}" if self.failure else ""),
        )
        for r in shown:
            table.add_row(
                r.id,
                "" if r.seq is None else str(r.seq),
                status(r.status),
                str(r.intermediate),
                metric(r.latest),
                metric(r.final),
                duration(r.start, r.end),
            )
        return table


async def _watch(client: AsyncClient, experiment_id: str, out: Console) -> None:
    import asyncio

    from rich.live import Live

    from contracts import ExperimentStatus, MetricType, TrialStatus
    from trialbus.failures import failure_line, first_failures, said

    view = WatchView(experiment_id, max_rows=max(5, out.size.height - 10))

    async def refresh() -> None:
        """Experiment status and sequence ids; the streams carry everything else."""
        experiment = await client.get_experiment(experiment_id)
        view.status, view.name = experiment.status.value, experiment.config.experiment_name or ""
        trials = await client.list_trials(experiment_id)
        if view.failure is None and (first := first_failures(trials, 1)) and first[0].last_error:
            view.failure = failure_line(first[0])  # (it ended before the events were read)
        for trial in trials:
            row = view.row(trial.id)
            row.seq = trial.sequence_id
            row.start, row.end = row.start or trial.start_time, row.end or trial.end_time
            if trial.final_metric is not None:
                row.final = trial.final_metric

    async def follow_events() -> None:
        async for event in client.events(experiment_id):
            row = view.row(event.trial_id)
            row.status = event.status.value
            if event.status is TrialStatus.RUNNING:
                row.start, row.end = event.time, None
            elif event.status.terminal:
                row.end = event.time
            if event.status is TrialStatus.FAILED and event.last_error and view.failure is None:
                view.failure = said(event.trial_id, event.exit_code, event.last_error)

    async def follow_metrics() -> None:
        async for record in client.metrics(experiment_id):
            row = view.row(record.trial_id)
            try:
                value = record.decoded()
            except ValueError:
                value = record.value
            if record.type is MetricType.FINAL:
                row.final = value
            else:
                row.intermediate += 1
                row.latest = value

    await refresh()
    followers = [asyncio.create_task(follow_events()), asyncio.create_task(follow_metrics())]
    try:
        with Live(view, console=out, refresh_per_second=4):
            while view.status not in (ExperimentStatus.DONE.value, ExperimentStatus.STOPPED.value):
                done = next((f for f in followers if f.done()), None)
                if done is not None:
                    done.result()  # a follower failed: say why
                await asyncio.sleep(2)
                await refresh()
    finally:
        for follower in followers:
            follower.cancel()
        await asyncio.gather(*followers, return_exceptions=True)


def watch(ctx: typer.Context, experiment_id: Annotated[str, typer.Argument(metavar="EXP")]) -> None:
    """Live table of an experiment's trials; exits when it is DONE or STOPPED, or on Ctrl-C."""
    out = console()
    with contextlib.suppress(KeyboardInterrupt):
        with_client(ctx, lambda c: _watch(c, experiment_id, out))
