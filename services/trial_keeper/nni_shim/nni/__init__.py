"""A stdlib-only stand-in for NNI's trial API, for hosts without the ``nni`` package.

Adapters put this package's parent directory on the trial's ``PYTHONPATH`` when ``nni``
is not installed, so trial code written for NNI runs unchanged:

    params = nni.get_next_parameter()
    nni.report_intermediate_result(0.5)
    nni.report_final_result({"default": 0.9, "loss": 0.1})

It behaves like NNI 2.x's legacy channel (docs/reference: nni-protocols.md §1.2–1.5):

* ``get_next_parameter`` reads ``$NNI_SYS_DIR/parameter.cfg`` once (a second call returns
  None, ``MULTI_PHASE`` is not supported); when the file is missing it sends a
  ``REQUEST_PARAMETER`` record and polls every 3 s, as NNI does.
* Records are NNI's exactly: ``{"parameter_id", "trial_job_id", "type", "sequence",
  "value"}`` with ``value`` the JSON text of the metric. ``PERIODICAL`` sequences count
  0, 1, 2… per process; ``FINAL`` is always 0.
* The channel: ``ME%06d<json>\\n`` frames appended to ``$NNI_SYS_DIR/.nni/metrics`` when
  ``NNI_PLATFORM`` is ``local`` and ``REUSE_MODE`` is not true; otherwise a
  ``NNISDK_MEb'<json>'`` line on stdout, flushed.
* Without ``NNI_PLATFORM`` (standalone, no experiment) it does what NNI does: parameters
  are ``{}``, ids are ``STANDALONE``, results are printed instead of sent.

Numpy and torch scalars (anything with ``.item()``) are reported as plain numbers.

A real NNI wins: when an ``nni`` package is importable from the rest of ``sys.path`` (the
trial's interpreter has NNI installed), importing this stand-in loads that one instead, so
the shim on ``PYTHONPATH`` never shadows the real SDK.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _real_nni() -> bool:
    """Load an installed NNI in place of this module; True when there was one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec(__name__, rest)
    if spec is None or spec.origin == os.path.abspath(__file__):
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module  # what `import nni` returns once this file has run
    spec.loader.exec_module(module)
    return True


if _real_nni():
    pass  # the real NNI is in sys.modules; the definitions below are not used

__all__ = [
    "get_current_parameter",
    "get_experiment_id",
    "get_next_parameter",
    "get_next_parameters",
    "get_sequence_id",
    "get_trial_id",
    "report_final_result",
    "report_intermediate_result",
]

__version__ = "0.1.0"

# Read once at import, as NNI's ``trial_env_vars`` are.
_platform = os.environ.get("NNI_PLATFORM")
_standalone = _platform in (None, "", "unittest")
_sys_dir = os.environ.get("NNI_SYS_DIR", ".")
_trial_id = os.environ.get("NNI_TRIAL_JOB_ID", "STANDALONE" if _standalone else "")
_file_channel = _platform == "local" and os.environ.get("REUSE_MODE") not in ("true", "True")

_params: dict | None = None
_param_index = 0
_intermediate_seq = 0
_metric_file = None


def get_next_parameter() -> Any:
    """The trial's hyper-parameters (``record["parameters"]``); None on a second call."""
    global _params, _param_index
    if _standalone:
        _log("WARNING", "Running NNI code without runtime: no parameters from a tuner")
        _params = {"parameter_id": None, "parameters": {}}
        return _params["parameters"]
    if _param_index > 0:
        return None
    path = os.path.join(_sys_dir, "parameter.cfg")
    if not os.path.isfile(path):
        _send(_dump({"trial_job_id": _trial_id, "type": "REQUEST_PARAMETER", "sequence": 0, "parameter_index": 0}))
    while not (os.path.isfile(path) and os.path.getsize(path) > 0):
        time.sleep(3)
    with open(path, encoding="utf-8") as file:
        _params = json.load(file)
    _param_index += 1
    return _params["parameters"]


def get_next_parameters() -> Any:
    """Alias of :func:`get_next_parameter` (as in NNI)."""
    return get_next_parameter()


def get_current_parameter(tag: str | None = None) -> Any:
    """The parameters last returned by :func:`get_next_parameter`, or one of them by name."""
    if _params is None:
        return None
    return _params["parameters"] if tag is None else _params["parameters"][tag]


def get_experiment_id() -> str:
    return "STANDALONE" if _standalone else os.environ.get("NNI_EXP_ID", "")


def get_trial_id() -> str:
    return _trial_id


def get_sequence_id() -> int:
    return 0 if _standalone else int(os.environ.get("NNI_TRIAL_SEQ_ID", "-1"))


def report_intermediate_result(metric: Any) -> None:
    """Report a per-epoch metric: a number, or a dict whose ``default`` is a number."""
    global _intermediate_seq
    assert _params or _standalone, "nni.get_next_parameter() needs to be called before report_intermediate_result"
    _report("PERIODICAL", _intermediate_seq, metric)
    _intermediate_seq += 1


def report_final_result(metric: Any) -> None:
    """Report the trial's final metric: a number, or a dict whose ``default`` is a number."""
    assert _params or _standalone, "nni.get_next_parameter() needs to be called before report_final_result"
    _report("FINAL", 0, metric)


def _report(kind: str, sequence: int, metric: Any) -> None:
    value = _dump(metric)
    if _standalone:
        if kind == "FINAL":
            _log("INFO", f"Final result: {value}")
        else:
            _log("INFO", f"Intermediate result: {value}  (Index {sequence})")
        return
    record = {
        "parameter_id": _params["parameter_id"] if _params else None,
        "trial_job_id": _trial_id,
        "type": kind,
        "sequence": sequence,
        "value": value,
    }
    _send(_dump(record))


def _plain(obj: Any) -> Any:
    """JSON fallback for numpy / torch values: scalars via ``item()``, arrays via ``tolist()``."""
    for method in ("item", "tolist"):
        convert = getattr(obj, method, None)
        if callable(convert):
            try:
                return convert()
            except (TypeError, ValueError):
                continue
    raise TypeError(f"cannot report a {type(obj).__name__} as a metric")


def _dump(obj: Any) -> str:
    # NNI's separators (", " and ": "); NaN and Infinity allowed, as json_tricks allows them.
    return json.dumps(obj, default=_plain)


def _send(record: str) -> None:
    global _metric_file
    if not _file_channel:
        assert len(record) < 1000000, "Metric too long"
        print(f"NNISDK_MEb'{record}'", flush=True)
        return
    data = (record + "\n").encode("utf8")
    assert len(data) < 1000000, "Metric too long"
    if _metric_file is None:
        os.makedirs(os.path.join(_sys_dir, ".nni"), exist_ok=True)
        _metric_file = open(os.path.join(_sys_dir, ".nni", "metrics"), "ab")  # noqa: SIM115 - kept open
    # One write per frame: the keeper sees a frame whole or not yet. (NNI then runs
    # ``touch`` to wake file watchers; the keeper polls, so we skip that process.)
    _metric_file.write(b"ME%06d%b" % (len(data), data))
    _metric_file.flush()


def _log(level: str, message: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {level} (nni) {message}", file=sys.stdout, flush=True)
