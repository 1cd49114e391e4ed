"""The dispatcher's trial indexes (services/common/trial_index.py): counts, unfinished trials,
best trials and pages, as trials are submitted, change and end."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.base import utcnow
from contracts.state import TrialState, TrialStatus
from services.common.trial_index import BadCursor, ExperimentTrials

NOW = utcnow()


def trial(sequence: int, status: TrialStatus = TrialStatus.WAITING, final=None) -> TrialState:
    return TrialState(
        id=f"t{sequence}",
        experiment_id="e",
        sequence_id=sequence,
        platform="local-gpu",
        submit_time=NOW,
        status=status,
        final_metric=final,
    )


def every(index: ExperimentTrials, order="sequence", statuses=None, limit=3) -> list[str]:
    found, cursor = [], None
    while True:
        page = index.page(order, statuses, cursor, limit)
        found += page.trial_ids
        if page.cursor is None:
            return found
        cursor = page.cursor


def test_counts_and_unfinished_follow_each_change():
    index = ExperimentTrials(minimize=False)
    for i in range(5):
        index.put(trial(i))
    index.put(trial(1, TrialStatus.RUNNING))
    index.put(trial(2, TrialStatus.SUCCEEDED, 0.5))
    index.put(trial(2, TrialStatus.SUCCEEDED, 0.5))  # the same state again changes nothing

    counts = index.counts()
    assert (counts["WAITING"], counts["RUNNING"], counts["SUCCEEDED"], counts["FAILED"]) == (3, 1, 1, 0)
    assert list(index.unfinished) == ["t0", "t1", "t3", "t4"] and len(index) == 5


def test_pages_in_submission_order_filtered_by_status():
    index = ExperimentTrials(minimize=False)
    statuses = [TrialStatus.SUCCEEDED, TrialStatus.RUNNING, TrialStatus.FAILED] * 4
    for i, status in enumerate(statuses):
        index.put(trial(i, status))

    assert every(index) == [f"t{i}" for i in range(12)]
    assert every(index, statuses=[TrialStatus.RUNNING]) == ["t1", "t4", "t7", "t10"]
    assert every(index, statuses=[TrialStatus.FAILED, TrialStatus.SUCCEEDED], limit=5) == [
        "t0",
        "t2",
        "t3",
        "t5",
        "t6",
        "t8",
        "t9",
        "t11",
    ]
    assert index.page("sequence", None, None, 100).cursor is None  # one page: no next


@pytest.mark.parametrize(
    ("minimize", "best_first"), [(False, ["t3", "t1", "t0", "t2"]), (True, ["t2", "t0", "t1", "t3"])]
)
def test_pages_by_final_metric_best_first_then_those_without(minimize, best_first):
    index = ExperimentTrials(minimize=minimize)
    for i, value in enumerate([0.5, 0.7, 0.1, {"default": 0.9, "loss": 3}]):
        index.put(trial(i, TrialStatus.SUCCEEDED, value))
    index.put(trial(4, TrialStatus.RUNNING))
    index.put(trial(5, TrialStatus.SUCCEEDED, float("nan")))  # no finite metric: with those without one

    assert every(index, "metric") == [*best_first, "t4", "t5"]
    assert every(index, "metric", [TrialStatus.SUCCEEDED], limit=2) == [*best_first, "t5"]
    best = index.best(2)
    assert [trial_id for trial_id, _ in best] == best_first[:2]
    assert best[0][1] == (0.1 if minimize else 0.9)


def test_a_cursor_from_elsewhere_is_refused_with_what_to_do():
    index = ExperimentTrials(minimize=False)
    for i in range(4):
        index.put(trial(i))
    by_sequence = index.page("sequence", None, None, 2).cursor
    for cursor in ("nonsense", by_sequence[:-3] + "AAA", "eyJvIjoibWV0cmljIn0"):
        with pytest.raises(BadCursor, match="start again without a cursor"):
            index.page("sequence", None, cursor, 2)
    with pytest.raises(BadCursor, match="for sort=metric"):
        index.page("metric", None, by_sequence, 2)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=7))
def test_paging_while_trials_end_and_are_submitted_misses_and_repeats_none(seed, limit):
    """Between two pages, trials change status, get metrics, and new ones are submitted: in
    submission order every trial is seen exactly once, those submitted meanwhile too."""
    rng = random.Random(seed)
    index = ExperimentTrials(minimize=False)
    submitted = 30
    for i in range(submitted):
        index.put(trial(i, rng.choice(list(TrialStatus))))
    start = {f"t{i}" for i in range(submitted)}
    seen, cursor = [], None
    for pages in range(1000):
        page = index.page("sequence", None, cursor, limit)
        seen += page.trial_ids
        if page.cursor is None:
            break
        cursor = page.cursor
        for _ in range(rng.randrange(4) if pages < 10 else 0):  # meanwhile: trials end, others are submitted
            index.put(trial(rng.randrange(submitted), TrialStatus.SUCCEEDED, rng.random()))
            index.put(trial(submitted))
            submitted += 1
    assert len(seen) == len(set(seen)) and start <= set(seen) and len(seen) == submitted


def expected_order(trials: dict[int, TrialState], order: str, statuses, descending: bool, minimize: bool) -> list[str]:
    """The order ``window`` promises, computed the slow way from every trial."""
    from contracts.state import default_metric

    chosen = [t for t in trials.values() if not statuses or t.status in statuses]
    if order == "sequence":
        return [t.id for t in sorted(chosen, key=lambda t: t.sequence_id, reverse=descending)]
    with_metric = [t for t in chosen if default_metric(t.final_metric) is not None]
    without = sorted((t for t in chosen if default_metric(t.final_metric) is None), key=lambda t: t.sequence_id)
    sign = 1 if minimize else -1
    ranked = sorted(with_metric, key=lambda t: (sign * default_metric(t.final_metric), t.sequence_id))
    return [t.id for t in (ranked[::-1] if descending else ranked) + without]


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    minimize=st.booleans(),
    descending=st.booleans(),
    order=st.sampled_from(["sequence", "metric"]),
    filtered=st.integers(min_value=0, max_value=4),
)
def test_a_window_at_any_offset_is_that_slice_of_the_order(seed, minimize, descending, order, filtered):
    """Any offset and size, any filter (none, one status, several), either direction, as trials
    keep changing after the first window: always the slice of the order computed from all trials."""
    rng = random.Random(seed)
    index = ExperimentTrials(minimize=minimize)
    trials: dict[int, TrialState] = {}
    statuses = None if not filtered else rng.sample(list(TrialStatus), filtered)

    def change(count: int) -> None:
        for _ in range(count):
            sequence = rng.randrange(60)
            status = rng.choice(list(TrialStatus))
            final = rng.choice([None, round(rng.random(), 1), {"default": rng.randrange(5)}, float("nan")])
            trials[sequence] = trial(sequence, status, final)
            index.put(trials[sequence])
            if rng.random() < 0.05:
                index.remove(trials.pop(sequence).id)

    change(80)
    for _ in range(6):
        everything = expected_order(trials, order, statuses, descending, minimize)
        assert index.total(statuses) == len(everything)
        for _ in range(5):
            offset, limit = rng.randrange(len(everything) + 3), rng.randrange(1, 12)
            assert index.window(order, statuses, offset, limit, descending) == everything[offset : offset + limit]
        assert index.window(order, statuses, 0, 1000, descending) == everything
        change(10)  # the orders over all statuses are kept from now on


def test_paging_a_window_by_offset_sees_every_trial_once():
    # Given 1,000 trials, a third of them with a metric
    index = ExperimentTrials(minimize=False)
    for i in range(1000):
        index.put(
            trial(
                i, TrialStatus.SUCCEEDED if i % 3 == 0 else TrialStatus.FAILED, (i * 37) % 101 if i % 3 == 0 else None
            )
        )
    # When a table pages through them 64 rows at a time, best first
    seen = [t for offset in range(0, 1000, 64) for t in index.window("metric", None, offset, 64)]
    # Then it sees each once, the last page ends at the last trial, and nothing lies past the end
    assert len(seen) == len(set(seen)) == 1000 and index.total() == 1000
    assert seen[-1] == "t998" and index.window("metric", None, 1000, 64) == []
    assert index.window("sequence", [TrialStatus.SUCCEEDED], 333, 5, descending=True) == ["t0"]
