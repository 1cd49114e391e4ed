"""``trialbus platform list``: the adapter replicas that run trials, with their GPUs;
``trialbus platform drain`` / ``undrain``: take one out of service and back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from trialbus.commands.common import console, with_client

if TYPE_CHECKING:
    from rich.table import Table

app = typer.Typer(help="The adapter replicas that run trials, with their GPUs; drain one.", no_args_is_help=True)
Adapter = Annotated[str, typer.Argument(metavar="ADAPTER", help="local-gpu, remote, openpai or frameworkcontroller.")]
Replica = Annotated[str, typer.Argument(metavar="REPLICA", help="The replica, as `platform list` names it.")]


@app.command("drain")
def platform_drain(ctx: typer.Context, adapter: Adapter, replica: Replica) -> None:
    """Take a replica out of service: it takes no new trials, and the ones it runs are preempted
    (SIGTERM, their grace period, SIGKILL) and run again as their next attempt, elsewhere."""
    reply = with_client(ctx, lambda c: c.drain_platform(adapter, replica, True))
    console().print(f"{adapter} replica {reply['replica']} drained: {reply['preempted']} trial(s) preempted")


@app.command("undrain")
def platform_undrain(ctx: typer.Context, adapter: Adapter, replica: Replica) -> None:
    """Let a drained replica take trials again."""
    reply = with_client(ctx, lambda c: c.drain_platform(adapter, replica, False))
    console().print(f"{adapter} replica {reply['replica']} takes trials again")


@app.command("list")
def platform_list(ctx: typer.Context) -> None:
    """List adapter replicas: running and waiting trials, and each GPU with its load."""
    from rich.table import Table

    replicas = with_client(ctx, lambda c: c.list_platforms())
    if not replicas:
        console().print("no adapter replica is running")
        return
    table = Table(
        "adapter", "replica", "trials", "waiting", "GPU", "memory MiB", "util", "our trials", "other", box=None
    )
    for p in replicas:
        trials = f"{p.running}/{p.max_trials}" if p.max_trials else str(p.running)
        replica = f"{p.replica} [yellow](draining)[/]" if p.draining else p.replica
        first = (p.adapter, replica, trials, str(len(p.waiting)))
        if p.machines:  # remote: one line per SSH machine, its GPUs below it
            table.add_row(*first, "", "", "", "", "")
            for m in p.machines:
                state = f"{m.cpus} CPUs" if m.up else f"[red]unreachable[/]: {m.error}"
                _gpu_rows(
                    table, ("", f"└ {m.name}", str(m.running), ""), m.gpus, state if not m.gpus or not m.up else None
                )
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
    console().print(table)


def _gpu_rows(table: Table, first: tuple[str, ...], gpus: list, instead: str | None) -> None:
    """One row per GPU after the ``first`` cells (``instead`` in the GPU column when given)."""
    if instead is not None or not gpus:
        table.add_row(*first, instead or "none", "", "", "", "")
        return
    for n, g in enumerate(gpus):
        util = "-" if g.gpu_util is None else f"{g.gpu_util}%"
        table.add_row(
            *(first if n == 0 else ("",) * 4),
            f"{g.index}: {g.name}",
            f"{g.memory_used_mib}/{g.memory_total_mib}",
            util,
            str(len(g.trials)),
            str(g.foreign_processes),
        )
