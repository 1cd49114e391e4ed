"""One job of a Hydra sweep, run as a Trialbus trial: ``python trialbus_hydra_job.py <batch directory>``.

The launcher ships this file in the batch directory as ``trialbus_hydra_job.py``, so it imports nothing of
Trialbus: a trial's host needs hydra-core and cloudpickle (and the user's code), not this package.

The Trialbus launcher (``hydra_plugins/trialbus_launcher``, docs/hydra.md) writes one file per job into the
batch directory, ``job-<num>.pkl``: the task function, the job's composed config, the Hydra context and Hydra's
global state, pickled with cloudpickle as Hydra's submitit launcher does. That directory is also the experiment's
code directory, so its snapshot travels with the trial to any platform.

Here, in the trial's process: the job number comes from the trial's parameters (``nni.get_next_parameter()``),
its file from the code snapshot (the working directory), Hydra's ``run_job`` runs it, and the outcome goes back
two ways:

- the task's return value is the trial's final result (:func:`as_final`), as NNI trials report one, so the
  web UI, the CLI and the launcher on any platform see it;
- the whole ``JobReturn`` (config, output directory, the exception of a failed job) is pickled to
  ``job-<num>.return.pkl`` in the launcher's batch directory when this host sees it (the local platform, a
  shared filesystem), for the launcher to hand Hydra exactly what its other launchers do.

A failed job prints its traceback to stderr (the trial's log) and exits 1: the trial ends FAILED.
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any

#: The key of the trial's parameters that carries Hydra's part: ``{"job": num, "overrides": [...]}``.
PARAMETER = "_hydra"
#: The final result of a job that returned something NNI has no number for: ``{"returned": value}``.
RETURNED = "returned"


def job_file(num: int) -> str:
    return f"job-{num}.pkl"


def return_file(num: int) -> str:
    return f"job-{num}.return.pkl"


def as_final(value: Any) -> Any:
    """A task's return value as the trial's final result; None: nothing to report.

    A number is the default metric; a dict with a numeric ``default`` is reported as it is (NNI's form); any
    other value is ``{"returned": value}``, as JSON where it is (else its ``repr``), with no default metric.
    """
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    if isinstance(value, dict) and _number(value.get("default")):
        return {str(k): plain(v) for k, v in value.items()}
    return {RETURNED: plain(value)}


def from_final(final: Any) -> Any:
    """What :func:`as_final` reported, as the task returned it (as far as JSON kept it)."""
    if isinstance(final, dict) and set(final) == {RETURNED}:
        return final[RETURNED]
    return final


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def plain(value: Any) -> Any:
    """``value`` as JSON data: containers walked, OmegaConf containers converted, anything else its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    try:
        from omegaconf import Container, OmegaConf

        if isinstance(value, Container):
            return plain(OmegaConf.to_container(value, resolve=True))
    except Exception:  # an unresolvable interpolation: its repr, below
        pass
    for method in ("item", "tolist"):  # numpy and torch values
        convert = getattr(value, method, None)
        if callable(convert):
            try:
                return plain(convert())
            except (TypeError, ValueError):
                continue
    return repr(value)


def run(payload: dict[str, Any]) -> Any:
    """Run one job as Hydra's launchers do in their workers; its ``JobReturn``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    setup_globals()
    Singleton.set_state(payload["singleton_state"])
    config = payload["config"]
    HydraConfig.instance().set_config(config)
    for entry in reversed(payload["sys_path"]):  # the user's modules, where the sweep found them
        if entry not in sys.path and os.path.isdir(entry):
            sys.path.insert(0, entry)
    # Where the sweep was started, when this host has it and the trial's user may write there (the local
    # platform): relative paths in the job's config, the sweep's output directory among them, mean the same as
    # under Hydra's basic launcher. Elsewhere the job stays in the trial's code directory.
    start = str(config.hydra.runtime.cwd)
    if os.path.isdir(start) and os.access(start, os.W_OK | os.X_OK):
        os.chdir(start)
    return run_job(
        hydra_context=payload["hydra_context"],
        task_function=payload["task_function"],
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def _save_return(batch: Path, num: int, job_return: Any) -> None:
    """The JobReturn beside the job's file, when this host sees the launcher's batch directory."""
    import cloudpickle
    from hydra.core.utils import JobReturn

    if not os.access(batch, os.W_OK | os.X_OK):  # another host, or a trial user who may not write there
        return
    try:
        data = cloudpickle.dumps(job_return)
    except Exception as exc:  # a return value or exception that does not pickle: its repr
        kept = JobReturn(**{**vars(job_return), "_return_value": None})
        value = job_return._return_value
        kept._return_value = (
            value
            if isinstance(value, BaseException) and _pickles(value)
            else RuntimeError(
                f"the job's {'exception' if isinstance(value, BaseException) else 'return value'} "
                f"{value!r} could not be pickled ({exc})"
            )
        )
        data = cloudpickle.dumps(kept)
    partial = batch / f".{return_file(num)}.partial"
    try:
        partial.write_bytes(data)
        partial.replace(batch / return_file(num))  # whole or absent for the launcher
    except OSError as exc:  # the launcher makes the JobReturn from the final result instead
        print(f"trialbus: the JobReturn could not be written to {batch}: {exc}", file=sys.stderr)


def _pickles(value: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(value)
        return True
    except Exception:
        return False


def main(argv: list[str]) -> int:
    import cloudpickle
    import nni
    from hydra.core.utils import JobStatus

    batch = Path(argv[0])
    params = nni.get_next_parameter() or {}
    num = int(params[PARAMETER]["job"])
    shipped = Path(job_file(num))  # the code snapshot: the working directory of the trial
    payload = cloudpickle.loads((shipped if shipped.exists() else batch / job_file(num)).read_bytes())
    job_return = run(payload)
    _save_return(batch, num, job_return)
    if job_return.status == JobStatus.COMPLETED:
        final = as_final(job_return._return_value)
        if final is not None:
            nni.report_final_result(final)
        return 0
    error = job_return._return_value
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
