"""``trialbus top``: a live table of the experiments, as ``nnictl top`` shows them, until Ctrl-C.

One row per experiment, newest first: its status, platform, its trials by state (out of
``maxTrialNumber``), the best final result for its ``optimize_mode``, and how long it has run.
``--once`` prints the table once and exits (scripts, tests).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Annotated

import typer

from trialbus.commands.common import console, duration, metric, moment, status, with_client

if TYPE_CHECKING:  # what the command uses loads when it runs, not with the CLI (trialbus.cli)
    from rich.console import Console
    from rich.table import Table

    from contracts import TrialState
    from trialbus.api import ExperimentView
    from trialbus.client import AsyncClient


async def _rows(client: AsyncClient, limit: int | None) -> list[tuple[ExperimentView, TrialState | None, list[str]]]:
    """The newest ``limit`` experiments, each with its best trial and why it failed, if it did."""
    import asyncio

    experiments = (await client.list_experiments())[:limit]
    from trialbus.failures import why_lines

    best = await asyncio.gather(*(_best(client, e) for e in experiments))
    why = await asyncio.gather(*(why_lines(client, e) for e in experiments))  # trialbus.failures
    return list(zip(experiments, best, why, strict=True))


async def _best(client: AsyncClient, experiment: ExperimentView) -> TrialState | None:
    """The SUCCEEDED trial with the best default metric (``optimize_mode`` aware): one small page."""
    from contracts import TrialStatus
    from contracts.state import default_metric

    page = await client.trial_page(experiment.id, limit=1, status=TrialStatus.SUCCEEDED, sort="metric")
    found = page.trials[0] if page.trials else None
    return found if found is not None and default_metric(found.final_metric) is not None else None


def table(rows: list[tuple[ExperimentView, TrialState | None, list[str]]], every: float | None) -> Table:
    from rich.markup import escape
    from rich.table import Table

    from contracts import ExperimentStatus, TrialStatus

    running = sum(e.status == ExperimentStatus.RUNNING for e, *_ in rows)
    when = f"refreshed {time.strftime('%H:%M:%S')} every {every:g}s, Ctrl-C to quit" if every else ""
    title = f"{len(rows)} experiment{'' if len(rows) == 1 else 's'}, {running} running"
    shown = Table(
        "experiment",
        "name",
        "status",
        "platform",
        "running",
        "waiting",
        "ended",
        "best",
        "trial",
        "duration",
        "started",
        title=title,
        caption=when,
        box=None,
    )
    shown.caption = "\n".join(filter(None, [*(line for *_, why in rows for line in why), when]))  # why they failed
    shown.caption_justify = "left"
    for e, best, _ in rows:
        counts = e.trial_counts
        ended = sum(n for s, n in counts.items() if s not in (TrialStatus.WAITING, TrialStatus.RUNNING))
        limit = e.config.max_trial_number
        shown.add_row(
            e.id,
            escape(e.config.experiment_name or ""),
            status(e.status),
            e.config.platform,
            str(counts.get("RUNNING", 0)),
            str(counts.get("WAITING", 0)),
            f"{ended}/{limit}" if limit else str(ended),
            metric(best.final_metric) if best else "",
            best.id if best else "",
            duration(e.start_time, e.end_time, e.stopped_seconds),
            moment(e.start_time),
        )
    return shown


async def _live(client: AsyncClient, out: Console, every: float) -> None:
    import asyncio

    from rich.live import Live

    limit = max(3, out.size.height - 6)
    with Live(table(await _rows(client, limit), every), console=out, auto_refresh=False) as live:
        while True:
            await asyncio.sleep(every)
            live.update(table(await _rows(client, limit), every), refresh=True)


def top(
    ctx: typer.Context,
    every: Annotated[float, typer.Option("--time", "-t", min=0.5, help="Seconds between refreshes.")] = 3.0,
    once: Annotated[bool, typer.Option("--once", help="Print the table once and exit.")] = False,
) -> None:
    """A live table of the experiments (nnictl top): status, trials, best result; Ctrl-C quits."""
    out = console()
    if once:
        out.print(table(with_client(ctx, lambda c: _rows(c, None)), None))
        return
    with contextlib.suppress(KeyboardInterrupt):
        with_client(ctx, lambda c: _live(c, out, every))
