"""An experiment's trial durations, kept sorted so that its histogram costs O(bins · log n).

The page's "Durations" chart shows how long the trials that ended took (start to end, the last
attempt's), as a histogram: at 100,000 trials the browser gets ``bins`` counts, never the
durations themselves. :class:`Durations` holds one duration per ended trial in a sorted list:
a change is O(log n); the histogram is a bisection per bin edge, and the quantiles shown
beside it (median, 90th percentile) are O(log n) each.

Trials still running are not in the chart (their duration is not known yet); their count is
given beside it.
"""

from __future__ import annotations

from typing import Any

from sortedcontainers import SortedList

from contracts.state import TrialState

#: Bins when the browser does not say, and the fewest and most it may ask for.
DEFAULT_BINS = 20
BINS_RANGE = (1, 200)


def duration(trial: TrialState) -> float | None:
    """Seconds from the trial's start to its end; None until it has both."""
    if trial.start_time is None or trial.end_time is None or not trial.status.terminal:
        return None
    return max(0.0, (trial.end_time - trial.start_time).total_seconds())


class Durations:
    """The durations of one experiment's ended trials, sorted (see the module docstring)."""

    def __init__(self) -> None:
        self._of: dict[str, float] = {}
        self._sorted: SortedList[float] = SortedList()

    def set(self, trial: TrialState) -> None:
        """The trial's current state: O(log n)."""
        self.remove(trial.id)
        if (seconds := duration(trial)) is not None:
            self._of[trial.id] = seconds
            self._sorted.add(seconds)

    def remove(self, trial_id: str) -> None:
        if (old := self._of.pop(trial_id, None)) is not None:
            self._sorted.remove(old)

    def __len__(self) -> int:
        return len(self._sorted)

    def quantile(self, share: float) -> float | None:
        """The duration below which ``share`` of the trials ended (nearest rank): O(log n)."""
        if not self._sorted:
            return None
        return self._sorted[min(len(self._sorted) - 1, max(0, round(share * (len(self._sorted) - 1))))]

    def histogram(self, bins: int) -> dict[str, Any]:
        """``bins`` equal-width bins from the shortest to the longest duration, each
        ``{"from", "to", "count"}`` (a bin holds ``from ≤ d < to``, the last one its ``to`` too),
        with the count and quantiles: O(bins · log n)."""
        count = len(self._sorted)
        if not count:
            return {"count": 0, "bins": [], "min": None, "median": None, "p90": None, "max": None}
        low, high = self._sorted[0], self._sorted[-1]
        bins = 1 if high == low else bins
        width = (high - low) / bins or 1.0
        edges = [low + i * width for i in range(bins)] + [high]
        below = [self._sorted.bisect_left(edge) for edge in edges[:-1]] + [count]
        return {
            "count": count,
            "bins": [{"from": edges[i], "to": edges[i + 1], "count": below[i + 1] - below[i]} for i in range(bins)],
            "min": low,
            "median": self.quantile(0.5),
            "p90": self.quantile(0.9),
            "max": high,
        }
