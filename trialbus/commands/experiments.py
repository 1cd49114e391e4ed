"""``trialbus experiment …``, and nnictl's top-level habits: ``create``, ``stop``, ``resume``, ``view``."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trialbus.commands.common import Options, console, moment, status, the_experiment, webui_url, with_client
from trialbus.output import fail

if TYPE_CHECKING:  # what the commands use loads when they run, not with the CLI (trialbus.cli)
    from trialbus.api import ExperimentView
    from trialbus.client import AsyncClient

app = typer.Typer(help="Create, run, list, show, stop, resume and export experiments.", no_args_is_help=True)

ExperimentId = Annotated[str, typer.Argument(metavar="ID")]
#: nnictl's optional ID: left out, the one running experiment.
MaybeExperimentId = Annotated[
    str | None, typer.Argument(metavar="ID", show_default=False, help="Left out: the one running experiment.")
]


@app.command("create")
def experiment_create(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", "-f", help="NNI v2 experiment config (YAML).")],
) -> None:
    """Create an experiment from a config file; its code directory is packed and uploaded."""
    from trialbus.configs import as_config

    try:
        loaded = as_config(config)  # config errors show before any connection is tried
    except ValueError as exc:
        raise fail(str(exc)) from None
    experiment_id = with_client(ctx, lambda c: c.create_experiment(loaded))
    console().print(f"created experiment [bold]{experiment_id}[/]")


@app.command("run")
def experiment_run(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", "-f", help="NNI experiment config (YAML, v2 or v1).")],
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Create it and return; it goes on running.")] = False,
) -> None:
    """Run an NNI experiment to its end: the stack's tuner service proposes the trials.

    Shows progress until the experiment is DONE (maxTrialNumber, maxExperimentDuration, or the
    tuner has no more trials), then the best trials. Ctrl-C stops the experiment; with --detach
    it keeps running (watch it with `trialbus watch ID` or the web UI, stop it with
    `trialbus experiment stop ID`).
    """
    from rich.live import Live

    from contracts import ExperimentStatus
    from services.common.code import PackingError
    from trialbus.api import TrialbusError
    from trialbus.configs import as_config
    from trialbus.experiment import Experiment, check_tuner  # Optuna loads only for this command
    from trialbus.progress import RunView, summary

    options: Options = ctx.obj
    try:
        loaded = as_config(config)
        check_tuner(loaded)  # a config the tuner could not run fails here, before anything is created
    except ValueError as exc:
        raise fail(str(exc)) from None
    out = console()
    experiment = Experiment(
        loaded,
        nats_url=options.nats_url,
        user=options.nats_user,
        password=options.nats_password,
        request_timeout=options.timeout,
        data_dir=options.data_dir,
    )
    try:
        experiment_id = experiment.start()
        url = f"{webui_url(options.nats_url)}/experiments/{experiment_id}"
        out.print(f"created experiment [bold]{experiment_id}[/]; web UI: {url}")
        if detach:
            out.print(
                f"it runs on its own: `trialbus watch {experiment_id}`, `trialbus experiment stop {experiment_id}`"
            )
            return
        view = RunView(experiment_id, loaded)
        try:
            with Live(view, console=out, refresh_per_second=8, transient=False):
                experiment.wait(view.update)
        except KeyboardInterrupt:
            out.print(f"stopping experiment {experiment_id} (use --detach to leave it running)")
            experiment.stop()
            view.update(experiment.get_experiment_profile(), experiment.list_trial_jobs())
        out.print()
        shown = view.view
        assert shown is not None  # wait shows the experiment at least once (its first look), as update does
        out.print(summary(shown, view.trials, loaded))
        if shown.status != ExperimentStatus.DONE:
            raise typer.Exit(1)
    except (TrialbusError, PackingError, ValueError, OSError, TimeoutError) as exc:
        raise fail(str(exc)) from None
    finally:
        experiment.close()


def create(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", "-c", "-f", help="NNI experiment config (YAML, v2 or v1).")],
) -> None:
    """nnictl create: start an experiment with its tuner and return (`trialbus experiment run --detach`)."""
    experiment_run(ctx, config, detach=True)


@app.command("list")
def experiment_list(
    ctx: typer.Context,
    every: Annotated[bool, typer.Option("--all", "-a", hidden=True, help="nnictl's; all are listed anyway.")] = False,
) -> None:
    """List experiments, newest first, whatever their status."""
    from rich.table import Table

    experiments = with_client(ctx, lambda c: c.list_experiments())
    table = Table("id", "name", "status", "trials", "started", box=None)
    for e in experiments:
        counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(e.trial_counts.items()) if n) or "-"
        table.add_row(e.id, e.config.experiment_name or "", status(e.status), counts, moment(e.start_time))
    console().print(table)


@app.command("show")
def experiment_show(ctx: typer.Context, experiment_id: ExperimentId) -> None:
    """Show an experiment as JSON."""
    experiment = with_client(ctx, lambda c: c.get_experiment(experiment_id))
    shown = experiment.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"kind", "v"})
    console().print_json(data=shown)


@app.command("stop")
def stop(
    ctx: typer.Context,
    experiment_id: MaybeExperimentId = None,
    every: Annotated[bool, typer.Option("--all", "-a", help="Stop every running experiment.")] = False,
) -> None:
    """Stop an experiment: no new trials, running ones are canceled (USER_CANCELED)."""
    from contracts import ExperimentStatus

    async def work(client: AsyncClient) -> list[ExperimentView]:
        if every:
            running = [e.id for e in await client.list_experiments() if e.status == ExperimentStatus.RUNNING]
            return [await client.stop_experiment(e) for e in running]
        return [await client.stop_experiment(await the_experiment(client, experiment_id))]

    stopped = with_client(ctx, work)
    for experiment in stopped:
        console().print(f"experiment {experiment.id}: {status(experiment.status)}")
    if not stopped:
        console().print("no experiment is running")


@app.command("resume")
def resume(ctx: typer.Context, experiment_id: ExperimentId) -> None:
    """Run a STOPPED experiment again (nnictl resume): it takes trials again, its tuner goes on.

    maxExperimentDuration counts the time it ran, not the time it stood stopped; maxTrialNumber
    counts the trials it ran before. A DONE experiment has nothing left to run: an error says why.
    """
    experiment = with_client(ctx, lambda c: c.resume_experiment(experiment_id))
    url = f"{webui_url(ctx.obj.nats_url)}/experiments/{experiment.id}"
    console().print(f"experiment {experiment.id}: {status(experiment.status)}; web UI: {url}")


@app.command("delete")
def delete(ctx: typer.Context, experiment_id: ExperimentId) -> None:
    """Delete a stopped or done experiment with its trials, their events and metric records
    (nnictl experiment delete). A running one is refused: stop it first."""
    trials = with_client(ctx, lambda c: c.delete_experiment(experiment_id))
    console().print(f"experiment {experiment_id} deleted, with its {trials} trial(s), their events and metrics")


@app.command("view")
def view(ctx: typer.Context, experiment_id: ExperimentId) -> None:
    """Print the address of an experiment's page in the web UI (opens nothing)."""
    experiment = with_client(ctx, lambda c: c.get_experiment(experiment_id))
    print(f"{webui_url(ctx.obj.nats_url)}/experiments/{experiment.id}")


class ExportType(StrEnum):
    json = "json"
    csv = "csv"


@app.command("export")
def experiment_export(
    ctx: typer.Context,
    kind: Annotated[ExportType, typer.Option("--type", "-t", help="json or csv, as nnictl writes them.")],
    experiment_id: MaybeExperimentId = None,
    filename: Annotated[Path | None, typer.Option("--filename", "-f", help="Write here (default: stdout).")] = None,
    intermediate: Annotated[
        bool, typer.Option("--intermediate", "-i", help="Add each trial's intermediate results.")
    ] = False,
) -> None:
    """Export the trials' parameters, final results and statuses as nnictl experiment export does."""
    import asyncio

    from contracts import MetricType
    from trialbus import export

    async def work(client: AsyncClient) -> list[dict]:
        trials = await client.list_trials(await the_experiment(client, experiment_id))
        steps = None
        if intermediate:
            found = await asyncio.gather(*(client.trial_metrics(t.id) for t in trials))
            steps = {
                t.id: [m.value for m in sorted(ms, key=lambda m: m.sequence) if m.type == MetricType.PERIODICAL]
                for t, ms in zip(trials, found, strict=True)
            }
        return export.records(trials, steps)

    records = with_client(ctx, work)
    text = export.as_json(records) if kind == ExportType.json else export.as_csv(records)
    if filename is None:
        print(text, end="")
        return
    try:
        filename.write_text(text, newline="")
    except OSError as exc:
        raise fail(f"cannot write {filename}: {exc.strerror or exc}") from None
    console().print(f"exported {len(records)} trials to {filename}")
