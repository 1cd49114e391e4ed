"""What every command shares: the connection its global options describe, how it finds the experiment
meant when none is named, and how statuses, metrics and times are shown."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from trialbus import local
from trialbus.output import fail

if TYPE_CHECKING:  # rich, and the client with NATS and pydantic, load when a command runs (trialbus.cli)
    from rich.console import Console

    from trialbus.client import AsyncClient

T = TypeVar("T")

STATUS_STYLE = {
    "WAITING": "dim",
    "RUNNING": "cyan",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "USER_CANCELED": "yellow",
    "SYS_CANCELED": "yellow",
    "EARLY_STOPPED": "magenta",
    "DONE": "green",
    "STOPPED": "yellow",
}
#: Where the web UI is when nothing says otherwise (``trialbus up``'s default port).
DEFAULT_WEBUI_URL = "http://127.0.0.1:8082"


@dataclass(frozen=True)
class Options:
    """The global options (``trialbus --nats-url … COMMAND``), for every command that connects."""

    nats_url: str
    timeout: float
    nats_user: str | None = None
    nats_password: str | None = None
    #: ``--data-dir``: the stack whose credentials to use (:mod:`trialbus.local`); None: the one at ``nats_url``.
    data_dir: Path | None = None


def console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def with_client(ctx: typer.Context, work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Connect, run ``work``, close; known failures become one line and exit 1."""
    import asyncio

    from services.common.code import PackingError
    from trialbus.api import TrialbusError
    from trialbus.client import AsyncClient

    options: Options = ctx.obj

    async def main() -> T:
        async with AsyncClient(
            options.nats_url,
            request_timeout=options.timeout,
            user=options.nats_user,
            password=options.nats_password,
            data_dir=options.data_dir,
        ) as client:
            return await work(client)

    try:
        return asyncio.run(main())
    except (TrialbusError, PackingError, ValueError, OSError, TimeoutError) as exc:
        raise fail(str(exc)) from None


async def the_experiment(client: AsyncClient, given: str | None) -> str:
    """``given``, else the one RUNNING experiment (nnictl's habit: the ID may be left out when
    one experiment runs); none or several running is an error that says what to type."""
    from contracts import ExperimentStatus
    from trialbus.api import TrialbusError

    if given:
        return given
    running = [e.id for e in await client.list_experiments() if e.status == ExperimentStatus.RUNNING]
    if len(running) == 1:
        return running[0]
    if not running:
        raise TrialbusError(404, "no experiment is running; name one (`trialbus experiment list` lists them)")
    raise TrialbusError(409, f"{len(running)} experiments are running ({', '.join(running)}); name one")


def webui_url(nats_url: str) -> str:
    """``TRIALBUS_WEBUI_URL``, else that of the ``trialbus up`` whose NATS this is, else the default."""
    stack = local.stack_for(nats_url)
    found = os.environ.get("TRIALBUS_WEBUI_URL") or (stack.webui_url if stack else DEFAULT_WEBUI_URL)
    return found.rstrip("/")


# -- formatting ----------------------------------------------------------------------------


def status(value: str) -> str:
    return f"[{STATUS_STYLE.get(str(value), 'white')}]{value}[/]"


def metric(value: Any) -> str:
    from rich.markup import escape

    if isinstance(value, dict) and "default" in value:
        value = value["default"]
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return escape(value if isinstance(value, str) else json.dumps(value))


def moment(when: datetime | None) -> str:
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S") if when else ""


def duration(start: datetime | None, end: datetime | None, stopped: float = 0.0) -> str:
    """``m:ss`` or ``h:mm:ss`` from ``start`` to ``end`` (or now), ``stopped`` seconds left out."""
    if start is None:
        return ""
    hours, rest = divmod(int(((end or datetime.now(UTC)) - start).total_seconds() - stopped), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
