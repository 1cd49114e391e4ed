"""NNI's own tuner and assessor classes, unchanged, behind the tuner service's interface.

With the ``nni`` package installed (``pip install 'trialbus[nni]'``), a config naming a class runs it
as NNI's manager would::

    tuner:
      className: my_tuner.MyTuner        # module.Class, imported from codeDirectory
      codeDirectory: ./tuners            # must be readable where the tuner service runs
      classArgs: {optimize_mode: maximize}

NNI's built-in classes work the same way (``className: nni.algorithms.hpo.tpe_tuner.TpeTuner``). The
calls are NNI's ``msg_dispatcher``'s: ``update_search_space`` once, ``generate_parameters(id)`` per
trial (``nni.NoMoreTrialError`` ends the experiment), ``receive_trial_result(id, parameters, value,
customized=False, trial_job_id=…)`` with the final result as the trial reported it, then
``trial_end(id, success)``; an assessor gets ``assess_trial(trial_job_id, history)`` after every
intermediate result and ``trial_end``. Trials adopted after a restart reach the tuner through
``import_data`` once they end, as NNI's experiment resume does.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from services.tuner.algorithms import Metric, NoMoreTrials, Parameters, TunerLike

#: NNI's built-in assessors by name, for an NNI tuner class that names one.
BUILTIN_ASSESSORS = {
    "medianstop": "nni.algorithms.hpo.medianstop_assessor.MedianstopAssessor",
    "curvefitting": "nni.algorithms.hpo.curvefitting_assessor.CurvefittingAssessor",
}


def names_class(config: Mapping[str, Any] | None) -> bool:
    """Whether a tuner or assessor config names a class (``className``) rather than a built-in name."""
    return bool(config) and any(str(k).lower() == "classname" for k in config)


def instantiate(config: Mapping[str, Any], kind: str) -> Any:
    """``className(**classArgs)``, the module imported from ``codeDirectory`` when given."""
    keys = {str(k).lower(): v for k, v in config.items()}
    class_name, code_dir = keys.get("classname"), keys.get("codedirectory")
    args = keys.get("classargs") or {}
    if not isinstance(class_name, str) or "." not in class_name:
        raise ValueError(f"{kind} className must be 'module.ClassName', got {class_name!r}")
    try:
        import nni  # noqa: F401 - NNI's classes import it; say so plainly when it is missing
    except ImportError:
        raise ValueError(f"{kind} className {class_name} needs the nni package where the tuner service runs: "
                         "pip install 'trialbus[nni]'") from None
    if code_dir is not None:
        folder = Path(str(code_dir)).expanduser()
        if not folder.is_dir():
            raise ValueError(f"{kind} codeDirectory {folder} is not a folder the tuner service can read")
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    module_name, _, attribute = class_name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {kind} class {class_name}: {exc}") from None
    try:
        return cls(**dict(args))
    except Exception as exc:
        raise ValueError(f"{kind} class {class_name}({args}) failed: {exc}") from None


class NniTuner:
    """An NNI ``Tuner`` instance as a :class:`~services.tuner.algorithms.TunerLike`."""

    def __init__(self, instance: Any, search_space: Mapping[str, Any]) -> None:
        self.instance = instance
        instance.update_search_space(dict(search_space))
        self._next = 0
        self._params: dict[int, Parameters] = {}
        self._adopted: set[int] = set()

    def ask(self) -> tuple[int, Parameters]:
        from nni import NoMoreTrialError

        number = self._next
        try:
            params = self.instance.generate_parameters(number)
        except NoMoreTrialError as exc:
            raise NoMoreTrials(str(exc) or "the NNI tuner has no more trials") from None
        self._next += 1
        self._params[number] = params
        return number, params

    def adopt(self, params: Parameters) -> int:
        number = self._next
        self._next += 1
        self._params[number] = params
        self._adopted.add(number)
        return number

    def report(self, number: int, step: int, value: Metric) -> None:
        """NNI's tuners see final results only."""

    def should_prune(self, number: int) -> bool:
        return False

    def tell(self, number: int, value: Metric | None) -> None:
        params = self._params.pop(number)
        if number in self._adopted:
            self._adopted.discard(number)
            if value is not None:
                self.instance.import_data([{"parameter": params, "value": value}])
            return
        if value is not None:
            self.instance.receive_trial_result(number, params, value, customized=False, trial_job_id=str(number))
        self.instance.trial_end(number, value is not None)


class NniAssessor:
    """An NNI ``Assessor`` instance judging a tuner's trials: it wraps the tuner and answers ``should_prune``."""

    def __init__(self, tuner: TunerLike, instance: Any) -> None:
        self.tuner = tuner
        self.instance = instance
        self._history: dict[int, dict[int, Metric]] = {}

    def ask(self) -> tuple[int, Parameters]:
        return self.tuner.ask()

    def adopt(self, params: Parameters) -> int:
        return self.tuner.adopt(params)

    def report(self, number: int, step: int, value: Metric) -> None:
        self._history.setdefault(number, {})[step] = value
        self.tuner.report(number, step, value)

    def should_prune(self, number: int) -> bool:
        history = self._history.get(number, {})
        result = self.instance.assess_trial(str(number), [history[step] for step in sorted(history)])
        return getattr(result, "name", None) == "Bad" or result is False

    def tell(self, number: int, value: Metric | None) -> None:
        self._history.pop(number, None)
        self.instance.trial_end(str(number), value is not None)
        self.tuner.tell(number, value)
