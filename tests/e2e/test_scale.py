"""The short version of ``make bench-scale`` (bench/scale.py): 2,000 trials through the fake
adapter, 20,000 metric records from keepers' batches to a tuner, then every read it times, the
dispatcher's restart and the web UI's page in Chromium, as a user's calls. What it
asserts is that each step completes and answers (speed is measured by the bench, not here)."""

from __future__ import annotations

import shutil

import pytest

from bench.scale import measure
from tests.fixtures.nats import require_binary

pytestmark = pytest.mark.timeout(240)


def test_two_thousand_trials_end_and_every_read_answers_at_that_size():
    require_binary(shutil.which("chromium"), "chromium")  # the web UI's page is among the figures
    said: list[str] = []
    figures = measure(2000, 200, say=said.append, metric_trials=20, per_trial=1000, webui=True)

    assert figures.submit_rate > 0 and figures.end_rates[-1][0] == 2000, said
    assert set(figures.reads) >= {"experiment summary", "page of 100 (first)", "one trial"}
    assert all(len(ms) == 50 for ms in figures.reads.values())
    assert figures.metrics is not None and figures.metrics.records == 20_000 and figures.metrics.rate > 0, said
    assert 0 < figures.restart_seconds < 60, said
    assert figures.webui["trials"] == 2000 and figures.webui["dom_rows"] < 200, said
