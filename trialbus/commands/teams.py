"""``trialbus team set/list/remove`` and ``trialbus queue``: how teams share the platforms, and who
runs next (docs/teams.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from trialbus.commands.common import console, with_client

app = typer.Typer(help="Teams' shares of the platforms: quotas, weights, use.", no_args_is_help=True)
Team = Annotated[str, typer.Argument(metavar="TEAM", help="The team's name (the --team of its users).")]


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@app.command("set")
def team_set(
    ctx: typer.Context,
    team: Team,
    gpus: Annotated[float | None, typer.Option("--gpus", min=0, help="GPUs guaranteed to the team.")] = None,
    trials: Annotated[int | None, typer.Option("--trials", min=0, help="Trials at once guaranteed.")] = None,
    weight: Annotated[
        float | None, typer.Option("--weight", min=0.001, max=1000, help="Its weight in the fair share (1).")
    ] = None,
    platform: Annotated[
        str | None,
        typer.Option(
            "--platform",
            help="Set the quota on this platform or pool only: local-gpu, remote, remote/<pool>, openpai/<vc>.",
        ),
    ] = None,
) -> None:
    """Set a team's share (admins): its quota is guaranteed; beyond it the team borrows idle capacity,
    which is preempted when a team under its quota needs it."""
    if gpus is None and trials is None and weight is None:
        raise typer.BadParameter("say at least one of --gpus, --trials, --weight")
    quota = {k: v for k, v in (("gpus", gpus), ("trials", trials)) if v is not None}

    async def put(client):
        if platform is None:
            return await client.set_team(team, gpus=gpus, trials=trials, weight=weight)
        current = next((t for t in await client.list_teams() if t["name"] == team), None)
        platforms = dict((current or {}).get("platforms") or {})
        platforms[platform] = {**platforms.get(platform, {}), **quota}
        return await client.set_team(team, weight=weight, platforms=platforms)

    shown = with_client(ctx, put)
    where = f" on {platform}" if platform else ""
    quota_now = shown["platforms"].get(platform, {}) if platform else shown["quota"]
    console().print(
        f"team {shown['name']}{where}: {_number(quota_now.get('gpus'))} GPUs, {_number(quota_now.get('trials'))} "
        f"trials guaranteed; weight {shown['weight']:g}"
    )


@app.command("list")
def team_list(ctx: typer.Context) -> None:
    """Each team's quota and weight, and per platform what it uses, borrows and waits for."""
    from rich.table import Table

    teams = with_client(ctx, lambda c: c.list_teams())
    if not teams:
        console().print("no team uses a shared platform yet; `trialbus team set TEAM --gpus N` sets a quota")
        return
    table = Table(
        "team", "weight", "platform", "quota gpus/trials", "using gpus/trials", "borrowed", "waiting", box=None
    )
    for t in teams:
        uses = t["use"] or {"-": None}
        for adapter, use in uses.items():
            if use is None:
                quota = t["quota"]
                table.add_row(
                    t["name"],
                    f"{t['weight']:g}",
                    "-",
                    f"{_number(quota['gpus'])}/{_number(quota['trials'])}",
                    "0/0",
                    "-",
                    "0",
                )
                continue
            quota = use["quota"]
            borrowed = f"{use['borrowedGpus']:g} GPUs, {use['borrowedTrials']} trials"
            table.add_row(
                t["name"],
                f"{t['weight']:g}",
                adapter,
                f"{_number(quota['gpus'])}/{_number(quota['trials'])}",
                f"{use['gpus']:g}/{use['trials']}",
                borrowed if use["borrowedGpus"] or use["borrowedTrials"] else "-",
                str(use["waitingExperiments"]),
            )
    console().print(table)


@app.command("remove")
def team_remove(ctx: typer.Context, team: Team) -> None:
    """Forget a team's share (admins): it is guaranteed nothing and weighs 1 again."""
    with_client(ctx, lambda c: c.remove_team(team))
    console().print(f"team {team}: no quota now (it runs on idle capacity, weight 1)")


def queue(ctx: typer.Context) -> None:
    """The experiments waiting for each shared platform, in the order they get capacity, and why."""
    from rich.table import Table

    platforms = with_client(ctx, lambda c: c.queue())
    out = console()
    if not any(p["waiting"] for p in platforms):
        out.print("nothing waits for capacity")
    for p in platforms:
        cap, used = p["capacity"], p["used"]
        slots = "unbounded" if cap["trials"] is None else str(cap["trials"])
        out.print(
            f"[bold]{p['platform']}[/]: {used['gpus']:g}/{cap['gpus']:g} GPUs, {used['trials']}/{slots} trials in use"
        )
        if not p["waiting"]:
            continue
        table = Table("#", "experiment", "team", "priority", "ready", "why it waits", box=None)
        for w in p["waiting"]:
            table.add_row(str(w["position"]), w["experiment"], w["team"], str(w["priority"]), str(w["ready"]), w["why"])
        out.print(table)
