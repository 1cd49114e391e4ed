"""The ``trialbus`` command: run the stack, manage experiments and trials, watch progress.

Every command that talks to the stack connects to NATS at ``--nats-url`` (or
``TRIALBUS_NATS_URL``). A failure prints one line, ``error: <what to do>``, and exits 1;
a wrong argument prints the usage and exits 2, as click does.

The commands live by subject in :mod:`trialbus.commands`; this module assembles them, nnictl's
names among them (``create``, ``stop``, ``resume``, ``view``, ``top``, ``trial ls``, ``trial kill``,
``log trial``) so that an NNI user's habits work.

Importing this module must stay cheap (``trialbus --help`` within ten times a bare interpreter's
start; the bench shows it): the command modules import what the commands need (NATS, pydantic,
the contracts, the code packer, the adapters) inside the commands, and
``tests/unit/test_cli_imports.py`` fails when one of those loads with the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trialbus import local
from trialbus.commands import experiments, imports, people, platforms, teams, top, trials, watch
from trialbus.commands import update as update_commands
from trialbus.commands.common import Options
from trialbus.commands.common import webui_url as _webui_url
from trialbus.output import fail
from trialbus.stack.commands import down_command, status_command, up

__all__ = ["_webui_url", "app"]  # _webui_url: where it was before the commands moved out

#: :data:`trialbus.api.DEFAULT_NATS_URL`, which a test checks: that module loads pydantic and the contracts.
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

app = typer.Typer(
    name="trialbus",
    help="Run hyperparameter-tuning trials over NATS JetStream, NNI-compatible.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's plain help and usage errors, for every subcommand too: typer's rich help alone costs
    # 100-150 ms at start (rich, markdown-it), more than every command's imports; plain help also
    # wraps the docstrings' paragraphs instead of keeping their line breaks.
    rich_markup_mode=None,
)


@app.callback()
def main(
    ctx: typer.Context,
    nats_url: Annotated[
        str | None,
        typer.Option(
            "--nats-url",
            envvar="TRIALBUS_NATS_URL",
            show_default=False,
            help=f"NATS server(s), comma-separated [default: the NATS of --data-dir's stack, else {DEFAULT_NATS_URL}].",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the dispatcher.")] = 10.0,
    nats_user: Annotated[
        str | None, typer.Option("--nats-user", envvar="TRIALBUS_NATS_USER", help="NATS user (compose: client).")
    ] = None,
    nats_password: Annotated[
        str | None,
        typer.Option("--nats-password", envvar="TRIALBUS_NATS_PASSWORD", help="Its password.", show_default=False),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            envvar="TRIALBUS_DATA_DIR",
            show_default=False,
            help="Data dir of the `trialbus up` to use, from any directory [default: this "
            "user's running stack at --nats-url].",
        ),
    ] = None,
) -> None:
    ctx.obj = Options(
        nats_url=local.nats_url(nats_url, data_dir),
        timeout=timeout,
        nats_user=nats_user,
        nats_password=nats_password,
        data_dir=data_dir,
    )


@app.command()
def version() -> None:
    """Print the Trialbus version."""
    from trialbus import __version__

    print(__version__)


@app.command()
def render(config: Annotated[Path, typer.Option("--config", "-f", help="NNI v2 experiment config (YAML).")]) -> None:
    """Print the OpenPAI job YAML the openpai adapter would submit for a trial; secrets masked, nothing contacted."""
    from trialbus.configs import as_config
    from trialbus.render import NoJob
    from trialbus.render import render as render_job

    try:
        text = render_job(as_config(config))
    except NoJob as exc:
        raise fail(str(exc), code=2) from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    print(text, end="")


# The stack.
app.command(context_settings={"allow_interspersed_args": False})(up)
app.command("down")(down_command)
app.command("status")(status_command)

# Experiments, trials, platforms.
experiments.app.command("import")(imports.import_results)
app.add_typer(experiments.app, name="experiment")
app.add_typer(trials.app, name="trial")
app.add_typer(platforms.app, name="platform")
app.add_typer(people.app, name="user")
app.command("whoami")(people.whoami)
app.command("audit")(people.audit)
app.add_typer(teams.app, name="team")
app.command("queue")(teams.queue)
app.add_typer(trials.log_app, name="log")
app.command("watch")(watch.watch)
app.add_typer(update_commands.app, name="update")

# nnictl's top-level habits.
app.command("create")(experiments.create)
app.command("stop")(experiments.stop)
app.command("resume")(experiments.resume)
app.command("view")(experiments.view)
app.command("top")(top.top)
