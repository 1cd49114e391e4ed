"""The stack's commands: ``trialbus up``, ``trialbus down``, ``trialbus status`` (registered in :mod:`trialbus.cli`)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from trialbus import local
from trialbus.output import fail
from trialbus.stack.errors import StackError

if TYPE_CHECKING:  # rich and the stack's code load when a command runs, not with the CLI (trialbus.cli)
    from trialbus.stack.control import StackStatus

DataDir = Annotated[
    Path | None,
    typer.Option(
        envvar="TRIALBUS_DATA_DIR",
        show_default=False,
        help="Where the stack keeps its data and logs [default: .trialbus].",
    ),
]
STATE_STYLE = {"running": "green", "starting": "cyan", "restarting": "yellow", "stopping": "yellow", "exited": "red"}


class _Unbreakable(io.TextIOBase):
    """stderr for the supervisor's console: a closed terminal or pipe (``up | head``) must not
    break a stop half-way, so write errors are dropped."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")


def _cluster_size(size: int) -> int:
    """``--cluster``: 1, 3 or 5, else a usage error saying why."""
    from trialbus.stack.nats import check_size

    try:
        check_size(size)
    except StackError as exc:
        raise typer.BadParameter(str(exc).removeprefix(f"--cluster {size}: ")) from None
    return size


def up(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="After `--`: a command to run once the stack is ready.")
    ] = None,
    nats_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the embedded nats-server.")] = 4222,
    api_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the dispatcher's REST API.")] = 8080,
    gateway_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the metrics gateway.")] = 8081,
    webui_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the web UI.")] = 8082,
    data_dir: DataDir = None,
    keep_trials: Annotated[
        bool, typer.Option(help="On stop, leave running trials running; the next `trialbus up` adopts them.")
    ] = False,
    stop_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds a stop may take (CMD, trials, every part) before it kills.")
    ] = 25.0,
    cluster: Annotated[
        int,
        typer.Option(
            callback=_cluster_size,
            help="nats-servers: 1, or a JetStream cluster of 3 or 5 as in "
            "production, every stream and bucket on each (the first on --nats-port).",
        ),
    ] = 1,
) -> None:
    """Start nats-server and the services of compose.yaml, and keep them running until Ctrl-C.

    A service that dies is started again as its compose `restart:` policy says; one that keeps
    dying stops the stack with its log. Ctrl-C or SIGTERM stops in order: the running
    experiments are stopped (their trials end USER_CANCELED, unless --keep-trials), then every
    service, then nats-server. A second Ctrl-C kills everything at once.

    With `trialbus up -- CMD ARGS…` it runs CMD once the stack is ready, with TRIALBUS_NATS_URL,
    TRIALBUS_API_URL and TRIALBUS_WEBUI_URL set, then stops the stack and exits with CMD's exit code.

    With `--cluster 3` NATS is a JetStream cluster of three nats-servers, as Kubernetes runs it: one
    can die (the stack restarts it) while trials, metrics and every service go on.
    """
    from rich.console import Console

    from trialbus.stack.options import StackOptions
    from trialbus.stack.supervisor import run

    data_dir = data_dir or getattr(ctx.obj, "data_dir", None) or Path(local.DEFAULT_DATA_DIR)
    options = StackOptions(
        data_dir=data_dir,
        nats_port=nats_port,
        api_port=api_port,
        gateway_port=gateway_port,
        webui_port=webui_port,
        keep_trials=keep_trials,
        stop_timeout=stop_timeout,
        cluster=cluster,
    )
    # rich types ``file`` as IO[str]; it only writes and flushes, which _Unbreakable does
    console = Console(file=_Unbreakable(sys.stderr), highlight=False)  # type: ignore[arg-type]
    try:
        code = run(options, command, console)
    except StackError as exc:
        raise fail(str(exc), exc.exit_code, exc.log_tail) from None
    raise typer.Exit(code)


def down_command(
    ctx: typer.Context,
    data_dir: DataDir = None,
    keep_trials: Annotated[
        bool, typer.Option(help="Leave running trials running; the next `trialbus up` adopts them.")
    ] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for an ordered stop, then kill.")] = 40.0,
) -> None:
    """Stop the stack `trialbus up` runs on this data dir (from another terminal), or what a killed one left.

    Without --data-dir: ./.trialbus if a stack ran there, else this user's running stack at --nats-url."""
    from rich.console import Console

    from trialbus.stack.control import down

    console = Console(stderr=True, highlight=False)
    try:
        said = down(_chosen(ctx, data_dir).expanduser().resolve(), console, keep_trials, timeout)
    except StackError as exc:
        raise fail(str(exc)) from None
    if said.startswith("no stack is running") and local.running():
        said += " (`trialbus status --all` lists this user's running stacks: name one with --data-dir)"
    console.print(said)


def status_command(
    ctx: typer.Context,
    data_dir: DataDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            "-a",
            help="List every running `trialbus up` of this user instead: pid, data dir, URLs, since when.",
        ),
    ] = False,
) -> None:
    """Each part of the stack on this data dir: pid, state, uptime, restarts, health. Exit 0 while it runs.

    Without --data-dir: ./.trialbus if a stack ran there, else this user's running stack at --nats-url."""
    from trialbus.stack.control import stack_status

    if every:
        _list_stacks(as_json)
    data_dir = _chosen(ctx, data_dir)
    found = stack_status(data_dir.expanduser().resolve())
    if as_json:
        print(json.dumps(found.as_json() if found else None, indent=1))
    else:
        _print_status(found, data_dir)
    raise typer.Exit(0 if found is not None and found.state == "running" else 1)


def _chosen(ctx: typer.Context, data_dir: Path | None) -> Path:
    """The data dir named (the command's option, else ``trialbus --data-dir``); else ./.trialbus when
    a stack ran there; else this user's running stack at the CLI's NATS URL (:mod:`trialbus.local`)."""
    from trialbus.stack.state import STATE_FILE

    named = data_dir or getattr(ctx.obj, "data_dir", None)
    if named is not None:
        return named
    default = Path(local.DEFAULT_DATA_DIR)
    if (default / STATE_FILE).exists():
        return default
    found = local.running_at(getattr(ctx.obj, "nats_url", None) or local.DEFAULT_NATS_URL)
    return Path(found.data_dir) if found is not None else default


def _list_stacks(as_json: bool) -> None:
    """``status --all``: every running ``trialbus up`` of this user, no secret shown; exit 0 if any.
    One stack a paragraph, as ``jupyter server list``: a data dir or a URL is never cut."""
    from datetime import datetime

    from rich.console import Console

    from trialbus import runtime

    found: list[dict[str, Any]] = [
        {
            "pid": r.pid,
            "data_dir": r.data_dir,
            "started_at": r.started_at,
            "nats_url": r.stack.nats_url,
            "api_url": r.stack.api_url,
            "webui_url": r.stack.webui_url,
        }
        for r in local.running()
    ]
    console = Console(highlight=False, soft_wrap=True)
    if as_json:
        print(json.dumps(found, indent=1))
    elif not found:
        try:
            where = f"none registered in {runtime.runtime_dir()}"
        except runtime.RuntimeDirError as exc:
            where = str(exc)
        console.print(f"no `trialbus up` of this user runs ({where})")
    for each in [] if as_json else found:
        since = datetime.fromisoformat(each["started_at"]).astimezone().strftime("%Y-%m-%d %H:%M:%S")
        console.print(f"[bold]{each['data_dir']}[/]: `trialbus up` pid {each['pid']}, since {since}")
        console.print(f"  NATS {each['nats_url']}  API {each['api_url']}  web UI {each['webui_url']}")
    raise typer.Exit(0 if found else 1)


def _print_status(found: StackStatus | None, data_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if found is None:
        console.print(
            f"no stack has run on {data_dir} (`trialbus up --data-dir {data_dir}` starts one; "
            "`trialbus status --all` lists this user's running stacks)"
        )
        return
    headline = {
        "running": f"[green]running[/]: `trialbus up` pid {found.supervisor_pid}, since {found.started_at[:19]}",
        "leftovers": f"[red]left running by `trialbus up` pid {found.supervisor_pid}, which is gone[/]: "
        f"`trialbus down --data-dir {data_dir}` stops it (`trialbus up` does too)",
        "stopped": "[dim]stopped[/]",
    }[found.state]
    ports = ", ".join(f"{name} {port}" for name, port in found.ports.items())
    console.print(f"Trialbus stack on {found.data_dir}: {headline}; ports {ports}")
    table = Table(box=None, pad_edge=False)
    for column in ("part", "pid", "state", "for", "restarts", "health", "last exit"):
        table.add_column(column, justify="right" if column in ("pid", "restarts") else "left")
    for part in found.parts:
        style = STATE_STYLE.get(part.state, "")
        table.add_row(
            part.name,
            str(part.pid or "-"),
            f"[{style}]{part.state}[/]",
            _duration(part.for_seconds),
            str(part.restarts),
            part.health,
            part.last_exit or "",
        )
    console.print(table)


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s" if minutes else f"{secs}s"
