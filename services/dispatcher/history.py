"""What the dispatcher reads from elsewhere rather than from its state: a trial's metric
history (the METRICS stream) and its log (the adapter replica that ran it)."""

from __future__ import annotations

from typing import Any

from contracts import subjects
from contracts.messages import LogReply, LogRequest, MetricRecord
from contracts.state import TrialState
from services.common.bus import Bus


async def trial_metrics(bus: Bus, trial: TrialState) -> list[dict[str, Any]]:
    """Every metric record of the trial, in stream order, each once, ``value`` decoded."""
    subject = subjects.metrics(trial.experiment_id, trial.id)
    info = await bus.js.stream_info("METRICS", subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    records: dict[tuple[str, int], MetricRecord] = {}
    if count:
        sub = await bus.js.subscribe(subject, ordered_consumer=True)
        try:
            for _ in range(count):
                record = MetricRecord.decode((await sub.next_msg(timeout=5)).data)
                records.setdefault((record.type.value, record.sequence), record)
        finally:
            await sub.unsubscribe()
    return [
        {"type": r.type.value, "sequence": r.sequence, "value": r.decoded(), "timestamp": r.timestamp.isoformat()}
        for r in records.values()
    ]


async def trial_log(bus: Bus, trial: TrialState, max_bytes: int, timeout: float) -> str | None:
    """The tail of stdout and stderr from the replica holding the trial; None if none answers."""
    request = LogRequest(experiment_id=trial.experiment_id, trial_id=trial.id, max_bytes=max_bytes)
    try:
        reply = await bus.nc.request(subjects.control(trial.platform, "log"), request.encode(), timeout=timeout)
    except Exception:
        return None
    return LogReply.decode(reply.data).text
