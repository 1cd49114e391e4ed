"""What a batch of metric records changes in trial state, folded per trial, and how far
the METRICS stream has been applied.

Records arrive by the thousand; folding them first lets the dispatcher copy and write each
trial's state once per batch instead of once per record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext


@dataclass
class MetricFold:
    """What a batch of metric records changes in one trial's state."""

    experiment_id: str
    trial_id: str
    #: The attempt that reported them: only the trial's current attempt changes its state.
    attempt: int = 0
    #: Intermediate results reported so far: the highest PERIODICAL sequence + 1.
    periodical: int = 0
    #: The FINAL value as reported (NNI-encoded JSON text), if the batch holds it.
    final: str | None = None

    @staticmethod
    def fold(records: Iterable[dict[str, Any]]) -> list[MetricFold]:
        """Records (``MetricRecord`` JSON) → one fold per trial and attempt."""
        folds: dict[tuple[str, int], MetricFold] = {}
        for record in records:
            key = record["trialId"], record.get("attempt", 0)
            fold = folds.get(key) or folds.setdefault(key, MetricFold(record["experimentId"], *key))
            if record["type"] == "FINAL":
                fold.final = record["value"]
            else:
                fold.periodical = max(fold.periodical, record["sequence"] + 1)
        return list(folds.values())


class MetricsProgress:
    """How far the METRICS stream has been applied, so that a trial's end can wait for it."""

    def __init__(self) -> None:
        self.seq = 0
        self._applied = asyncio.Event()

    def applied(self, stream_seq: int) -> None:
        """Records up to ``stream_seq`` are applied (at start: the consumer's ack floor)."""
        self.seq = max(self.seq, stream_seq)
        self._applied.set()

    async def caught_up(self, js: JetStreamContext, timeout: float = 2.0) -> None:
        """Wait until every metric now in the stream is applied (bounded).

        A keeper delivers a trial's metrics before its adapter reports the end, so after
        this a trial that ended has its final metric, and a DONE experiment all of them.
        """
        try:
            target = (await js.stream_info("METRICS")).state.last_seq
        except Exception:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.seq < target and loop.time() < deadline:
            self._applied.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied.wait(), deadline - loop.time())
