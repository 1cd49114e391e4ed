"""A trial's curve cut down to what its chart can show, keeping its extremes.

A trial may report tens of thousands of intermediate results; the chart is some hundred
pixels wide. :class:`Line` keeps one attempt's results as at most ``limit`` points: the first,
the last, and the lowest and the highest of each run of consecutive results (a min/max
downsample: a spike or a dip is never smoothed away, unlike an average or a stride). Runs
double in length as results come (two neighbouring runs merge, keeping the extremes of both),
so adding a result is O(1) amortised and the line holds O(limit) whatever the trial reports.

:class:`Curve` is a trial's lines, one per attempt (each attempt numbers its results from 0),
with each attempt's final result.
"""

from __future__ import annotations

from typing import Any

Point = dict[str, Any]  # a record as the browser plots it (services.webui.curves.point)


class Line:
    """One attempt's intermediate results, at most ``limit`` kept (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.runs_kept = max(1, (limit - 2) // 2)
        self.run_length = 1
        #: Runs in arrival order: [results in it, its lowest point, its highest point].
        self.runs: list[list[Any]] = []
        self.first: Point | None = None
        self.last: Point | None = None
        #: Results added, drawn or not.
        self.count = 0

    def add(self, point: Point) -> None:
        self.count += 1
        self.first = self.first or point
        self.last = point
        run = self.runs[-1] if self.runs else None
        if run is not None and run[0] < self.run_length:
            run[0] += 1
            run[1] = point if point["default"] < run[1]["default"] else run[1]
            run[2] = point if point["default"] > run[2]["default"] else run[2]
            return
        self.runs.append([1, point, point])
        if len(self.runs) > self.runs_kept:
            self.run_length *= 2
            pairs = [self.runs[i : i + 2] for i in range(0, len(self.runs), 2)]
            self.runs = [
                [sum(r[0] for r in pair), min((r[1] for r in pair), key=_value), max((r[2] for r in pair), key=_value)]
                for pair in pairs
            ]

    def points(self) -> list[Point]:
        """The kept points in report order (by sequence), each once: O(limit)."""
        kept: dict[int, Point] = {}
        for point in (self.first, *(p for run in self.runs for p in run[1:]), self.last):
            if point is not None:
                kept[id(point)] = point
        return sorted(kept.values(), key=lambda p: p["sequence"])


def _value(point: Point) -> float:
    return point["default"]


class Curve:
    """A trial's records as its chart draws them: per attempt, a :class:`Line` and the final."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lines: dict[int, Line] = {}
        self.finals: dict[int, Point] = {}

    def add(self, point: Point) -> None:
        if point["type"] == "FINAL":
            self.finals[point["attempt"]] = point
        elif point["default"] is not None:  # a value without a number is not drawn
            self.lines.setdefault(point["attempt"], Line(self.limit)).add(point)

    @property
    def cut(self) -> bool:
        """Whether some attempt reported more results than are kept."""
        return any(len(line.points()) < line.count for line in self.lines.values())

    def points(self) -> list[Point]:
        """Every attempt's kept points, then the finals: at most ``limit`` per attempt, plus one."""
        found = [p for _, line in sorted(self.lines.items()) for p in line.points()]
        return found + [self.finals[a] for a in sorted(self.finals)]
