"""The ``trialbus`` command: run the stack, manage experiments and trials, watch progress.

Every command that talks to the stack connects to NATS at ``--nats-url`` (or
``TRIALBUS_NATS_URL``). A failure prints one line, ``error: <what to do>``, and exits 1;
a wrong argument prints the usage and exits 2, as click does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from contracts import ExperimentStatus, MetricType, TrialStatus
from services.common.code import PackingError
from trialbus import __version__, local
from trialbus.client import DEFAULT_NATS_URL, AsyncClient, TrialbusError, as_config
from trialbus.output import fail
from trialbus.render import NoJob
from trialbus.render import render as render_job
from trialbus.stack.commands import down_command, status_command, up

T = TypeVar("T")

app = typer.Typer(
    name="trialbus",
    help="Run hyperparameter-tuning trials over NATS JetStream, NNI-compatible.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
experiment_app = typer.Typer(help="Create, list, show and stop experiments.", no_args_is_help=True)
trial_app = typer.Typer(help="List, show, cancel trials and read their logs.", no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")
app.add_typer(trial_app, name="trial")
platform_app = typer.Typer(help="The adapter replicas that run trials, with their GPUs.", no_args_is_help=True)
app.add_typer(platform_app, name="platform")

STATUS_STYLE = {
    "WAITING": "dim", "RUNNING": "cyan", "SUCCEEDED": "green", "FAILED": "red",
    "USER_CANCELED": "yellow", "SYS_CANCELED": "yellow", "EARLY_STOPPED": "magenta",
    "DONE": "green", "STOPPED": "yellow",
}


@dataclass(frozen=True)
class Options:
    nats_url: str
    timeout: float
    nats_user: str | None = None
    nats_password: str | None = None


def _console() -> Console:
    return Console(highlight=False)


def with_client(ctx: typer.Context, work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Connect, run ``work``, close; known failures become one line and exit 1."""
    options: Options = ctx.obj

    async def main() -> T:
        async with AsyncClient(options.nats_url, request_timeout=options.timeout, user=options.nats_user,
                               password=options.nats_password) as client:  # fmt: skip
            return await work(client)

    try:
        return asyncio.run(main())
    except (TrialbusError, PackingError, ValueError, OSError, TimeoutError) as exc:
        raise fail(str(exc)) from None


@app.callback()
def main(
    ctx: typer.Context,
    nats_url: Annotated[
        str, typer.Option("--nats-url", envvar="TRIALBUS_NATS_URL", help="NATS server(s), comma-separated.")
    ] = DEFAULT_NATS_URL,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the dispatcher.")] = 10.0,
    nats_user: Annotated[
        str | None, typer.Option("--nats-user", envvar="TRIALBUS_NATS_USER", help="NATS user (compose: client).")
    ] = None,
    nats_password: Annotated[
        str | None, typer.Option("--nats-password", envvar="TRIALBUS_NATS_PASSWORD", help="Its password.",
                                 show_default=False)  # fmt: skip
    ] = None,
) -> None:
    ctx.obj = Options(nats_url=nats_url, timeout=timeout, nats_user=nats_user, nats_password=nats_password)


@app.command()
def version() -> None:
    """Print the Trialbus version."""
    print(__version__)


app.command(context_settings={"allow_interspersed_args": False})(up)
app.command("down")(down_command)
app.command("status")(status_command)


# -- experiments ---------------------------------------------------------------------------


@experiment_app.command("create")
def experiment_create(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", "-f", help="NNI v2 experiment config (YAML).")],
) -> None:
    """Create an experiment from a config file; its code directory is packed and uploaded."""
    try:
        loaded = as_config(config)  # config errors show before any connection is tried
    except ValueError as exc:
        raise fail(str(exc)) from None
    experiment_id = with_client(ctx, lambda c: c.create_experiment(loaded))
    _console().print(f"created experiment [bold]{experiment_id}[/]")


@experiment_app.command("run")
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
    from trialbus.experiment import Experiment, check_tuner  # Optuna loads only for this command
    from trialbus.progress import RunView, summary

    options: Options = ctx.obj
    try:
        loaded = as_config(config)
        check_tuner(loaded)  # a config the tuner could not run fails here, before anything is created
    except ValueError as exc:
        raise fail(str(exc)) from None
    console = _console()
    experiment = Experiment(loaded, nats_url=options.nats_url, user=options.nats_user,
                            password=options.nats_password, request_timeout=options.timeout)  # fmt: skip
    try:
        experiment_id = experiment.start()
        url = f"{_webui_url(options.nats_url)}/experiments/{experiment_id}"
        console.print(f"created experiment [bold]{experiment_id}[/]; web UI: {url}")
        if detach:
            console.print(f"it runs on its own: `trialbus watch {experiment_id}`, `trialbus experiment stop "
                          f"{experiment_id}`")
            return
        view = RunView(experiment_id, loaded)
        try:
            with Live(view, console=console, refresh_per_second=8, transient=False):
                experiment.wait(view.update)
        except KeyboardInterrupt:
            console.print(f"stopping experiment {experiment_id} (use --detach to leave it running)")
            experiment.stop()
            view.update(experiment.get_experiment_profile(), experiment.list_trial_jobs())
        console.print()
        console.print(summary(view.view, view.trials, loaded))
        if view.view.status != ExperimentStatus.DONE:
            raise typer.Exit(1)
    except (TrialbusError, PackingError, ValueError, OSError, TimeoutError) as exc:
        raise fail(str(exc)) from None
    finally:
        experiment.close()


def _webui_url(nats_url: str) -> str:
    """``TRIALBUS_WEBUI_URL``, else that of the ``trialbus up`` whose NATS this is, else the default."""
    stack = local.stack_for(nats_url)
    found = os.environ.get("TRIALBUS_WEBUI_URL") or (stack.webui_url if stack else "http://127.0.0.1:8082")
    return found.rstrip("/")


@experiment_app.command("list")
def experiment_list(ctx: typer.Context) -> None:
    """List experiments, newest first."""
    experiments = with_client(ctx, lambda c: c.list_experiments())
    table = Table("id", "name", "status", "trials", "started", box=None)
    for e in experiments:
        counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(e.trial_counts.items()) if n) or "-"
        table.add_row(e.id, e.config.experiment_name or "", _status(e.status), counts, _time(e.start_time))
    _console().print(table)


@experiment_app.command("show")
def experiment_show(ctx: typer.Context, experiment_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Show an experiment as JSON."""
    experiment = with_client(ctx, lambda c: c.get_experiment(experiment_id))
    shown = experiment.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"kind", "v"})
    _console().print_json(data=shown)


@experiment_app.command("stop")
def experiment_stop(ctx: typer.Context, experiment_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Stop an experiment: no new trials, running ones are canceled."""
    experiment = with_client(ctx, lambda c: c.stop_experiment(experiment_id))
    _console().print(f"experiment {experiment.id}: {_status(experiment.status)}")


# -- jobs ----------------------------------------------------------------------------------


@app.command()
def render(config: Annotated[Path, typer.Option("--config", "-f", help="NNI v2 experiment config (YAML).")]) -> None:
    """Print the OpenPAI job YAML the openpai adapter would submit for a trial; secrets masked, nothing contacted."""
    try:
        text = render_job(as_config(config))
    except NoJob as exc:
        raise fail(str(exc), code=2) from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    print(text, end="")


# -- platforms -----------------------------------------------------------------------------


@platform_app.command("list")
def platform_list(ctx: typer.Context) -> None:
    """List adapter replicas: running and waiting trials, and each GPU with its load."""
    replicas = with_client(ctx, lambda c: c.list_platforms())
    if not replicas:
        _console().print("no adapter replica is running")
        return
    table = Table("adapter", "replica", "trials", "waiting", "GPU", "memory MiB", "util", "our trials", "other",
                  box=None)
    for p in replicas:
        trials = f"{p.running}/{p.max_trials}" if p.max_trials else str(p.running)
        first = (p.adapter, p.replica, trials, str(len(p.waiting)))
        if p.machines:  # remote: one line per SSH machine, its GPUs below it
            table.add_row(*first, "", "", "", "", "")
            for m in p.machines:
                state = f"{m.cpus} CPUs" if m.up else f"[red]unreachable[/]: {m.error}"
                _gpu_rows(table, ("", f"└ {m.name}", str(m.running), ""), m.gpus, state if not m.gpus or not m.up
                          else None)  # fmt: skip
            continue
        if p.clusters:  # openpai: one line per cluster and user
            table.add_row(*first, "", "", "", "", "")
            for c in p.clusters:
                state = f"[red]{c.error}[/]" if c.error else f"{c.jobs} jobs"
                if c.environments:
                    state += f", environments {c.busy_environments}/{c.environments} busy"
                if c.paused_for:
                    state += f", submissions paused {c.paused_for:.0f}s (429)"
                table.add_row("", f"└ {c.name}", "", "", state, "", "", "", "")
            continue
        _gpu_rows(table, first, p.gpus, None if p.gpus else f"none ({p.gpu_error})" if p.gpu_error else "none")
    _console().print(table)


def _gpu_rows(table: Table, first: tuple[str, ...], gpus: list, instead: str | None) -> None:
    """One row per GPU after the ``first`` cells (``instead`` in the GPU column when given)."""
    if instead is not None or not gpus:
        table.add_row(*first, instead or "none", "", "", "", "")
        return
    for n, g in enumerate(gpus):
        util = "-" if g.gpu_util is None else f"{g.gpu_util}%"
        table.add_row(*(first if n == 0 else ("",) * 4), f"{g.index}: {g.name}",
                      f"{g.memory_used_mib}/{g.memory_total_mib}", util, str(len(g.trials)),
                      str(g.foreign_processes))  # fmt: skip


# -- trials --------------------------------------------------------------------------------


@trial_app.command("list")
def trial_list(ctx: typer.Context, experiment_id: Annotated[str, typer.Argument(metavar="EXP")]) -> None:
    """List the trials of an experiment."""
    trials = with_client(ctx, lambda c: c.list_trials(experiment_id))
    table = Table("trial", "seq", "status", "intermediate", "final", "duration", box=None)
    for t in sorted(trials, key=lambda t: t.sequence_id):
        table.add_row(t.id, str(t.sequence_id), _status(t.status), str(t.intermediate_count),
                      _metric(t.final_metric), _duration(t.start_time, t.end_time))
    _console().print(table)


@trial_app.command("show")
def trial_show(ctx: typer.Context, trial_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Show a trial as JSON."""
    trial = with_client(ctx, lambda c: c.get_trial(trial_id))
    _console().print_json(data=trial.view())


@trial_app.command("cancel")
def trial_cancel(ctx: typer.Context, trial_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Cancel a trial (it ends USER_CANCELED)."""
    status = with_client(ctx, lambda c: c.cancel_trial(trial_id))
    _console().print(f"trial {trial_id}: {_status(status)}")


@trial_app.command("log")
def trial_log(
    ctx: typer.Context,
    trial_id: Annotated[str, typer.Argument(metavar="ID")],
    max_bytes: Annotated[int, typer.Option(min=1, help="At most this many bytes of the tail.")] = 64 * 1024,
) -> None:
    """Print the tail of a trial's stdout and stderr."""
    print(with_client(ctx, lambda c: c.trial_log(trial_id, max_bytes)), end="")


# -- watch ---------------------------------------------------------------------------------


@dataclass
class Row:
    id: str
    seq: int | None = None
    status: str = TrialStatus.WAITING.value
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

    def row(self, trial_id: str) -> Row:
        return self.rows.setdefault(trial_id, Row(trial_id))

    def __rich__(self) -> Table:
        rows = sorted(self.rows.values(), key=lambda r: (r.seq is None, r.seq or 0, r.id))
        shown = rows[-self.max_rows :]
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.status] = counts.get(r.status, 0) + 1
        summary = "  ".join(f"{_status(s)} {n}" for s, n in sorted(counts.items())) or "no trials yet"
        more = f" (last {len(shown)} of {len(rows)})" if len(shown) < len(rows) else ""
        table = Table(
            "trial", "seq", "status", "intermediate", "latest", "final", "duration",
            title=f"experiment {self.experiment_id} {escape(self.name)} {_status(self.status)}",
            caption=summary + more,
        )
        for r in shown:
            table.add_row(r.id, "" if r.seq is None else str(r.seq), _status(r.status), str(r.intermediate),
                          _metric(r.latest), _metric(r.final), _duration(r.start, r.end))
        return table


async def _watch(client: AsyncClient, experiment_id: str, console: Console) -> None:
    view = WatchView(experiment_id, max_rows=max(5, console.size.height - 10))

    async def refresh() -> None:
        """Experiment status and sequence ids; the streams carry everything else."""
        experiment = await client.get_experiment(experiment_id)
        view.status, view.name = experiment.status.value, experiment.config.experiment_name or ""
        for trial in await client.list_trials(experiment_id):
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
        with Live(view, console=console, refresh_per_second=4):
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


@app.command()
def watch(ctx: typer.Context, experiment_id: Annotated[str, typer.Argument(metavar="EXP")]) -> None:
    """Live table of an experiment's trials; exits when it is DONE or STOPPED, or on Ctrl-C."""
    console = _console()
    with contextlib.suppress(KeyboardInterrupt):
        with_client(ctx, lambda c: _watch(c, experiment_id, console))


# -- formatting ----------------------------------------------------------------------------


def _status(status: str) -> str:
    return f"[{STATUS_STYLE.get(str(status), 'white')}]{status}[/]"


def _metric(value: Any) -> str:
    if isinstance(value, dict) and "default" in value:
        value = value["default"]
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return escape(value if isinstance(value, str) else json.dumps(value))


def _time(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _duration(start: datetime | None, end: datetime | None) -> str:
    if start is None:
        return ""
    hours, rest = divmod(int(((end or datetime.now(UTC)) - start).total_seconds()), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
