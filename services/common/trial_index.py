"""The read model of trials: indexes per experiment, kept as trials change (the dispatcher's
store and the web UI's model keep one each).

Every trial state cached passes through :meth:`ExperimentTrials.put`, at O(log n) for an
experiment of n trials, so that nothing asked of an experiment costs O(n):

- its counts by status, and how many of its trials are unfinished: O(1) (the experiment's
  summary; whether it is done, asked at every trial's end);
- its unfinished trials, as a set of their own: the sweep and a stop walk only those;
- its best trials (best final metric first, ``optimize_mode`` aware): O(log n);
- a page of its trials, in submission order or best final metric first, filtered by status:
  O((limit + statuses) · log n) with an opaque cursor, whatever the experiment's size.

Random access, for a table that scrolls to any row (the web UI): :meth:`ExperimentTrials.window`
gives the trials at positions ``offset`` to ``offset + limit`` of an order, either direction, under
a status filter, and :meth:`ExperimentTrials.total` how many the filter holds. Both orders are
also kept over all statuses together, made at the first ``window`` call (once, O(n log n)) and
then kept at O(log n) per change: the dispatcher, which never asks, pays nothing for them.

Pages in submission order never miss or repeat a trial while trials keep ending or being
submitted (the cursor is the last sequence id, and sequence ids never change). Sorted by
metric, the cursor is the last trial's place; a trial whose metric arrives meanwhile takes
its own place, before or after the cursor. Trials without a finite final metric come last,
in submission order.
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sortedcontainers import SortedList

from contracts.state import TrialState, TrialStatus, default_metric

Order = Literal["sequence", "metric"]
ORDERS: tuple[Order, ...] = ("sequence", "metric")
#: A trial's place when sorted by metric: (0, value, sequence) ranked (value negated when
#: maximizing, so that ascending order is best first), (1, 0.0, sequence) without a metric.
Rank = tuple[int, float, int]
#: The keys of either order, for the helpers that serve both: sequence ids (int) or Ranks.
AnyKeys = SortedList[Any]


class BadCursor(ValueError):
    """A cursor this index did not give out (or one given out for another sort order)."""


@dataclass(slots=True)
class _Entry:
    status: TrialStatus
    sequence: int
    rank: Rank


@dataclass(frozen=True, slots=True)
class Page:
    trial_ids: list[str]
    #: Pass it back for the next page; None on the last one.
    cursor: str | None


class ExperimentTrials:
    """One experiment's trials, indexed (see the module docstring)."""

    def __init__(self, minimize: bool) -> None:
        self.minimize = minimize
        self._entries: dict[str, _Entry] = {}
        self._by_sequence: dict[int, str] = {}
        self._sequence: dict[TrialStatus, SortedList[int]] = {status: SortedList() for status in TrialStatus}
        self._ranked: dict[TrialStatus, SortedList[Rank]] = {status: SortedList() for status in TrialStatus}
        #: Trial ids not ended yet, in the order they were first seen (insertion order).
        self.unfinished: dict[str, None] = {}
        #: Both orders over every status (``window`` makes them at its first call): order → keys.
        self._all: dict[Order, AnyKeys] | None = None

    def rank(self, trial: TrialState) -> Rank:
        value = default_metric(trial.final_metric)
        if value is None:
            return (1, 0.0, trial.sequence_id)
        return (0, value if self.minimize else -value, trial.sequence_id)

    def put(self, trial: TrialState) -> None:
        """The trial's current state (new, or changed): O(log n)."""
        rank, old = self.rank(trial), self._entries.get(trial.id)
        if old is not None:
            if old.status == trial.status and old.rank == rank:
                return
            self._unsort(old)
        self._entries[trial.id] = _Entry(trial.status, trial.sequence_id, rank)
        self._by_sequence[trial.sequence_id] = trial.id
        self._sequence[trial.status].add(trial.sequence_id)
        self._ranked[trial.status].add(rank)
        if self._all is not None:
            self._all["sequence"].add(trial.sequence_id)
            self._all["metric"].add(rank)
        if trial.status.terminal:
            self.unfinished.pop(trial.id, None)
        else:
            self.unfinished[trial.id] = None

    def remove(self, trial_id: str) -> None:
        """The trial is gone (its experiment deleted): O(log n)."""
        if (old := self._entries.pop(trial_id, None)) is None:
            return
        self._unsort(old)
        self._by_sequence.pop(old.sequence, None)
        self.unfinished.pop(trial_id, None)

    def _unsort(self, old: _Entry) -> None:
        """Take an entry out of the sorted lists it is in: O(log n)."""
        self._sequence[old.status].remove(old.sequence)
        self._ranked[old.status].remove(old.rank)
        if self._all is not None:
            self._all["sequence"].remove(old.sequence)
            self._all["metric"].remove(old.rank)

    def __len__(self) -> int:
        return len(self._entries)

    def counts(self) -> dict[str, int]:
        """Trials by status, every status present (0 where none): O(statuses)."""
        return {status.value: len(self._sequence[status]) for status in TrialStatus}

    def best(self, count: int) -> list[tuple[str, float]]:
        """Up to ``count`` trials with the best final metric, best first: (trial id, metric)."""
        merged = heapq.merge(*(iter(ranked) for ranked in self._ranked.values()))
        found = []
        for flag, value, sequence in itertools.islice(merged, count):
            if flag:  # no metric: nothing better follows
                break
            found.append((self._by_sequence[sequence], value if self.minimize else -value))
        return found

    def page(self, order: Order, statuses: Iterable[TrialStatus] | None, cursor: str | None, limit: int) -> Page:
        """Up to ``limit`` trial ids after ``cursor``; the cursor of the next page, if any."""
        wanted = list(dict.fromkeys(statuses)) if statuses else list(TrialStatus)
        after = _decode(cursor, order)
        if order == "sequence":
            start = None if after is None else after[0]
            runs = [self._sequence[s].irange(start, None, (False, True)) for s in wanted]
            keys = list(itertools.islice(heapq.merge(*runs), limit + 1))
            ids = [self._by_sequence[q] for q in keys[:limit]]
            last: list[int | float] | None = [keys[limit - 1]] if len(keys) > limit else None
        else:
            since = None if after is None else (after[0], after[1], after[2])  # a Rank, as _decode checked
            ranked = [self._ranked[s].irange(since, None, (False, True)) for s in wanted]
            ranks = list(itertools.islice(heapq.merge(*ranked), limit + 1))
            ids = [self._by_sequence[rank[2]] for rank in ranks[:limit]]
            last = list(ranks[limit - 1]) if len(ranks) > limit else None
        return Page(ids, None if last is None else _encode(order, last))

    def total(self, statuses: Iterable[TrialStatus] | None = None) -> int:
        """How many trials the status filter holds (all without one): O(statuses)."""
        wanted = set(statuses) if statuses else set(TrialStatus)
        return sum(len(self._sequence[s]) for s in wanted)

    def window(
        self, order: Order, statuses: Iterable[TrialStatus] | None, offset: int, limit: int, descending: bool = False
    ) -> list[str]:
        """The ids of the trials at positions ``offset`` to ``offset + limit`` (fewer past the end).

        ``sequence``: submission order, or newest first when ``descending``. ``metric``: best
        final metric first, or worst first when ``descending``; either way the trials without
        a metric come last, in submission order. Positions are those of this moment: a table
        paged by offset while trials are submitted or end may see a trial twice or not at all
        (:meth:`page`'s cursor does not); a table that shows the current state refetches.

        Cost: O(log n + limit) with no filter or one status; O(s · log² n + s · limit) for a
        filter of s statuses (the first position found by bisection over both orders' keys).
        """
        wanted = list(dict.fromkeys(statuses)) if statuses else list(TrialStatus)
        lists: list[AnyKeys] = [(self._sequence if order == "sequence" else self._ranked)[s] for s in wanted]
        total = sum(map(len, lists))
        offset, limit = max(0, offset), max(0, min(limit, total - max(0, offset)))
        if not limit:
            return []
        if not descending:
            keys = self._keys(order, wanted, lists, offset, limit)
        elif order == "sequence":
            keys = self._keys(order, wanted, lists, total - offset - limit, limit)[::-1]
        else:  # worst metric first, then (as ascending) the trials without one, in submission order
            ranked = sum(ranked.bisect_left((1,)) for ranked in lists)
            head = max(0, min(limit, ranked - offset))
            keys = self._keys(order, wanted, lists, ranked - offset - head, head)[::-1]
            if limit > head:
                keys += self._keys(order, wanted, lists, max(offset, ranked), limit - head)
        return [self._by_sequence[key if order == "sequence" else key[2]] for key in keys]

    def _keys(self, order: Order, wanted: list[TrialStatus], lists: list[AnyKeys], start: int, count: int) -> list[Any]:
        """The keys at ascending positions ``start`` to ``start + count`` of the union of ``lists``."""
        if count <= 0:
            return []
        if len(lists) == 1:
            return list(lists[0].islice(start, start + count))
        if len(wanted) == len(TrialStatus):
            return list(self._every(order).islice(start, start + count))
        every = self._every(order)
        low, high = 0, len(every) - 1  # the first key of the union with ``start + 1`` keys at or before it
        while low < high:
            middle = (low + high) // 2
            if sum(keys.bisect_right(every[middle]) for keys in lists) >= start + 1:
                high = middle
            else:
                low = middle + 1
        runs = [keys.irange(every[low], None) for keys in lists]
        return list(itertools.islice(heapq.merge(*runs), count))

    def _every(self, order: Order) -> AnyKeys:
        if self._all is None:
            self._all = {
                "sequence": SortedList(itertools.chain.from_iterable(self._sequence.values())),
                "metric": SortedList(itertools.chain.from_iterable(self._ranked.values())),
            }
        return self._all[order]


class TrialIndex:
    """The indexes of every experiment, by experiment id."""

    def __init__(self) -> None:
        self.experiments: dict[str, ExperimentTrials] = {}

    def of(self, experiment_id: str, minimize: bool = False) -> ExperimentTrials:
        """The experiment's index (made at its first trial, with its optimize mode)."""
        if (found := self.experiments.get(experiment_id)) is None:
            found = self.experiments[experiment_id] = ExperimentTrials(minimize)
        return found


def _encode(order: Order, key: list[Any]) -> str:
    raw = json.dumps({"o": order, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str | None, order: Order) -> list[Any] | None:
    if cursor is None:
        return None
    try:
        found = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        key: list[Any] = found["k"]  # a list when valid, checked next
        valid = (
            found["o"] == order
            and isinstance(key, list)
            and (
                [type(k) for k in key] == [int]
                if order == "sequence"
                else len(key) == 3 and type(key[0]) is int and isinstance(key[1], int | float) and type(key[2]) is int
            )
        )
    except (ValueError, TypeError, KeyError):
        valid = False
    if not valid:
        raise BadCursor(
            f"cursor {cursor[:40]!r} is not one this list gave out for sort={order}; start again without a cursor"
        )
    return key
