"""The tuner an experiment's config asks for: NNI's built-in names on Optuna, or the user's own classes.

=====================================  ============================================================================
config                                 what runs
=====================================  ============================================================================
``tuner`` (or ``advisor``) by name     :func:`services.tuner.algorithms.tuner` on Optuna, the ``assessor`` by name
                                       as its pruner; the search space gets NNI's ``{_type, _value}`` check
``tuner`` or ``advisor`` className     the class (:mod:`~services.tuner.loading`): an advisor (it derives from NNI's
                                       ``MsgDispatcherBase``) by :mod:`~services.tuner.advisor`, a tuner by
                                       :mod:`~services.tuner.nni_classes` with the assessor (a class, or a built-in
                                       name as NNI's own class); the search space as written, unchecked
built-in tuner, ``assessor`` class     the Optuna tuner, its trials judged by the class
=====================================  ============================================================================

``multiThread: true`` (NNI v1; ``config.multi_thread``) calls a user's classes from a pool of up to
``trialConcurrency`` threads (:mod:`services.tuner.calls`). Built-in names ignore it: Optuna proposes in
milliseconds, so there is no wait for threads to hide, and TPE asked for several trials at once from one study
would only propose them from the same knowledge; so they are asked one at a time, as without it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from services.tuner import advisor, algorithms, loading
from services.tuner.calls import Calls
from services.tuner.checks import assessor_class, tuner_section
from services.tuner.nni_classes import NniAssessor, NniTuner
from services.tuner.protocol import TunerLike
from services.tuner.space import parse_search_space

if TYPE_CHECKING:
    from collections.abc import Mapping

    from contracts import ExperimentConfig

__all__ = ["for_experiment"]

log = logging.getLogger(__name__)


def _judged(tuner: TunerLike, config: Mapping[str, Any], threads: int) -> NniAssessor:
    spec = loading.spec(config, "assessor")
    cls = loading.load(spec)
    try:
        return NniAssessor(tuner, loading.construct(spec, cls), Calls(spec.owner, threads))
    except BaseException:
        tuner.close(ended=False)
        raise


def for_experiment(
    config: ExperimentConfig, seed: int | None = None, *, history: int | None = algorithms.DEFAULT_KEEP_LAST
) -> TunerLike:
    """The tuner (with its assessor) ``config`` asks for, ready to propose; a built-in one keeps the last
    ``history`` finished trials (and the best; :mod:`services.tuner.history`).

    :raises ValueError: no search space, or a config that names something that is not there, with the reason.
    :raises ClassFailed: a user's class raised while it was imported, constructed or handed the search space.
    """
    tuner_config, kind = tuner_section(config)
    search_space = config.search_space
    assert search_space is not None  # tuner_section refuses a config without one
    threads = config.trial_concurrency if config.multi_thread else 1
    if loading.names_class(tuner_config):
        spec = loading.spec(tuner_config, kind)
        cls = loading.load(spec)
        calls = Calls(spec.owner, threads)
        try:
            if advisor.is_advisor(cls):
                if config.assessor:
                    log.warning(
                        "%s is an advisor: it stops trials itself, and the assessor is ignored (as NNI ignores it)",
                        spec.owner,
                    )
                return advisor.create(spec, cls, search_space, calls)
            tuner: TunerLike = NniTuner(loading.construct(spec, cls), search_space, calls)
        except BaseException:
            calls.close()
            raise
        return _judged(tuner, assessor_class(config.assessor), threads) if config.assessor else tuner
    if config.multi_thread:
        log.info("multiThread has no effect on the built-in tuner: Optuna is asked for one trial at a time")
    space = parse_search_space(search_space)
    if loading.names_class(config.assessor):
        return _judged(algorithms.tuner(tuner_config, space, seed, history=history), config.assessor, threads)
    return algorithms.tuner(tuner_config, space, seed, assessor_config=config.assessor, history=history)
