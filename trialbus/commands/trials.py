"""``trialbus trial …`` (with nnictl's ``ls`` and ``kill``) and ``trialbus log trial``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from trialbus.commands.common import console, duration, metric, status, the_experiment, with_client

if TYPE_CHECKING:  # what the commands use loads when they run, not with the CLI (trialbus.cli)
    from contracts import TrialState
    from trialbus.client import AsyncClient

app = typer.Typer(help="List, show, cancel, retry trials and read their logs.", no_args_is_help=True)
log_app = typer.Typer(help="Read logs (nnictl log): `trialbus log trial ID`.", no_args_is_help=True)

Head = Annotated[int | None, typer.Option("--head", min=1, help="Only the N with the highest default metric.")]
Tail = Annotated[int | None, typer.Option("--tail", min=1, help="Only the N with the lowest default metric.")]
#: nnictl's ``[ID] --trial_id TRIAL``, or plainly ``TRIAL``.
First = Annotated[
    str | None,
    typer.Argument(metavar="ID", show_default=False, help="The trial; with -T, its experiment (nnictl's order)."),
]
TrialOption = Annotated[
    str | None, typer.Option("--trial-id", "--trial_id", "-T", show_default=False, help="The trial (nnictl's -T).")
]


Status = Annotated[
    str | None, typer.Option("--status", show_default=False, help="Only trials in these statuses: RUNNING,WAITING")
]
Sort = Annotated[str, typer.Option("--sort", help="sequence (submission order) or metric (best final first).")]
Limit = Annotated[
    int | None,
    typer.Option(
        "--limit", min=1, max=5000, show_default=False, help="Only the first N (one page from the dispatcher)."
    ),
]


def _table(
    ctx: typer.Context,
    experiment_id: str | None,
    head: int | None,
    tail: int | None,
    only: str | None = None,
    sort: str = "sequence",
    limit: int | None = None,
) -> None:
    from rich.table import Table

    from contracts.state import default_metric

    if sort not in ("sequence", "metric"):
        raise typer.BadParameter(f"{sort!r}: sort by sequence or metric", param_hint="--sort")

    async def work(client: AsyncClient) -> list[TrialState]:
        experiment = await the_experiment(client, experiment_id)
        if limit is not None and not (head or tail):
            return (await client.trial_page(experiment, limit=limit, status=only, sort=sort)).trials
        return await client.list_trials(experiment, status=only, sort=sort)  # every page

    trials = with_client(ctx, work)
    if head or tail:  # nnictl's: by the default metric, highest first; trials without one are left out
        scored = sorted(
            (t for t in trials if default_metric(t.final_metric) is not None),
            key=lambda t: default_metric(t.final_metric) or 0.0,
            reverse=True,
        )
        trials = scored[:head] if head else scored[-tail:] if tail else scored
    table = Table("trial", "seq", "status", "intermediate", "final", "duration", "platform", box=None)
    for t in trials:
        table.add_row(
            t.id,
            str(t.sequence_id),
            status(t.status),
            str(t.intermediate_count),
            metric(t.final_metric),
            duration(t.start_time, t.end_time),
            t.platform,
        )
    console().print(table)


@app.command("list")
def trial_list(
    ctx: typer.Context,
    experiment_id: Annotated[str, typer.Argument(metavar="EXP")],
    head: Head = None,
    tail: Tail = None,
    status: Status = None,
    sort: Sort = "sequence",
    limit: Limit = None,
) -> None:
    """List the trials of an experiment."""
    _table(ctx, experiment_id, head, tail, status, sort, limit)


@app.command("ls")
def trial_ls(
    ctx: typer.Context,
    experiment_id: Annotated[
        str | None, typer.Argument(metavar="EXP", show_default=False, help="Left out: the one running experiment.")
    ] = None,
    head: Head = None,
    tail: Tail = None,
    status: Status = None,
    sort: Sort = "sequence",
    limit: Limit = None,
) -> None:
    """List the trials of an experiment (nnictl trial ls)."""
    _table(ctx, experiment_id, head, tail, status, sort, limit)


@app.command("show")
def trial_show(ctx: typer.Context, trial_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Show a trial as JSON."""
    trial = with_client(ctx, lambda c: c.get_trial(trial_id))
    console().print_json(data=trial.view())


@app.command("cancel")
def trial_cancel(ctx: typer.Context, trial_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Cancel a trial (it ends USER_CANCELED)."""
    found = with_client(ctx, lambda c: c.cancel_trial(trial_id))
    console().print(f"trial {trial_id}: {status(found)}")


@app.command("retry")
def trial_retry(ctx: typer.Context, trial_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Run a trial that has ended again, as its next attempt (same id and parameters; its
    checkpoint directory is kept)."""
    attempt = with_client(ctx, lambda c: c.retry_trial(trial_id))
    console().print(f"trial {trial_id}: attempt {attempt} {status('WAITING')}")


@app.command("kill")
def trial_kill(ctx: typer.Context, first: First = None, trial_id: TrialOption = None) -> None:
    """Cancel a trial (nnictl trial kill): `trial kill TRIAL`, or `trial kill [EXP] -T TRIAL`."""
    _named(first, trial_id)

    async def work(client: AsyncClient) -> str:
        return (await client.cancel_trial(await _the_trial(client, first, trial_id))).value

    found = with_client(ctx, work)
    console().print(f"trial {trial_id or first}: {status(found)}")


@log_app.command("trial")
def log_trial(
    ctx: typer.Context,
    first: First = None,
    trial_id: TrialOption = None,
    max_bytes: Annotated[int, typer.Option(min=1, help="At most this many bytes of the tail.")] = 64 * 1024,
) -> None:
    """Print the tail of a trial's stdout and stderr: `log trial TRIAL`, or `log trial [EXP] -T TRIAL`."""
    _named(first, trial_id)

    async def work(client: AsyncClient) -> str:
        return await client.trial_log(await _the_trial(client, first, trial_id), max_bytes)

    print(with_client(ctx, work), end="")


@app.command("log")
def trial_log(
    ctx: typer.Context,
    trial_id: Annotated[str, typer.Argument(metavar="ID")],
    max_bytes: Annotated[int, typer.Option(min=1, help="At most this many bytes of the tail.")] = 64 * 1024,
    attempt: Annotated[int | None, typer.Option(min=0, help="An earlier attempt's log (0 is the first).")] = None,
) -> None:
    """Print the tail of a trial's stdout and stderr (its current attempt's, or --attempt N's)."""
    print(with_client(ctx, lambda c: c.trial_log(trial_id, max_bytes, attempt)), end="")


def _named(first: str | None, trial_id: str | None) -> None:
    """A trial is named, or the usage is shown (exit 2) before anything is contacted."""
    if first is None and trial_id is None:
        raise typer.BadParameter("name the trial: TRIAL, or -T TRIAL (`trialbus trial ls` lists them)", param_hint="ID")


async def _the_trial(client: AsyncClient, first: str | None, trial_id: str | None) -> str:
    """nnictl's ``[EXP] -T TRIAL`` (the trial must be the experiment's), or a trial named alone."""
    from trialbus.api import TrialbusError

    if trial_id is None:
        return str(first)
    if first is not None and (trial := await client.get_trial(trial_id)).experiment_id != first:
        raise TrialbusError(404, f"trial {trial_id} is not in experiment {first} (it is in {trial.experiment_id})")
    return trial_id
