"""Metric batches (contracts.metrics): what readers get from a METRICS message of either form."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from contracts import ContractError, MetricRecord
from contracts.messages import MetricType
from contracts.metrics import BatchedRecord, MetricBatch, Seen, batch_id, raw_records_of, records_of

NOW = datetime(2026, 11, 26, 12, 0, 0, 250000, tzinfo=UTC)


def batch(*records: tuple[str, int], attempt: int = 1) -> MetricBatch:
    return MetricBatch(
        experiment_id="e1",
        trial_id="t1",
        attempt=attempt,
        timestamp=NOW,
        records=[BatchedRecord(parameter_id=3, type=kind, sequence=seq, value=f"{seq}.5") for kind, seq in records],
    )


def test_a_batch_reads_as_the_records_it_carries_each_as_if_published_alone():
    message = batch(("PERIODICAL", 0), ("PERIODICAL", 1), ("FINAL", 0)).encode()
    records = records_of(message)
    assert [(r.type.value, r.sequence, r.value, r.attempt, r.parameter_id) for r in records] == [
        ("PERIODICAL", 0, "0.5", 1, 3),
        ("PERIODICAL", 1, "1.5", 1, 3),
        ("FINAL", 0, "0.5", 1, 3),
    ]
    assert records[2] == MetricRecord(
        experiment_id="e1",
        trial_id="t1",
        attempt=1,
        parameter_id=3,
        type=MetricType.FINAL,
        sequence=0,
        value="0.5",
        timestamp=NOW,
    )
    assert [r["sequence"] for r in raw_records_of(message)] == [0, 1, 0]
    assert raw_records_of(message)[0]["trialId"] == "t1"


def test_a_single_record_message_still_reads():
    alone = MetricRecord(
        experiment_id="e1", trial_id="t1", type=MetricType.PERIODICAL, sequence=4, value="1", timestamp=NOW
    )
    assert records_of(alone.encode()) == [alone]
    assert raw_records_of(alone.encode())[0]["sequence"] == 4


def test_a_reader_may_take_only_the_records_of_one_type():
    message = batch(("PERIODICAL", 0), ("FINAL", 0), ("PERIODICAL", 1)).encode()
    assert records_of(message, only=MetricType.FINAL) == [records_of(message)[1]]
    assert [r.sequence for r in records_of(message, only=MetricType.PERIODICAL)] == [0, 1]
    alone = MetricRecord(
        experiment_id="e1", trial_id="t1", type=MetricType.PERIODICAL, sequence=4, value="1", timestamp=NOW
    )
    assert records_of(alone.encode(), only=MetricType.FINAL) == []
    assert records_of(alone.encode(), only=MetricType.PERIODICAL) == [alone]
    # the records of another type are not validated; those of the type asked for are
    head = b'{"kind": "trial.metrics", "v": 1,"experimentId": "e1", "trialId": "t1", "timestamp": "2026-11-26T12:00Z", '
    bad = b'"records": [{"type": "%s", "sequence": -1, "value": "1"}]}'
    periodical, final = (head + bad % kind for kind in (b"PERIODICAL", b"FINAL"))
    assert records_of(periodical, only=MetricType.FINAL) == []
    with pytest.raises(ContractError):
        records_of(final, only=MetricType.FINAL)


@pytest.mark.parametrize("bad", [b"[]", b'{"kind": "trial.metrics", "v": 1, "records": [{"type": "X"}]}', b"nope"])
def test_a_malformed_message_is_a_contract_error(bad):
    with pytest.raises(ContractError):
        records_of(bad)


def test_the_batch_id_names_the_records_and_is_the_same_in_every_process():
    records = [("PERIODICAL", i) for i in range(5)]
    ids = {batch_id("t1", 0, records)}
    for _ in range(2):  # another process (another hash seed) gives the same id: a resend is a repeat
        code = "from contracts.metrics import batch_id; print(batch_id('t1', 0, [('PERIODICAL', i) for i in range(5)]))"
        ids.add(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    assert len(ids) == 1
    assert batch_id("t1", 0, records[:4]) not in ids and batch_id("t1", 1, records) not in ids
    assert batch_id("t1", 0, [("PERIODICAL", 0), ("PERIODICAL", 2), ("PERIODICAL", 4)]) != batch_id(
        "t1", 0, [("PERIODICAL", 0), ("PERIODICAL", 3), ("PERIODICAL", 4)]
    )
    with pytest.raises(ContractError):
        batch_id("t1", 0, [])


def test_seen_takes_each_record_once_per_attempt_and_type():
    seen = Seen()
    first = records_of(batch(("PERIODICAL", 0), ("PERIODICAL", 1)).encode())
    regrouped = records_of(batch(("PERIODICAL", 0), ("PERIODICAL", 1), ("PERIODICAL", 2), ("FINAL", 0)).encode())
    taken = [(r.type.value, r.sequence) for r in first + regrouped if seen.first_time(r)]
    assert taken == [("PERIODICAL", 0), ("PERIODICAL", 1), ("PERIODICAL", 2), ("FINAL", 0)]
    retry = records_of(batch(("PERIODICAL", 0), attempt=2).encode())  # a retry numbers its records from 0 again
    assert seen.first_time(retry[0]) and not seen.first_time(retry[0])
