"""What a batch of metric records changes in trial state, folded per trial.

Records arrive by the thousand; folding them first lets the dispatcher copy and write each
trial's state once per batch instead of once per record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class MetricFold:
    """What a batch of metric records changes in one trial's state."""

    experiment_id: str
    trial_id: str
    #: Intermediate results reported so far: the highest PERIODICAL sequence + 1.
    periodical: int = 0
    #: The FINAL value as reported (NNI-encoded JSON text), if the batch holds it.
    final: str | None = None

    @staticmethod
    def fold(records: Iterable[dict[str, Any]]) -> list[MetricFold]:
        """Records (``MetricRecord`` JSON) → one fold per trial."""
        folds: dict[str, MetricFold] = {}
        for record in records:
            trial = record["trialId"]
            fold = folds.get(trial) or folds.setdefault(trial, MetricFold(record["experimentId"], trial))
            if record["type"] == "FINAL":
                fold.final = record["value"]
            else:
                fold.periodical = max(fold.periodical, record["sequence"] + 1)
        return list(folds.values())
