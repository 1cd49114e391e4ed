"""How every ``trialbus`` command ends on an error: one line, ``error: <what to do>``, on stderr."""

from __future__ import annotations

import typer


def fail(message: str, code: int = 1, log_tail: str = "") -> typer.Exit:
    """Print the error (after ``log_tail``, dimmed, when there is one); the Exit to raise."""
    from rich.console import Console  # here: every command imports this module, and --help needs no rich
    from rich.markup import escape

    console = Console(stderr=True, highlight=False)
    if log_tail:
        console.print(f"[dim]{escape(log_tail)}[/]")
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)
