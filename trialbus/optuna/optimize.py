"""``trialbus.optuna.optimize``: ``study.optimize`` with each trial a Trialbus trial.

The user's process keeps the study (its storage, sampler and pruner). It creates an experiment
whose trial command is ``python -m trialbus.optuna.runner <module>:<objective>``, and keeps up to
``concurrency`` trials in it: ``study.ask()``, then a Trialbus trial whose parameters name the study
trial (``{"optuna_trial": <number>}``). While a trial runs, its objective's questions
(``suggest_*``, ``report``, ``should_prune``, ``set_user_attr``) come here over the bus
(:mod:`contracts.asks`, through the metrics gateway) and the study's own ``optuna.trial.Trial``
answers them, so the sampler and pruner run here as under ``study.optimize``. When a trial ends,
the study is told: its FINAL result (COMPLETE), PRUNED (EARLY_STOPPED here), or FAIL.

All study calls happen on one event loop thread, one at a time (asks are answered in order);
each trial end costs O(1) (one watcher future per trial, :meth:`AsyncClient.wait_trial`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
    json_to_distribution,
)
from optuna.trial import FrozenTrial, TrialState

from contracts import TrialStatus
from contracts.asks import Answer, Ask
from trialbus.api import TrialbusError
from trialbus.async_client import AsyncClient
from trialbus.watcher import TrialOutcome

log = logging.getLogger(__name__)

Callback = Callable[[optuna.Study, FrozenTrial], None]


class TrialFailed(RuntimeError):
    """A trial's objective raised what ``catch=`` does not name (``study.optimize`` re-raises it)."""


def objective_spec(objective: Callable[..., Any], code_dir: str | Path | None) -> tuple[str, Path]:
    """``(module:qualname, code directory)`` of a module-level function; ValueError otherwise."""
    qualname = getattr(objective, "__qualname__", "")
    module_name = getattr(objective, "__module__", None)
    if not module_name or not qualname or "<" in qualname:
        raise ValueError(
            f"{objective!r}: the objective must be a function defined at the top level of a module "
            "(not a lambda, a closure or a method), so that each trial's process can import it"
        )
    module = sys.modules[module_name]
    file = getattr(module, "__file__", None)
    if file is None:
        raise ValueError(f"{objective!r}: its module {module_name} has no file to ship with the trials")
    path = Path(file).resolve()
    if module_name == "__main__":  # run as a script: trials import it by its file's name
        module_name = path.stem
    depth = module_name.count(".") + (path.name == "__init__.py")
    root = path.parent
    for _ in range(depth):
        root = root.parent
    return f"{module_name}:{qualname}", Path(code_dir).resolve() if code_dir else root


def optimize(
    study: optuna.Study,
    objective: Callable[..., Any],
    n_trials: int | None = None,
    timeout: float | None = None,
    *,
    concurrency: int = 1,
    training_service: Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
    catch: Iterable[type[Exception]] | type[Exception] = (),
    callbacks: list[Callback] | None = None,
    code_dir: str | Path | None = None,
    python: str | None = None,
    client: AsyncClient | None = None,
    experiment_name: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> str:
    """Run ``n_trials`` trials of ``objective`` (or until ``timeout`` seconds) on Trialbus, at most
    ``concurrency`` at once, telling ``study`` each one's end; the experiment's id.

    ``training_service``: a ``trainingService`` section of an NNI config (default
    ``{"platform": "local"}``). ``python``: the trials' interpreter (default: this one on the local
    platform, ``python3`` elsewhere). ``client``: an unconnected or connected :class:`AsyncClient`
    (default: the stack ``trialbus up`` runs for this user). ``catch``, ``callbacks``, ``timeout``
    and ``n_trials`` as ``study.optimize`` documents them. ``config``: more keys of the experiment's
    NNI config (``retry``, ``maxTrialDuration``, ``warmStart``…). Not in a running event loop.
    """
    spec, directory = objective_spec(objective, code_dir)
    service = training_service or {"platform": "local"}
    local = isinstance(service, Mapping) and service.get("platform") == "local"
    command = f"{python or (sys.executable if local else 'python3')} -m trialbus.optuna.runner {spec}"
    config = {
        **(config or {}),
        "experimentName": experiment_name or study.study_name,
        "trialCommand": command,
        "trialCodeDirectory": str(directory),
        "trialConcurrency": concurrency,
        "trainingService": service,
    }
    catches = (catch,) if isinstance(catch, type) else tuple(catch)
    run = _Optimization(study, config, n_trials, timeout, concurrency, catches, callbacks or [], client)
    return asyncio.run(run.run())


class _Optimization:
    """One ``optimize`` call: the experiment, its trials' slots, the answers to their asks."""

    def __init__(
        self,
        study: optuna.Study,
        config: dict[str, Any],
        n_trials: int | None,
        timeout: float | None,
        concurrency: int,
        catch: tuple[type[Exception], ...],
        callbacks: list[Callback],
        client: AsyncClient | None,
    ) -> None:
        self.study, self.config = study, config
        self.n_trials, self.timeout, self.concurrency = n_trials, timeout, concurrency
        self.catch = {f"{c.__module__}.{c.__qualname__}" for c in catch}
        self.callbacks = callbacks
        self.client = client or AsyncClient()
        self.experiment_id = ""
        #: Trialbus trial id → the study's trial, for each trial submitted and not yet told.
        self.trials: dict[str, optuna.Trial] = {}
        #: Study trial numbers whose objective said it was pruned.
        self.pruned: set[int] = set()
        #: Study trial number → the classes of the exception its objective raised.
        self.raised: dict[int, list[str]] = {}

    async def run(self) -> str:
        await self.client.connect()
        self.experiment_id = await self.client.create_experiment(self.config)
        subscription = await self.client.serve_asks(self.experiment_id, self.answer)
        waits: dict[asyncio.Task[TrialOutcome], str] = {}
        try:
            await self._loop(waits)
        except BaseException:  # Ctrl-C (asyncio cancels us), a refusal, an uncaught failure
            await self._abandon(waits)
            raise
        finally:
            await subscription.unsubscribe()
            await self.client.close()
        return self.experiment_id

    async def _loop(self, waits: dict[asyncio.Task[TrialOutcome], str]) -> None:
        started, deadline = 0, None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            expired = deadline is not None and time.monotonic() >= deadline
            while len(waits) < self.concurrency and not expired and (self.n_trials is None or started < self.n_trials):
                trial = self.study.ask()
                submitted = await self.client.submit_trial(self.experiment_id, {"optuna_trial": trial.number})
                self.trials[submitted.id] = trial
                wait = self.client.wait_trial(submitted.id, experiment_id=self.experiment_id)
                waits[asyncio.create_task(wait)] = submitted.id
                started += 1
            if not waits:
                break
            # until the deadline, to stop submitting then; past it, until the running trials end
            left = None if deadline is None or expired else max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                self._ended(waits.pop(task), task.result())
        await self.client.close_experiment(self.experiment_id)

    def _ended(self, trial_id: str, outcome: TrialOutcome) -> None:
        trial = self.trials.pop(trial_id)
        number, value = trial.number, _value(outcome.final)
        if outcome.status == TrialStatus.SUCCEEDED and value is not None:
            frozen = self.study.tell(number, value)
        elif number in self.pruned or outcome.status == TrialStatus.EARLY_STOPPED:
            frozen = self.study.tell(number, state=TrialState.PRUNED)
        else:
            frozen = self.study.tell(number, state=TrialState.FAIL)
            raised = self.raised.get(number)
            log.warning("trial %d (%s) failed: %s", number, trial_id, outcome.message or outcome.status.value)
            if raised is not None and self.catch.isdisjoint(raised):
                raise TrialFailed(
                    f"trial {number} ({trial_id}) raised {raised[0]} (see `trialbus log trial {trial_id}`)"
                )
        for callback in self.callbacks:
            callback(self.study, frozen)

    async def _abandon(self, waits: dict[asyncio.Task[TrialOutcome], str]) -> None:
        """Stop the experiment and record its running trials FAIL: the study stays consistent."""
        for task in waits:
            task.cancel()
        for trial in self.trials.values():
            self.study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        self.trials.clear()
        try:
            await asyncio.shield(self.client.stop_experiment(self.experiment_id, "the Optuna study stopped"))
        except (TrialbusError, asyncio.CancelledError) as exc:
            log.warning("could not stop experiment %s: %s", self.experiment_id, exc)

    # -- the trials' questions ------------------------------------------------------------------------

    async def answer(self, ask: Ask) -> Answer:
        trial = self.trials.get(ask.trial_id)
        if trial is None:
            return Answer(ok=False, error=f"trial {ask.trial_id} is not running in this study")
        try:
            return Answer(ok=True, value=self._answer(trial, ask))
        except Exception as exc:  # the study's refusal goes back to the trial, which raises it
            return Answer(ok=False, error=f"{type(exc).__name__}: {exc}")

    def _answer(self, trial: optuna.Trial, ask: Ask) -> Any:
        if ask.op == "suggest":
            return _suggest(trial, ask.name, ask.distribution)
        if ask.op == "report":
            if not isinstance(ask.value, int | float) or ask.step is None:
                raise ValueError("report needs a number and a step")
            with warnings.catch_warnings():  # a retried attempt reports its steps again: Optuna keeps the first
                warnings.simplefilter("ignore", UserWarning)
                trial.report(float(ask.value), ask.step)
            return None
        if ask.op == "should_prune":
            return bool(trial.should_prune())  # a pruner may answer numpy.bool_
        if ask.op == "set_user_attr":
            trial.set_user_attr(ask.name, ask.value)
            return None
        if ask.op == "state":
            frozen = self.study._storage.get_trial(trial._trial_id)
            return {
                "number": frozen.number,
                "params": frozen.params,
                "userAttrs": frozen.user_attrs,
                "distributions": {k: distribution_to_json(d) for k, d in frozen.distributions.items()},
            }
        if ask.op == "pruned":
            self.pruned.add(trial.number)
            asyncio.get_running_loop().create_task(self._early_stop(ask.trial_id))
            return None
        if ask.op == "failed":
            self.raised[trial.number] = [str(c) for c in ask.value] if isinstance(ask.value, list) else []
            return None
        raise ValueError(f"unknown question {ask.op!r}")

    async def _early_stop(self, trial_id: str) -> None:
        try:
            await self.client.cancel_trial(trial_id, early_stop=True, message="pruned by the study's pruner")
        except TrialbusError as exc:
            if exc.status != 409:  # 409: it ended meanwhile
                log.warning("could not early-stop trial %s: %s", trial_id, exc)


def _suggest(trial: optuna.Trial, name: str, distribution: str) -> Any:
    """The study's suggestion, through the public API (the sampler sees what study.optimize shows it)."""
    d = json_to_distribution(distribution)
    if isinstance(d, FloatDistribution):
        return trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)
    if isinstance(d, IntDistribution):
        return trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(name, d.choices)
    raise ValueError(f"unsupported distribution {type(d).__name__}")


def _value(final: Any) -> float | None:
    """A FINAL result as the study's value: a number, or NNI's ``{"default": number}``."""
    if isinstance(final, dict):
        final = final.get("default")
    if isinstance(final, bool) or not isinstance(final, int | float) or math.isnan(final):
        return None
    return float(final)
