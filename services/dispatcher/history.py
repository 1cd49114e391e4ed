"""What the dispatcher asks elsewhere rather than its state: a trial's metric history (the
METRICS stream), its log (the adapter replica that ran it), whether a platform can run
a new experiment (one replica of its adapter), and a replica's drain."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import nats.errors

from contracts import subjects
from contracts.experiment import ExperimentConfig
from contracts.messages import CheckReply, CheckRequest, DrainReply, DrainRequest, LogReply, LogRequest, MetricRecord
from contracts.metrics import records_of
from contracts.nni import TrainingService
from contracts.platforms import PLATFORMS
from contracts.state import TrialState
from services.common.api import ApiError
from services.common.bus import Bus

log = logging.getLogger(__name__)


async def trial_metrics(bus: Bus, trial: TrialState) -> list[dict[str, Any]]:
    """Every metric record of the trial (of every attempt), in stream order, each once, ``value`` decoded."""
    subject = subjects.metrics(trial.experiment_id, trial.id)
    info = await bus.js.stream_info("METRICS", subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    records: dict[tuple[int, str, int], MetricRecord] = {}
    if count:
        sub = await bus.js.subscribe(subject, ordered_consumer=True)
        try:
            for _ in range(count):
                for record in records_of((await sub.next_msg(timeout=5)).data):  # one, or a keeper's batch
                    records.setdefault((record.attempt, record.type.value, record.sequence), record)
        finally:
            await sub.unsubscribe()
    return [
        {
            "attempt": r.attempt,
            "type": r.type.value,
            "sequence": r.sequence,
            "value": r.decoded(),
            "timestamp": r.timestamp.isoformat(),
        }
        for r in records.values()
    ]


async def trial_log(
    bus: Bus, trial: TrialState, max_bytes: int, timeout: float, attempt: int | None = None
) -> str | None:
    """The tail of stdout and stderr of the trial's attempt (the newest by default) from the
    replica holding it; None if none answers. An older attempt may have run on another
    platform of a hybrid experiment: that is the platform asked."""
    platform = trial.platform
    if attempt is not None and attempt < trial.attempt:
        platform = next((a.platform for a in trial.attempts if a.attempt == attempt and a.platform), platform)
    request = LogRequest(experiment_id=trial.experiment_id, trial_id=trial.id, max_bytes=max_bytes, attempt=attempt)
    try:
        reply = await bus.nc.request(subjects.control(platform, "log"), request.encode(), timeout=timeout)
    except Exception:
        return None
    return LogReply.decode(reply.data).text


async def check_platform(bus: Bus, config: ExperimentConfig, timeout: float) -> None:
    """Ask each of the experiment's adapters whether it can run its trials; 422 with their
    problems if one cannot (each of a hybrid experiment's platforms must be usable, as in NNI).

    No adapter running, or none answering in time, is no error: the trials wait for one.
    """
    found = await asyncio.gather(*(_check(bus, service, timeout) for service in config.training_services))
    problems = [
        f"the {service.adapter} platform cannot run this experiment: " + "; ".join(p)
        for service, p in zip(config.training_services, found, strict=True)
        if p
    ]
    if problems:
        raise ApiError(422, "; ".join(problems))


async def _check(bus: Bus, service: TrainingService, timeout: float) -> list[str]:
    request = CheckRequest(training_service=service)
    try:
        reply = await bus.nc.request(subjects.control(service.adapter, "check"), request.encode(), timeout=timeout)
    except nats.errors.NoRespondersError:
        log.info("no %s adapter is running to check the new experiment; its trials wait for one", service.adapter)
        return []
    except (nats.errors.TimeoutError, TimeoutError):
        log.warning("the %s adapter did not check the new experiment within %.0fs", service.adapter, timeout)
        return []
    return CheckReply.decode(reply.data).problems


async def drain(bus: Bus, adapter: str, replica: str, drain: bool, timeout: float) -> DrainReply:
    """Ask one adapter replica to drain (or take trials again); its answer. 404 when no replica of
    that name answers (the live ones: ``GET /api/v1/platforms``)."""
    adapters = {model.adapter for model in PLATFORMS.values()}
    if adapter not in adapters:
        raise ApiError(404, f"no adapter {adapter!r}: the adapters are {', '.join(sorted(adapters))}")
    request = DrainRequest(replica=replica, drain=drain)
    try:
        reply = await bus.nc.request(subjects.control(adapter, "drain"), request.encode(), timeout=timeout)
    except Exception:
        raise ApiError(
            404,
            f"no replica {replica!r} of the {adapter} adapter answered; `trialbus platform list` shows the live ones",
        ) from None
    return DrainReply.decode(reply.data)
