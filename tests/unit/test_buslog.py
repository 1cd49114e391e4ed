"""Which log lines are about an experiment (services/common/buslog.py): named in ``extra``, bound, or worded
``experiment %s`` as the services word them."""

from __future__ import annotations

import logging

import pytest

from services.common.buslog import experiment_of
from services.common.logs import bind


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    line = logging.LogRecord("services.test", logging.INFO, __file__, 1, message, args, None)
    line.__dict__.update(extra)
    return line


@pytest.mark.parametrize(
    ("line", "experiment"),
    [
        (record("experiment %s created (%s, concurrency %d)", "e1", "local", 2), "e1"),
        (record("could not stop experiment %s: %s", "e2", "gone"), "e2"),
        (record("driving experiment %s (%s)", "e3", "Tuner"), "e3"),
        (record("%d%% done, %s; experiment %s", 5, "x", "e4"), "e4"),
        (record("trial %s ended", "t1"), None),
        (record("loaded %d experiments", 3), None),
        (record("anything", experiment="e5"), "e5"),
        (record("experiment %s", "not an id."), None),
    ],
)
def test_a_line_names_its_experiment(line: logging.LogRecord, experiment: str | None) -> None:
    assert experiment_of(line) == experiment


def test_a_bound_experiment_names_every_line_of_its_block() -> None:
    with bind(experiment="e6", trial="t"):
        assert experiment_of(record("trial %s: early-stopped", "t")) == "e6"
    assert experiment_of(record("trial %s: early-stopped", "t")) is None
