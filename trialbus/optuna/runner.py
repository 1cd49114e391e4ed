"""``python -m trialbus.optuna.runner <module>:<function>``: one Optuna trial as a Trialbus trial.

The trial command :func:`trialbus.optuna.optimize` gives its experiment. Run by the trial keeper in
the trial's code directory, it imports the objective, calls it with a
:class:`~trialbus.optuna.remote.RemoteTrial` for the study trial its parameters name
(``{"optuna_trial": <number>}``), and ends the trial the way the study should record it:

- a return value: reported as the trial's FINAL result (``nni.report_final_result``), exit 0;
- ``optuna.TrialPruned``: says so to the study, which records the trial PRUNED and early-stops it
  (EARLY_STOPPED here); the runner then waits to be stopped;
- any other exception: its traceback on stderr (the trial's log), the exception's classes told to
  the study (for ``catch=``), exit 1: the trial FAILED.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import optuna

from trialbus.optuna.remote import Asker, RemoteTrial

#: Seconds a pruned trial waits to be early-stopped before it exits by itself (exit 0, no result).
PRUNED_WAIT = 60.0


def load_objective(spec: str) -> Callable[[Any], Any]:
    """``module:qualname`` → the function."""
    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname:
        raise ValueError(f"{spec!r}: expected <module>:<function>")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def classes_of(exc: BaseException) -> list[str]:
    """The exception's classes, most specific first, as ``module.qualname`` (``catch=`` matches them)."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]


def run(spec: str, environ: dict[str, str]) -> int:
    """The trial's exit code (module docstring)."""
    import nni  # the keeper's shim, on the trial's path (docs/architecture.md, "The trial keeper")

    number = int(nni.get_next_parameter()["optuna_trial"])
    asker = Asker.from_env(environ)
    trial = RemoteTrial(asker, number).load()
    try:
        value = load_objective(spec)(trial)
    except optuna.TrialPruned:
        asker.ask("pruned")
        time.sleep(PRUNED_WAIT)
        return 0
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.flush()
        asker.ask("failed", value=classes_of(exc))
        return 1
    if value is None or isinstance(value, str):
        print(f"the objective returned {value!r}, not a number", file=sys.stderr, flush=True)
        asker.ask("failed", value=["TypeError"])
        return 1
    nni.report_final_result(float(value))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m trialbus.optuna.runner <module>:<function>", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())  # the trial's code directory, as `python -m` gives it
    return run(argv[0], dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
