"""``trialbus user add/list/remove/rotate``, ``trialbus whoami`` and ``trialbus audit``: the people
who share this Trialbus, and what they asked of it (docs/security.md, "People").

Who asks is the token in ``TRIALBUS_API_TOKEN``; without one, the NATS credential of this user's
``trialbus up`` speaks as the stack's admin.
"""

from __future__ import annotations

from typing import Annotated

import typer

from trialbus.commands.common import console, with_client

app = typer.Typer(help="The people who use this Trialbus: add, list, remove, new tokens.", no_args_is_help=True)
Name = Annotated[str, typer.Argument(metavar="NAME", help="The user's name: lower-case letters, digits, - and _.")]


def _show_token(verb: str, user: dict) -> None:
    out = console()
    out.print(f"{verb} {user['name']} (team {user['team']}, {user['role']}). Their token, shown this once:")
    out.print(user["token"], soft_wrap=True)
    out.print("[dim]give it to them privately; they set TRIALBUS_API_TOKEN to it (only its hash is kept)[/]")


@app.command("add")
def user_add(
    ctx: typer.Context,
    name: Name,
    team: Annotated[str, typer.Option("--team", help="Their team: they act on its experiments.")],
    role: Annotated[str, typer.Option("--role", help="admin, member (default) or viewer.")] = "member",
) -> None:
    """Add a user: members create experiments for their team and act on its work; viewers read;
    admins do everything."""
    _show_token("added", with_client(ctx, lambda c: c.add_user(name, team, role)))


@app.command("list")
def user_list(ctx: typer.Context) -> None:
    """List users: name, team, role, when made and when their token was last replaced."""
    from rich.table import Table

    users = with_client(ctx, lambda c: c.list_users())
    if not users:
        console().print("no users yet: `trialbus user add NAME --team TEAM` adds one")
        return
    table = Table("name", "team", "role", "created", "token replaced", box=None)
    for u in users:
        table.add_row(u["name"], u["team"], u["role"], u["created"][:19], (u["rotated"] or "-")[:19])
    console().print(table)


@app.command("remove")
def user_remove(ctx: typer.Context, name: Name) -> None:
    """Remove a user: their token stops working at once (their experiments stay, with their team)."""
    user = with_client(ctx, lambda c: c.remove_user(name))
    console().print(f"removed {user['name']} (team {user['team']})")


@app.command("rotate")
def user_rotate(ctx: typer.Context, name: Name) -> None:
    """Give a user a new token; the old one stops working at once."""
    _show_token("new token for", with_client(ctx, lambda c: c.rotate_token(name)))


def whoami(ctx: typer.Context) -> None:
    """Who your token (TRIALBUS_API_TOKEN) names: name, team and role."""
    me = with_client(ctx, lambda c: c.whoami())
    console().print(f"{me['name']} (team {me['team']}, {me['role']})")


def audit(
    ctx: typer.Context,
    team: Annotated[str | None, typer.Option("--team", help="One team's work (admins; others see their own).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="How many, newest last.")] = 50,
) -> None:
    """Who did what, when: the newest changes asked of the dispatcher, done or refused."""
    from rich.table import Table

    records = with_client(ctx, lambda c: c.audit(limit, team))
    if not records:
        console().print("nothing recorded yet")
        return
    table = Table("time", "user", "action", "target", "team", "answer", box=None)
    for r in records:
        answer = "ok" if r["status"] < 300 else f"[red]{r['status']}[/] {r.get('message') or ''}"
        table.add_row(r["time"][:19], r["user"], r["action"], r.get("target") or "", r.get("team") or "", answer)
    console().print(table)
