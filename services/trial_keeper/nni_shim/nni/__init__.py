"""NNI's trial API in the standard library: the ``nni`` that trials run by Trialbus import.

Adapters put this package's parent directory first on the trial's ``PYTHONPATH``, so trial code
written for NNI runs unchanged:

    params = nni.get_next_parameter()
    nni.report_intermediate_result(0.5)
    nni.report_final_result({"default": 0.9, "loss": 0.1})

and cheaply: importing this takes about a millisecond (stdlib only, nothing beyond what Python
starts with but ``importlib.machinery``), where the real ``nni`` package imports scipy, pandas,
json_tricks… for a second or more of CPU.

**The trial API is served here, always** — NNI 3.0's ``nni.trial.__all__``, which is the whole
of it (NNI 3.0 has no checkpoint helpers) — whether or not the real package is installed:

* ``get_next_parameter()`` (and its alias ``get_next_parameters()``): the record's
  ``parameters``, read from ``$NNI_SYS_DIR/parameter.cfg`` once; a second call returns None (the
  parameters stay current; NNI itself forgets them there). When the file is missing it sends a
  ``REQUEST_PARAMETER`` record and polls every 3 s. With ``MULTI_PHASE=true`` each call reads the
  next file (``parameter.cfg``, ``parameter_1.cfg``…), as NNI does.
* ``get_current_parameter(tag=None)``: those parameters, or one of them; None before the first.
* ``report_intermediate_result(metric)`` / ``report_final_result(metric)``: a number, or a dict
  whose ``default`` is one, after ``get_next_parameter`` (an AssertionError otherwise, as NNI).
  Records are NNI's exactly: ``{"parameter_id", "trial_job_id", "type", "sequence", "value"}``,
  ``value`` the JSON text of the metric; ``PERIODICAL`` sequences count 0, 1, 2… per process,
  ``FINAL`` is always 0. Numpy and torch values are reported through ``.item()`` / ``.tolist()``.
* ``get_experiment_id()``, ``get_trial_id()``: ``NNI_EXP_ID``, ``NNI_TRIAL_JOB_ID``, or
  ``"STANDALONE"``; ``get_sequence_id()``: ``NNI_TRIAL_SEQ_ID`` as an int, or 0.

The channel is NNI's legacy one (docs/reference: nni-protocols.md §1.2–1.5): ``ME%06d<json>\\n``
frames appended to ``$NNI_SYS_DIR/.nni/metrics`` when ``NNI_PLATFORM`` is ``local`` and
``REUSE_MODE`` is not true, otherwise an ``NNISDK_MEb'<json>'`` line on stdout, flushed. Without
``NNI_PLATFORM`` (or with ``unittest``) the trial is standalone, as in NNI: parameters are ``{}``
and results are printed instead of sent. (``NNI_TRIAL_COMMAND_CHANNEL``, NNI 3.0's HTTP channel
for its own training services, is not supported.)

The environment is read on the first call of the trial API, not at import, then kept for the
process: a warm-start template may import this module long before the trial's environment
exists, and fork the trial from it.

**Everything else is the real package's**, when one is installed further down ``sys.path``:

* ``nni.<submodule>`` (``nni.experiment``, ``nni.nas``, ``nni.runtime.env_vars``…): this
  package's ``__path__`` is the real package's directory, then this one's (whose only modules are
  ``_trialbus_*``).
* ``nni.<name>`` that the trial API lacks (``nni.trace``, ``nni.choice``, ``nni.Experiment``,
  ``nni.NoMoreTrialError``…), through this module's ``__getattr__``. ``nni.__version__`` is the
  real package's (read from its ``version.py``, without importing it); this one's otherwise.

The real package's ``__init__`` runs once, on the first of these (never for the trial API), into a
module of its own whose relative imports resolve to the same ``nni.*`` modules; it runs before
the first real submodule loads, as when NNI is imported on its own, so NNI's modules that do
``from nni import trace`` at import find it. From then on, the trial API keeps its state in the
real ``nni.trial`` (parameters, intermediate sequence, ids: copied there at that moment) and goes
through NNI's default trial command channel, which is this module's own; so NNI code that calls
``nni.trial`` or swaps the channel (NAS's sequential engine, ``Evaluator.mock_runtime``) shares
one state with the trial, and the bytes sent stay the same. Loading has NNI's import-time effects
at that moment: NNI reads its environment (so a template that forks trials must not load it) and
sets up its logging (in a ``local`` trial, stdout goes to ``$NNI_OUTPUT_DIR/trial.log`` from then
on). ``from nni import *`` gives the trial API only (``__all__``). Without a real package, those
names raise AttributeError ("… needs the nni package: pip install nni") and the submodules
ModuleNotFoundError.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing's, without importing typing into every trial (mypy reads it as True)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import BinaryIO

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

_SHIM_VERSION = "0.1.0"


class _TrialEnv:
    """The trial's NNI variables, as NNI 3.0's ``trial_env_vars`` and ``nni.trial`` read them."""

    def __init__(self) -> None:
        environ = os.environ
        self.platform = environ.get("NNI_PLATFORM") or None  # empty is unset
        self.standalone = self.platform in (None, "unittest")  # NNI's StandaloneTrialCommandChannel
        self.sys_dir = environ.get("NNI_SYS_DIR") or "."
        self.trial_job_id = environ.get("NNI_TRIAL_JOB_ID")  # as records carry it (None standalone)
        self.experiment_id = environ.get("NNI_EXP_ID") or "STANDALONE"
        self.trial_id = self.trial_job_id or "STANDALONE"
        sequence = environ.get("NNI_TRIAL_SEQ_ID")
        self.sequence_id = int(sequence) if sequence else 0
        self.multi_phase = environ.get("MULTI_PHASE") in ("true", "True")
        self.file_channel = self.platform == "local" and environ.get("REUSE_MODE") not in ("true", "True")


class _TrialState:
    """The trial API's state until the real package loads; then ``nni.trial`` holds it, under the same names."""

    def __init__(self) -> None:
        self._params: dict | None = None  # the current parameter record: {"parameter_id", "parameters", …}
        self._intermediate_seq = 0  # the next PERIODICAL sequence


class _Channel:
    """The trial's end of NNI's legacy channel: NNI 3.0's ``LocalLegacyTrialCommandChannel``, and its
    ``StandaloneTrialCommandChannel`` for a standalone trial (same methods, so NNI can use it as its own)."""

    def __init__(self) -> None:
        self._param_index = 0
        self._metric_file: BinaryIO | None = None

    def receive_parameter(self) -> dict | None:
        env = _env()
        if env.standalone:
            _log("WARNING", "Running NNI code without runtime: no parameters from a tuner")
            return {"parameter_id": None, "parameters": {}}
        if env.multi_phase:
            name = f"parameter_{self._param_index}.cfg" if self._param_index else "parameter.cfg"
        elif self._param_index > 0:
            return None
        else:
            name = "parameter.cfg"
        path = os.path.join(env.sys_dir, name)
        if not os.path.isfile(path):
            request = {"trial_job_id": env.trial_job_id, "type": "REQUEST_PARAMETER", "sequence": 0}
            self._send(_dump({**request, "parameter_index": self._param_index}))
        while not (os.path.isfile(path) and os.path.getsize(path) > 0):
            time.sleep(3)
        import json

        with open(path, encoding="utf-8") as file:
            record = json.load(file)
        self._param_index += 1
        assert isinstance(record, dict) and "parameters" in record
        return record

    def send_metric(
        self, type: str, parameter_id: object, trial_job_id: str | None, sequence: int, value: object
    ) -> None:
        if not _env().standalone:
            record = {"parameter_id": parameter_id, "trial_job_id": trial_job_id, "type": type, "sequence": sequence}
            self._send(_dump({**record, "value": _dump(value)}))
        elif type == "FINAL":
            _log("INFO", f"Final result: {_dump(value)}")
        else:
            _log("INFO", f"Intermediate result: {_dump(value)}  (Index {sequence})")

    def _send(self, record: str) -> None:
        env = _env()
        if not env.file_channel:
            assert len(record) < 1000000, "Metric too long"
            print(f"NNISDK_MEb'{record}'", flush=True)
            return
        data = (record + "\n").encode("utf8")
        assert len(data) < 1000000, "Metric too long"
        if self._metric_file is None:
            os.makedirs(os.path.join(env.sys_dir, ".nni"), exist_ok=True)
            self._metric_file = open(os.path.join(env.sys_dir, ".nni", "metrics"), "ab")  # noqa: SIM115 - kept open
        # One write per frame: the keeper sees a frame whole or not yet. (NNI then runs
        # ``touch`` to wake file watchers; the keeper polls, so we skip that process.)
        self._metric_file.write(b"ME%06d%b" % (len(data), data))
        self._metric_file.flush()


_trial_env: _TrialEnv | None = None  # read on the first call of the trial API
_state = _TrialState()  # the real ``nni.trial`` module once the real package has loaded
_own_channel: _Channel | None = None


def _env() -> _TrialEnv:
    global _trial_env
    if _trial_env is None:
        _trial_env = _TrialEnv()
    return _trial_env


def _default_channel() -> _Channel:
    global _own_channel
    if _own_channel is None:
        _own_channel = _Channel()
    return _own_channel


_get_channel = _default_channel  # NNI's ``get_default_trial_command_channel`` once the real package has loaded


# -- the trial API: NNI 3.0's nni.trial.__all__ ---------------------------------------------------


def get_next_parameter() -> dict | None:
    """The trial's hyper-parameters, sampled by the tuner (``{}`` standalone); None on a second call."""
    record = _get_channel().receive_parameter()
    if record is None:
        return None
    _state._params = record
    return record["parameters"]


def get_next_parameters() -> dict | None:
    """Alias of :func:`get_next_parameter` (as in NNI)."""
    return get_next_parameter()


def get_current_parameter(tag: str | None = None) -> object:
    """The parameters last returned by :func:`get_next_parameter` (None before), or one of them by name."""
    params = _state._params
    if params is None:
        return None
    return params["parameters"] if tag is None else params["parameters"][tag]


def get_experiment_id() -> str:
    """``NNI_EXP_ID``, or ``"STANDALONE"``."""
    return _env().experiment_id


def get_trial_id() -> str:
    """``NNI_TRIAL_JOB_ID`` (the trial's id in the web UI), or ``"STANDALONE"``."""
    return _env().trial_id


def get_sequence_id() -> int:
    """``NNI_TRIAL_SEQ_ID`` (the trial's number in the web UI), or 0."""
    return _env().sequence_id


def report_intermediate_result(metric: object) -> None:
    """Report a per-epoch metric: a number, or a dict whose ``default`` is a number."""
    state = _state
    assert state._params or _env().platform is None, (
        "nni.get_next_parameter() needs to be called before report_intermediate_result"
    )
    _send_metric("PERIODICAL", state._intermediate_seq, metric)
    state._intermediate_seq += 1


def report_final_result(metric: object) -> None:
    """Report the trial's final metric: a number, or a dict whose ``default`` is a number."""
    assert _state._params or _env().platform is None, (
        "nni.get_next_parameter() needs to be called before report_final_result"
    )
    _send_metric("FINAL", 0, metric)


def _send_metric(kind: str, sequence: int, metric: object) -> None:
    params = _state._params
    _get_channel().send_metric(
        type=kind,
        parameter_id=params["parameter_id"] if params else None,
        trial_job_id=_env().trial_job_id,
        sequence=sequence,
        value=metric,
    )


def _plain(obj: object) -> object:
    """JSON fallback for numpy / torch values: scalars via ``item()``, arrays via ``tolist()``."""
    for method in ("item", "tolist"):
        convert = getattr(obj, method, None)
        if callable(convert):
            try:
                return convert()
            except (TypeError, ValueError):
                continue
    raise TypeError(f"cannot report a {type(obj).__name__} as a metric")


def _dump(obj: object) -> str:
    import json  # here, not at import: json brings re (~5 ms)

    # NNI's separators (", " and ": "); NaN and Infinity allowed, as json_tricks allows them.
    return json.dumps(obj, default=_plain)


def _log(level: str, message: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {level} (nni) {message}", file=sys.stdout, flush=True)


# -- the rest of NNI: the real package, loaded on first need ---------------------------------------


class _PackageFirst:
    """On ``sys.meta_path`` until the real package has loaded: its ``__init__`` runs before any real
    submodule (``_trialbus_handover.find_submodule``)."""

    trialbus_nni = True

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not name.startswith("nni.") or name.startswith("nni._trialbus"):
            return None
        from ._trialbus_handover import find_submodule

        return find_submodule(self, name, path, target)


def _find_real() -> ModuleSpec | None:
    """The spec of a real ``nni`` package further down ``sys.path``, or None."""
    from importlib.machinery import PathFinder

    here = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = PathFinder.find_spec(__name__, rest)
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None  # none, or a namespace portion only
    return spec


_real_spec = _find_real() if __name__ == "nni" and "__path__" in globals() else None
_real = None  # the real package's module, from when its __init__ starts
_real_ready = False  # … and once it has run

if _real_spec is None:
    __version__ = _SHIM_VERSION
else:
    # NNI's directory first: NNI's code finds its data through ``nni.__path__[0]`` (runtime/config.py).
    __path__[:0] = _real_spec.submodule_search_locations or []  # (a package's: _find_real checked)
    if not any(getattr(finder, "trialbus_nni", False) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PackageFirst())


def __getattr__(name: str) -> object:
    """``nni.<name>`` beyond the trial API: the real package's (its ``__init__`` runs on the first)."""
    if name.startswith("__") and name.endswith("__") and name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _real_spec is None:
        raise AttributeError(
            f"nni.{name} needs the nni package: pip install nni (Trialbus's stand-in serves NNI's trial API only)"
        )
    from ._trialbus_handover import load_package, real_version

    if name == "__version__":
        globals()["__version__"] = version = real_version(sys.modules[__name__])
        return version
    real = load_package(sys.modules[__name__])
    here = globals()
    if name in here:  # a real submodule that NNI's __init__ imported: the import system set it here
        return here[name]
    try:
        return real.__dict__[name]
    except KeyError:
        loading = "" if _real_ready else "partially initialized "
        raise AttributeError(f"{loading}module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    names = set(globals())
    if _real is not None:
        names.update(vars(_real))
    return sorted(names)
