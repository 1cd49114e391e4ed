"""The trial keeper and the ``nni`` shim that adapters ship next to every trial.

Neither file is imported by the services: adapters copy them to the trial's host and run
``python3 -S -I <KEEPER_PATH>`` there (docs/internals.md §1). Adapters set
``TRIALBUS_PYTHONPATH_PREPEND`` to ``SHIM_PATH`` (unless ``nni_shim=never``), so ``import nni``
is the stdlib trial API, backed by an installed ``nni`` for the rest. ``trial_template.py``,
``warm_trial.py`` and ``warm_pool.py`` (with ``script_imports.py``) fork trials from warm
interpreters (docs/warm-start.md).
"""

from pathlib import Path

#: The keeper: one stdlib-only file, run as ``python3 -S -I trial_keeper.py``.
KEEPER_PATH = Path(__file__).with_name("trial_keeper.py")
#: The directory holding the ``nni`` shim package (put it on the trial's PYTHONPATH).
SHIM_PATH = Path(__file__).with_name("nni_shim")
#: What a host needs beside the keeper to fork warm trials (the remote agent's machines).
WARM_FILES = {
    name: Path(__file__).with_name(name)
    for name in ("trial_template.py", "warm_trial.py", "warm_pool.py", "script_imports.py", "kept.py")
}

__all__ = ["KEEPER_PATH", "SHIM_PATH", "WARM_FILES"]
