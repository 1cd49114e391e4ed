"""The ``trialbus`` command line: help, argument errors and one-line failures."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trialbus import __version__
from trialbus.cli import app


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner(env={"TRIALBUS_NATS_URL": None, "TRIALBUS_DATA_DIR": None, "COLUMNS": "200"})


def unused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{s.getsockname()[1]}"


def test_help_lists_every_command(cli: CliRunner) -> None:
    result = cli.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("up", "version", "experiment", "trial", "watch", "--nats-url"):
        assert command in result.output
    sub = cli.invoke(app, ["experiment", "--help"])
    assert all(c in sub.output for c in ("create", "list", "show", "stop"))
    sub = cli.invoke(app, ["trial", "--help"])
    assert all(c in sub.output for c in ("list", "show", "cancel", "log"))


def test_up_help_shows_ports_and_the_command_form(cli: CliRunner) -> None:
    result = cli.invoke(app, ["up", "--help"])
    assert result.exit_code == 0
    for option in ("--nats-port", "--api-port", "--gateway-port", "--data-dir", "trialbus up -- CMD"):
        assert option in result.output


def test_version(cli: CliRunner) -> None:
    result = cli.invoke(app, ["version"])
    assert (result.exit_code, result.output.strip()) == (0, __version__)


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["experiment", "create"], "--config"),
        (["experiment", "show"], "ID"),
        (["trial", "list"], "EXP"),
        (["trial", "log", "abc", "--max-bytes", "0"], "--max-bytes"),
        (["up", "--nats-port", "70000"], "--nats-port"),
        (["watch"], "EXP"),
        (["nonsense"], "nonsense"),
    ],
)
def test_argument_errors_print_usage_and_exit_2(cli: CliRunner, args: list[str], complaint: str) -> None:
    result = cli.invoke(app, args)
    assert result.exit_code == 2
    assert complaint in result.output
    assert "Traceback" not in result.output


def test_a_missing_config_file_is_one_line(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(app, ["experiment", "create", "-f", str(tmp_path / "nope.yml")])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot read experiment config")
    assert len(result.output.strip().splitlines()) == 1


def test_an_invalid_config_names_the_field(cli: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_text("trialCommand: python3 trial.py\ntrialConcurrency: 0\ntrainingService: {platform: local}\n")
    result = cli.invoke(app, ["experiment", "create", "-f", str(config)])
    assert result.exit_code == 1
    assert "trialConcurrency" in result.output or "trial_concurrency" in result.output
    assert "Traceback" not in result.output


def test_no_nats_server_is_one_line_that_says_what_to_do(cli: CliRunner) -> None:
    url = unused_url()
    result = cli.invoke(app, ["--nats-url", url, "experiment", "list"])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: cannot connect to NATS at {url}")
    assert "trialbus up" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_nats_url_comes_from_the_environment(tmp_path: Path) -> None:
    url = unused_url()
    result = CliRunner(env={"TRIALBUS_NATS_URL": url}).invoke(app, ["trial", "show", "abc"])
    assert result.exit_code == 1
    assert url in result.output


def test_up_takes_the_command_after_a_double_dash_unparsed(cli: CliRunner, tmp_path: Path) -> None:
    # Given the NATS port is taken, `up` stops before it starts anything
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = ["up", "--nats-port", str(port), "--data-dir", str(tmp_path / "data")]
        result = cli.invoke(app, [*up, "--", "python3", "x.py", "--lr", "1"])
    # Then the options of the command were not taken for `up`'s own, and the error is one line
    assert result.exit_code == 1
    assert result.output.startswith(f"error: port {port} for NATS is in use")
    assert "--nats-port" in result.output


def test_the_web_ui_link_is_the_running_stacks_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`experiment run` prints the web UI of the `trialbus up` whose NATS it uses, on its ports."""
    from trialbus import local
    from trialbus.cli import _webui_url

    stack = local.LocalStack(
        nats_url="nats://127.0.0.1:14222",
        nats_user="client",
        nats_password="p",
        api_url="http://127.0.0.1:18080",
        webui_url="http://127.0.0.1:18082",
    )
    local.write(tmp_path, stack)
    monkeypatch.setenv("TRIALBUS_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TRIALBUS_WEBUI_URL", raising=False)
    assert _webui_url("nats://127.0.0.1:14222") == "http://127.0.0.1:18082"
    assert _webui_url("nats://elsewhere:4222") == "http://127.0.0.1:8082", "another stack: the default"
    monkeypatch.setenv("TRIALBUS_WEBUI_URL", "https://trialbus.example/")
    assert _webui_url("nats://127.0.0.1:14222") == "https://trialbus.example", "the environment says best"
