"""How long the ``trialbus`` command takes to start: ``trialbus --help`` next to a bare interpreter.

The target (issue 34) is ``--help`` within ten times ``python3 -c pass`` of the same interpreter:
what the CLI loads before it reads its arguments is typer (with click) and its own command
modules, nothing a command uses (``tests/unit/test_cli_imports.py`` checks the modules). The two
are run one after the other, ``runs`` times each after a warm-up, and compared by their medians,
so a host whose speed drifts slows both alike.

``python -m bench cli`` (or ``python -m bench.cli --runs 31``) prints only this figure.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: ``trialbus --help`` may take this many times a bare interpreter's start.
TARGET = 10.0


@dataclass(frozen=True)
class StartTimes:
    #: Median wall seconds of ``trialbus --help`` and of ``python3 -c pass``.
    help: float
    bare: float
    runs: int

    @property
    def ratio(self) -> float:
        return self.help / self.bare


def wall(argv: list[str]) -> float:
    """Seconds from spawn to exit of ``argv``, its output discarded; a failure is an error."""
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def start_times(runs: int = 21) -> StartTimes:
    """The venv's ``trialbus --help`` (its entry script, as a user runs it) and its bare ``python3``."""
    entry = Path(sys.executable).parent / "trialbus"
    if not entry.exists():
        raise SystemExit(f"{entry} is missing: `make install` installs the trialbus command")
    commands = {"help": [str(entry), "--help"], "bare": [sys.executable, "-c", "pass"]}
    for argv in commands.values():  # warm-up: .pyc files and the page cache
        wall(argv)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(wall(argv))
    return StartTimes(statistics.median(times["help"]), statistics.median(times["bare"]), runs)


def report(figures: StartTimes) -> str:
    verdict = "within" if round(figures.ratio, 1) <= TARGET else "[red]over[/]"  # as printed
    return (
        f"trialbus --help: [bold]{figures.help * 1000:.0f}[/] ms, bare python3 -c pass "
        f"{figures.bare * 1000:.0f} ms (medians of {figures.runs}): [bold]{figures.ratio:.1f}×[/], {verdict} "
        f"the ≤{TARGET:g}× target"
    )


def main() -> None:
    from rich.console import Console

    parser = argparse.ArgumentParser(prog="python -m bench.cli", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs of each command (default 21)")
    Console().print(report(start_times(parser.parse_args().runs)))


if __name__ == "__main__":
    main()
