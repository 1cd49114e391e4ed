"""The ``trialbus`` command starts cheaply: importing the CLI, and printing its help, loads none
of what the commands use (NATS, pydantic and the contracts, the services' code, HTTP clients,
YAML, Optuna, rich, asyncio).

Each of those costs tens of milliseconds; together they made ``trialbus --help`` take two
seconds. The commands import them in their bodies (``trialbus/cli.py`` says why). This checks
the set of modules, not a time, so a slow machine cannot make it fail and a fast one cannot hide
a regression; ``make bench`` shows the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: What the CLI must not load before a command runs: top-level packages, or modules.
HEAVY = {
    "nats",
    "contracts",
    "services",
    "httpx",
    "aiohttp",
    "yaml",
    "optuna",
    "rich",
    "asyncio",
    "trialbus.client",
    "trialbus.async_client",
    "trialbus.api",
    "trialbus.configs",
    "trialbus.render",
    "trialbus.stack.supervisor",
}
#: Typer itself coerces option values with pydantic (``typer._adapters``): loaded once any option
#: is read, as the global ones are before a subcommand's help, but not by ``import`` or ``--help``.
PYDANTIC = {"pydantic", "pydantic_core", "pydantic_settings"}


def loaded_by(code: str, heavy: set[str] = HEAVY) -> set[str]:
    """The modules of ``heavy`` a fresh interpreter holds after running ``code``."""
    names = sorted(heavy)
    probe = (
        f"import json, sys\n{code}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m in {names!r} or m.split('.')[0] in {names!r})))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def help_of(argv: list[str]) -> str:
    return (
        "import contextlib, io\nfrom trialbus.cli import app\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    app({argv!r}, prog_name='trialbus')"
    )


def test_importing_the_cli_loads_nothing_a_command_uses() -> None:
    assert loaded_by("import trialbus.cli", HEAVY | PYDANTIC) == set()


def test_the_help_loads_nothing_a_command_uses() -> None:
    assert loaded_by(help_of(["--help"]), HEAVY | PYDANTIC) == set()


@pytest.mark.parametrize(
    "argv",
    [
        ["experiment", "--help"],
        ["trial", "list", "--help"],
        ["up", "--help"],
        ["render", "--help"],
        ["platform", "--help"],
    ],
)
def test_a_commands_help_loads_nothing_it_uses(argv: list[str]) -> None:
    assert loaded_by(help_of(argv)) == set()


def test_a_command_still_loads_what_it_uses() -> None:
    """The probe can fail: ``trialbus version`` reads the version from the contracts."""
    assert "contracts" in loaded_by(help_of(["version"]))


def test_the_default_nats_url_is_the_clients() -> None:
    """``trialbus.cli`` spells the client's default out (``trialbus.api`` loads pydantic)."""
    from trialbus import api, cli

    assert cli.DEFAULT_NATS_URL == api.DEFAULT_NATS_URL


def test_the_client_loads_nats_without_its_websocket_transport_and_aiohttp_still_imports() -> None:
    """nats-py's optional aiohttp (~170 ms, for ``ws://``) is refused to nats-py alone (trialbus/__init__.py)."""

    def packages(code: str) -> set[str]:
        return {name.split(".")[0] for name in loaded_by(code, {"nats", "aiohttp"})}

    assert packages("import trialbus.client") == {"nats"}
    assert packages("import trialbus.client, aiohttp") == {"nats", "aiohttp"}
    assert packages("import nats") == {"nats", "aiohttp"}  # the probe sees it where trialbus is not imported


def test_a_websocket_url_is_refused_with_what_to_use() -> None:
    trialbus = str(Path(sys.executable).parent / "trialbus")
    done = subprocess.run(
        [trialbus, "--nats-url", "ws://127.0.0.1:1", "experiment", "list"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "Trialbus connects to NATS at nats:// or tls:// URLs, not WebSocket" in done.stderr
