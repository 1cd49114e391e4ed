"""NNI's search space, exactly: parsed once, then sampled, suggested through Optuna, or enumerated.

:func:`parse_search_space` turns the JSON form (``{"lr": {"_type": "loguniform", "_value": [1e-5, 0.1]}}``)
into a typed :class:`SearchSpace`, or raises :class:`SearchSpaceError` naming the parameter's path
(``model/conv/kernel`` inside nested choices) and what is wrong. Every function then returns the
parameters in the shape ``nni.get_next_parameter()`` hands to trials: plain values at the top, and
``{"_name": <option>, <its sub-parameters>...}`` for a nested choice.

Semantics are NNI v2's (``nni/common/hpo_utils``: ``validation.py``, ``formatting.py``):

================  ===================================================  =========================================
type              value                                                Optuna (:func:`suggest`)
================  ===================================================  =========================================
choice            one option (any JSON value), or a nested sub-space   ``suggest_categorical`` over option indices
randint [l, u)    an int in l..u-1                                     ``suggest_int(l, u - 1)``
uniform           float in [low, high]                                 ``suggest_float(low, high)``
quniform          clip(round(uniform / q) * q, low, high)              ``suggest_float(low, high)``, then round+clip
loguniform        exp(uniform(log low, log high))                      ``suggest_float(low, high, log=True)``
qloguniform       clip(round(loguniform / q) * q, low, high)           ``suggest_float(.., log=True)``, round+clip
normal            normal(mu, sigma)                                    quantile u, then mu + sigma·Φ⁻¹(u)
qnormal           round(normal / q) * q  (not clipped)                 as normal, then round
lognormal         exp(normal(mu, sigma))                               as normal, then exp
qlognormal        round(exp(normal) / q) * q  (not clipped, may be 0)  as normal, then exp and round
================  ===================================================  =========================================

Why: q-types never use Optuna's ``step``: NNI rounds a continuous draw to multiples of q (not of
``low`` + k·q), so ``low`` and ``high`` get half an inner point's mass; a stepped float does neither.
The normal family is suggested as its quantile ``u`` in ``[Φ(-6), 1 - Φ(-6)]``, mapped back by the
inverse CDF (as NNI's GridSearch does): a sampler exploring ``u`` uniformly (Random, TPE's start-up)
draws exactly NNI's normal truncated at ±6σ, and TPE or CMA-ES search a bounded space whose base
measure is NNI's prior. Optuna then records ``u``; :func:`recall` rebuilds NNI parameters from a
trial's ``params``. A choice suggests option indices, so any JSON value works; a nested choice asks
only for the chosen option's sub-parameters, named by path (``model/conv/kernel``). Floats are clipped
to ``[low, high]`` even without q, against ``exp(log(high)) > high`` by rounding.

:func:`grid` is GridSearch's grid by NNI v1's rule (NNI ≥ 2.5 subdivides continuous ranges instead):
choice options, every randint integer, every quantised q(log)uniform point; other types are refused.
It is a lazy sequence, so a GridSearch tuner's whole state is one index.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.trial import BaseTrial

Parameters = dict[str, Any]
"""A parameter set as trials receive it: JSON values, nested choices as ``{"_name": ..., ...}``."""

_UNIFORM_TYPES = ("uniform", "quniform", "loguniform", "qloguniform")
_NORMAL_TYPES = ("normal", "qnormal", "lognormal", "qlognormal")
TYPES = ("choice", "randint", *_UNIFORM_TYPES, *_NORMAL_TYPES)
"""Every ``_type`` NNI defines (``nni/common/hpo_utils/validation.py::common_search_space_types``)."""

_SIGMAS = 6.0
_TAIL = NormalDist().cdf(-_SIGMAS)  # the normal family's quantiles run over [_TAIL, 1 - _TAIL]


class SearchSpaceError(ValueError):
    """A search space NNI does not accept, or one a tuner cannot use; the message starts with the path."""


@dataclass(frozen=True)
class _Param:
    """A parameter: ``draw`` (NNI's sampling), ``ask`` (of an Optuna trial), ``recall`` (from what ``ask``
    suggested) give its value, or a choice's option index."""

    name: str  # the key trials see, in its (sub-)space
    path: str  # the Optuna parameter name, unique in the space: names from the top and "_name"s, joined by "/"

    def recall(self, raw: Any) -> Any:
        return int(raw)


@dataclass(frozen=True)
class Choice(_Param):
    """``choice`` over plain options (any JSON value)."""

    options: tuple[Any, ...]

    def draw(self, rng: random.Random) -> int:
        return rng.randrange(len(self.options))

    def ask(self, trial: BaseTrial) -> int:
        return trial.suggest_categorical(self.path, tuple(range(len(self.options))))


@dataclass(frozen=True)
class NestedChoice(Choice):
    """``choice`` whose options are all objects with ``_name``: NNI's nested search space."""

    options: tuple[Branch, ...]


@dataclass(frozen=True)
class Branch:
    """One option of a nested choice: its ``_name`` and the sub-space it brings."""

    name: str
    space: SearchSpace


@dataclass(frozen=True)
class RandInt(_Param):
    """``randint [lower, upper)``: an int in ``lower..upper-1``."""

    lower: int
    upper: int

    def draw(self, rng: random.Random) -> int:
        return rng.randrange(self.lower, self.upper)

    def ask(self, trial: BaseTrial) -> int:
        return trial.suggest_int(self.path, self.lower, self.upper - 1)


@dataclass(frozen=True)
class Uniform(_Param):
    """``uniform``, ``quniform``, ``loguniform``, ``qloguniform``: a float in ``[low, high]``."""

    low: float
    high: float
    q: float | None = None
    log: bool = False

    @property
    def nni_type(self) -> str:
        return ("q" if self.q is not None else "") + ("log" if self.log else "") + "uniform"

    def draw(self, rng: random.Random) -> float:
        if self.log:
            return self.finish(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return self.finish(rng.uniform(self.low, self.high))

    def ask(self, trial: BaseTrial) -> float:
        return self.finish(trial.suggest_float(self.path, self.low, self.high, log=self.log))

    def recall(self, raw: Any) -> float:
        return self.finish(float(raw))

    def finish(self, x: float) -> float:
        """NNI's last step on a continuous draw: ``round(x / q) * q``, then clip to ``[low, high]``."""
        if self.q is not None:
            x = round(x / self.q) * self.q
        return min(max(float(x), self.low), self.high)


@dataclass(frozen=True)
class Normal(_Param):
    """``normal``, ``qnormal``, ``lognormal``, ``qlognormal``: ``mu`` and ``sigma`` of the normal (of the log)."""

    mu: float
    sigma: float
    q: float | None = None
    log: bool = False

    @property
    def nni_type(self) -> str:
        return ("q" if self.q is not None else "") + ("log" if self.log else "") + "normal"

    def draw(self, rng: random.Random) -> float:
        return self.finish(rng.gauss(self.mu, self.sigma))

    def ask(self, trial: BaseTrial) -> float:
        return self.recall(trial.suggest_float(self.path, _TAIL, 1 - _TAIL))

    def recall(self, raw: Any) -> float:  # raw is the quantile ask suggested
        return self.finish(NormalDist(self.mu, self.sigma).inv_cdf(float(raw)))

    def finish(self, z: float) -> float:
        """NNI's last step on a normal draw: ``exp`` for the log types, ``round(x / q) * q``, no clipping."""
        x = math.exp(z) if self.log else z
        return x if self.q is None else round(x / self.q) * self.q


Param = Choice | NestedChoice | RandInt | Uniform | Normal


@dataclass(frozen=True)
class SearchSpace:
    """The parameters of one (sub-)space, in the order the user wrote them."""

    params: tuple[Param, ...]


# --- parsing -----------------------------------------------------------------------------------


_show = functools.partial(json.dumps, default=repr)  # a value in an error message, as JSON where it is JSON


def _error(path: str, what: str) -> SearchSpaceError:
    return SearchSpaceError(f"{json.dumps(path)}: {what}")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and abs(x) <= sys.float_info.max  # no nan, inf


def parse_search_space(raw: Any, *, prefix: str = "") -> SearchSpace:
    """Validate an NNI search space (the JSON object) and type it; :class:`SearchSpaceError` names the path.
    ``prefix`` goes before every Optuna parameter name (the paths), never before the names trials see: a space
    changed while a study runs gets names of its own, as Optuna refuses new choices under an old name."""
    if not isinstance(raw, Mapping):
        raise SearchSpaceError(f"a search space is a JSON object of parameters, got {_show(raw)}")
    space = _parse_space(raw, prefix=prefix)
    paths = list(_paths(space))
    if twice := next((path for path in paths if paths.count(path) > 1), None):
        raise _error(twice, "two parameters have this path (the Optuna parameter name); rename one")
    return space


def _paths(space: SearchSpace) -> Iterator[str]:
    for p in space.params:
        yield p.path
        if isinstance(p, NestedChoice):
            for branch in p.options:
                yield from _paths(branch.space)


def _parse_space(raw: Mapping[Any, Any], prefix: str) -> SearchSpace:
    params = []
    for name, spec in raw.items():
        if not isinstance(name, str):
            raise _error(f"{prefix}{name}", f"parameter names are strings, got {_show(name)}")
        params.append(_parse_param(name, prefix + name, spec))
    return SearchSpace(tuple(params))


def _parse_param(name: str, path: str, spec: Any) -> Param:
    if not isinstance(spec, Mapping):
        raise _error(path, f'expected {{"_type": ..., "_value": [...]}}, got {_show(spec)}')
    for key in ("_type", "_value"):
        if key not in spec:
            raise _error(path, f'missing "{key}" in {_show(spec)}')
    type_, args = spec["_type"], spec["_value"]
    if type_ not in TYPES:
        raise _error(path, f"unknown _type {_show(type_)}; NNI's types are {', '.join(TYPES)}")
    if not isinstance(args, list | tuple):
        raise _error(path, f"{type_}'s _value must be a list, got {_show(args)}")
    args = list(args)
    if type_ == "choice":
        return _parse_choice(name, path, args)

    shape = "[lower, upper]" if type_ == "randint" else "[mu, sigma" if "normal" in type_ else "[low, high"
    shape += "" if type_ == "randint" else ", q]" if type_.startswith("q") else "]"
    if len(args) != shape.count(",") + 1:
        raise _error(path, f"{type_} needs _value {shape}, got {_show(args)}")
    if not all(_is_number(a) for a in args):
        raise _error(path, f"{type_} needs finite numbers {shape}, got {_show(args)}")
    if len(args) == 3 and args[2] <= 0:
        raise _error(path, f"{type_} needs q > 0, got {_show(args)}")

    if type_ == "randint":
        if not all(isinstance(a, int) for a in args):
            raise _error(path, f"randint needs integers [lower, upper), got {_show(args)}")
        if args[0] >= args[1]:
            raise _error(path, f"randint needs lower < upper (upper is excluded), got {_show(args)}")
        return RandInt(name, path, args[0], args[1])
    q = float(args[2]) if len(args) == 3 else None
    log = "log" in type_
    if type_ in _NORMAL_TYPES:
        if args[1] <= 0:
            raise _error(path, f"{type_} needs sigma > 0, got {_show(args)}")
        if log and args[0] + _SIGMAS * args[1] > 700:
            raise _error(path, f"{type_} needs mu + 6 sigma <= 700 (exp overflows a float), got {_show(args)}")
        largest = math.exp(args[0] + _SIGMAS * args[1]) if log else abs(args[0]) + _SIGMAS * args[1]
    else:
        if log and not 0 < args[0] < args[1]:
            raise _error(path, f"{type_} needs 0 < low < high, got {_show(args)}")
        if args[0] >= args[1]:
            raise _error(path, f"{type_} needs low < high, got {_show(args)}")
        largest = max(abs(args[0]), abs(args[1]))
    if q is not None and not math.isfinite(largest / q):  # NNI divides values by q (normal family: to 6 sigma)
        raise _error(path, f"{type_} needs a larger q: values / q overflow a float, got {_show(args)}")
    family = Normal if type_ in _NORMAL_TYPES else Uniform
    return family(name, path, float(args[0]), float(args[1]), q, log)


def _parse_choice(name: str, path: str, options: list[Any]) -> Choice | NestedChoice:
    if not options:
        raise _error(path, "choice needs at least one option, got []")
    nested = [isinstance(o, Mapping) and "_name" in o for o in options]
    if not any(nested):
        return Choice(name, path, tuple(options))
    if not all(nested):
        plain = nested.index(False)
        raise _error(
            path,
            f'a nested choice needs every option to be an object with "_name"; '
            f"option {plain} is {_show(options[plain])}",
        )
    branches: list[Branch] = []
    for i, option in enumerate(options):
        label = option["_name"]
        if not isinstance(label, str):
            raise _error(path, f'option {i}\'s "_name" must be a string, got {_show(label)}')
        if any(b.name == label for b in branches):
            raise _error(path, f'two options are named {_show(label)}; "_name" must tell them apart')
        sub = {k: v for k, v in option.items() if k != "_name"}
        branches.append(Branch(label, _parse_space(sub, prefix=f"{path}/{label}/")))
    return NestedChoice(name, path, tuple(branches))


# --- sampling ----------------------------------------------------------------------------------


def _build(space: SearchSpace, pick: Callable[[Param], Any]) -> Parameters:
    """Walk the space in order: ``pick`` gives a choice's index or a leaf's value; unchosen branches are skipped."""
    params: Parameters = {}
    for p in space.params:
        if isinstance(p, NestedChoice):
            branch = p.options[pick(p)]
            params[p.name] = {"_name": branch.name, **_build(branch.space, pick)}
        elif isinstance(p, Choice):
            params[p.name] = copy.deepcopy(p.options[pick(p)])
        else:
            params[p.name] = pick(p)
    return params


def sample(space: SearchSpace, rng: random.Random) -> Parameters:
    """One parameter set drawn with NNI's semantics (NNI's Random tuner), without Optuna."""
    return _build(space, lambda p: p.draw(rng))


def suggest(trial: BaseTrial, space: SearchSpace) -> Parameters:
    """One parameter set asked of an Optuna trial (any sampler), one Optuna parameter per active path."""
    return _build(space, lambda p: p.ask(trial))


def recall(optuna_params: Mapping[str, Any], space: SearchSpace) -> Parameters:
    """The parameter set :func:`suggest` returned, rebuilt from the trial's ``params`` (e.g. ``study.best_params``)."""
    return _build(space, lambda p: p.recall(optuna_params[p.path]))


def locate(params: Mapping[str, Any], space: SearchSpace) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
    """Where a parameter set lies in Optuna's terms: the ``params`` and ``distributions`` of a trial that
    :func:`suggest` answers with it. It lets a tuner learn from trials it did not propose (a restarted tuner's
    predecessor's, a person's). :class:`SearchSpaceError` when the set does not fit the space.

    A q-type's value stands for itself (its draw before rounding is gone); a normal-family value becomes its
    quantile, clamped to the ±6σ the tuner searches.
    """
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    located: dict[str, Any] = {}
    distributions: dict[str, BaseDistribution] = {}

    def walk(values: Mapping[str, Any], sub: SearchSpace) -> None:
        if not isinstance(values, Mapping) or set(values) - {"_name"} != {p.name for p in sub.params}:
            raise SearchSpaceError(
                f"parameters {_show(values)} do not match the search space's names {[p.name for p in sub.params]}"
            )
        for p in sub.params:
            value = values[p.name]
            raw: float  # the value as Optuna holds it: an option's index, an integer, a float or a quantile
            dist: BaseDistribution
            if isinstance(p, NestedChoice):
                names = [b.name for b in p.options]
                if not isinstance(value, Mapping) or value.get("_name") not in names:
                    raise _error(p.path, f"{_show(value)} is none of the options {names}")
                index = names.index(value["_name"])
                walk({k: v for k, v in value.items() if k != "_name"}, p.options[index].space)
                raw, dist = index, CategoricalDistribution(tuple(range(len(names))))
            elif isinstance(p, Choice):
                option = next((i for i, o in enumerate(p.options) if _same(o, value)), None)
                if option is None:
                    raise _error(p.path, f"{_show(value)} is not one of the options")
                raw, dist = option, CategoricalDistribution(tuple(range(len(p.options))))
            elif not _is_number(value):
                raise _error(p.path, f"expected a number, got {_show(value)}")
            elif isinstance(p, RandInt):
                if value != int(value) or not p.lower <= value < p.upper:
                    raise _error(p.path, f"{_show(value)} is not an integer in [{p.lower}, {p.upper})")
                raw, dist = int(value), IntDistribution(p.lower, p.upper - 1)
            elif isinstance(p, Uniform):
                if not p.low <= value <= p.high:
                    raise _error(p.path, f"{_show(value)} is outside [{p.low:g}, {p.high:g}]")
                raw, dist = float(value), FloatDistribution(p.low, p.high, log=p.log)
            else:
                z = (math.log(value) if value > 0 else -math.inf) if p.log else float(value)
                quantile = NormalDist(p.mu, p.sigma).cdf(z) if math.isfinite(z) else 0.0
                raw, dist = min(max(quantile, _TAIL), 1 - _TAIL), FloatDistribution(_TAIL, 1 - _TAIL)
            located[p.path], distributions[p.path] = raw, dist

    walk(params, space)
    return located, distributions


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``1`` and ``True`` differ, as they do to a trial."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


# --- grid --------------------------------------------------------------------------------------


def _axis(p: Param) -> tuple[int, Callable[[int], Any]]:
    """One parameter on the grid: how many points, and point ``i``'s value (built on demand)."""
    if isinstance(p, NestedChoice):
        parts = [(b.name, Grid(b.space)) for b in p.options]

        def branch_point(i: int) -> Parameters:  # option by option, each with every point of its sub-grid
            for label, sub in parts:
                if i < sub.size:
                    return {"_name": label, **sub[i]}
                i -= sub.size
            raise IndexError(i)

        return sum(sub.size for _, sub in parts), branch_point
    if isinstance(p, Choice):
        return len(p.options), lambda i: copy.deepcopy(p.options[i])
    if isinstance(p, RandInt):
        return p.upper - p.lower, lambda i: p.lower + i
    if isinstance(p, Uniform) and p.q is not None:
        q, first = p.q, round(p.low / p.q)  # every k = round(x / q) for x in [low, high], as clip(k * q, low, high)
        return round(p.high / q) - first + 1, lambda i: min(max((first + i) * q, p.low), p.high)
    why = "it is continuous" if isinstance(p, Uniform) else "it is unbounded"
    raise _error(
        p.path, f"GridSearch cannot enumerate {p.nni_type}: {why}; use choice, randint, quniform or qloguniform"
    )


class Grid(Sequence[Parameters]):
    """Every parameter set of a space in NNI GridSearch's order (the last parameter varies fastest).

    Lazy: ``size`` is computed, ``grid[i]`` built on demand, so a GridSearch tuner's state is one index.
    """

    def __init__(self, space: SearchSpace) -> None:
        self._names = [p.name for p in space.params]
        self._axes = [_axis(p) for p in space.params]
        self.size = math.prod(size for size, _ in self._axes)  # may pass sys.maxsize, where len() cannot

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        if not -self.size <= index < self.size:
            raise IndexError(index)
        index %= self.size
        values = []
        for size, point in reversed(self._axes):
            index, at = divmod(index, size)
            values.append(point(at))
        return dict(zip(self._names, reversed(values), strict=True))


def grid(space: SearchSpace) -> Grid:
    """NNI GridSearch's grid; :class:`SearchSpaceError` for an empty space or a type that cannot be enumerated."""
    if not space.params:
        raise SearchSpaceError("GridSearch needs at least one parameter; the search space is empty")
    points = Grid(space)
    if points.size > sys.maxsize:
        raise SearchSpaceError(f"GridSearch cannot walk {points.size} points; quantise more coarsely")
    return points
