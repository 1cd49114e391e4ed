"""An experiment's final metrics by trial number, kept so that its chart costs O(points · log n).

The page's overview chart plots every trial's final default metric against its sequence id
(NNI's "Trial No."), with the best so far as a step line. At 100,000 trials the chart is a few
hundred pixels wide: it gets at most ``points`` points, the lowest and the highest of each of
``points / 2`` runs of trial numbers, so that every extreme stays visible (an outlier is what a
user looks for) and the chart is exact while the trials fit.

:class:`Finals` is a segment tree over sequence ids: each node holds the sequence ids of the
lowest and highest value under it. A change is O(log n); the lowest or highest over any run of
trial numbers is O(log n); capacity doubles as sequence ids grow (O(n) then, O(1) amortised).
"""

from __future__ import annotations

import math

Point = tuple[int, float]


class Finals:
    """Final default metrics by sequence id (see the module docstring)."""

    def __init__(self) -> None:
        self._size = 1
        self._values: list[float] = [math.nan]  # by sequence id; NaN: none
        self._low: list[int] = [-1, -1]  # node → the sequence id of its lowest value, -1: none
        self._high: list[int] = [-1, -1]
        self.count = 0
        #: One past the highest sequence id that has a value (the chart's x range): O(1).
        self.end = 0

    def set(self, sequence: int, value: float | None) -> None:
        """The trial's final default metric (None: it has none): O(log n)."""
        if sequence >= self._size:
            if value is None:
                return
            self._grow(sequence + 1)
        old = self._values[sequence]
        new = math.nan if value is None else float(value)
        if old == new or (math.isnan(old) and math.isnan(new)):
            return
        self.count += (not math.isnan(new)) - (not math.isnan(old))
        self._values[sequence] = new
        if not math.isnan(new):
            self.end = max(self.end, sequence + 1)
        node = (self._size + sequence) // 2
        leaf = -1 if math.isnan(new) else sequence
        self._low[self._size + sequence] = self._high[self._size + sequence] = leaf
        while node:
            self._pull(node)
            node //= 2

    def _pull(self, node: int) -> None:
        left, right = 2 * node, 2 * node + 1
        self._low[node] = self._pick(self._low[left], self._low[right], lower=True)
        self._high[node] = self._pick(self._high[left], self._high[right], lower=False)

    def _pick(self, a: int, b: int, lower: bool) -> int:
        if a < 0 or b < 0:
            return a if b < 0 else b
        va, vb = self._values[a], self._values[b]
        if va == vb:  # ties: the earlier trial (a range's nodes are not combined in trial order)
            return min(a, b)
        return b if (vb < va if lower else vb > va) else a

    def _grow(self, needed: int) -> None:
        size = self._size
        while size < needed:
            size *= 2
        values = self._values + [math.nan] * (size - self._size)
        self._size, self._values = size, values
        self._low = [-1] * size + [i if not math.isnan(v) else -1 for i, v in enumerate(values)]
        self._high = list(self._low)
        for node in range(size - 1, 0, -1):
            self._pull(node)

    def extremes(self, start: int, stop: int) -> tuple[int, int]:
        """Sequence ids of the lowest and highest value among ``start ≤ id < stop`` (-1: none): O(log n)."""
        low = high = -1
        lo, hi = max(0, start) + self._size, min(stop, self._size) + self._size
        while lo < hi:
            if lo & 1:
                low, high = self._pick(low, self._low[lo], True), self._pick(high, self._high[lo], False)
                lo += 1
            if hi & 1:
                hi -= 1
                low, high = self._pick(low, self._low[hi], True), self._pick(high, self._high[hi], False)
            lo //= 2
            hi //= 2
        return low, high

    def chart(self, points: int, minimize: bool) -> dict[str, list[Point] | int]:
        """At most ``points`` (≥ 2) points to draw, in trial order, and the best-so-far steps:
        every point while the trials fit, else the lowest and highest of each run. O(points · log n)."""
        end, buckets = self.end, max(1, points // 2)
        shown: list[Point] = []
        if end <= points:
            shown = [(i, v) for i, v in enumerate(self._values[:end]) if not math.isnan(v)]
        else:
            width = math.ceil(end / buckets)
            for start in range(0, end, width):
                found = sorted({s for s in self.extremes(start, start + width) if s >= 0})
                shown += [(s, self._values[s]) for s in found]
        best: list[Point] = []
        stops = [s + 1 for s, _ in shown]
        for stop in stops:  # the best so far changes at most once per point shown, at one of them
            low, high = self.extremes(0, stop)
            at = low if minimize else high
            if at >= 0 and (not best or best[-1][0] != at):
                best.append((at, self._values[at]))
        return {"points": shown, "best": best, "count": self.count}
