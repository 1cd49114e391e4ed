"""The documentation's reference pages, generated from the code (docs/gen/reference.py).

``make docs`` builds them at every run of ``make test``; these checks say which part broke, and
that each page covers what the code has: every command, every route, every setting.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import typer.main

from trialbus.cli import app

GEN = Path(__file__).resolve().parents[2] / "docs" / "gen" / "reference.py"


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("docs_reference", GEN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing resolve names through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_cli_page_has_every_command(reference) -> None:
    page = reference.cli_page()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="trialbus")
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        assert f"`trialbus {name}`" in page
        if hasattr(command, "list_commands"):
            sub_ctx = command.context_class(command, info_name=name, parent=ctx)
            for sub in command.list_commands(sub_ctx):
                assert f"`trialbus {name} {sub}`" in page
    assert "Usage: trialbus experiment run" in page


def test_rest_page_has_every_route(reference) -> None:
    pages = reference.rest_pages()
    page = pages["reference/rest.md"]
    for _, stem, _, _ in reference.APIS:
        schema = reference.json.loads(pages[f"reference/openapi-{stem}.json"])
        assert schema["paths"], stem
        for path, operations in schema["paths"].items():
            for method in operations:
                assert f"`{method.upper()} {path}`" in page
    assert "`POST /api/v1/experiments`" in page


def test_settings_page_has_every_setting(reference) -> None:
    page = reference.settings_page()
    for _, _, spec in reference.SERVICES:
        cls = reference.load(spec)
        for name in cls.model_fields:
            assert f"`TRIALBUS_{name.upper()}`" in page, (spec, name)
    # Each field's comment is its description (one checked here; a field without one shares the one above it).
    assert "Trials this host runs at once" in page


def test_field_comments_are_read_from_the_source(reference) -> None:
    from services.common.settings import ServiceSettings

    comments = reference.field_comments(ServiceSettings)
    assert comments["nats_url"] == "NATS server URL(s), comma-separated."
    assert comments["nats_password"] == comments["nats_user"]
