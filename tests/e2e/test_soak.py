"""The short soak: under `trialbus up`, each part SIGKILLed once mid-experiment, nothing is lost.

``make soak`` is the long version (300 trials of 21 metrics); this one runs in the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench.soak import KILLS, report, soak
from tests.fixtures.nats import nats_server_binary, require_binary


@pytest.mark.timeout(400)
def test_every_part_killed_once_loses_duplicates_and_strands_nothing(tmp_path: Path):
    require_binary(nats_server_binary(), "nats-server")
    console = Console(record=True, width=160)
    result = soak(tmp_path, trials=60, concurrency=8, metrics=5, pause=0.05, kills=KILLS, timeout=300, console=console)
    report(result, console)
    shown = console.export_text()
    assert [k.part for k in result.kills] == list(KILLS), shown
    assert result.succeeded == 60 and result.stuck == result.lost == result.duplicated == 0, shown
    assert result.metrics_stored == result.metrics_expected == 60 * 6, shown
    assert result.metrics_lost == result.metrics_duplicated == result.metrics_wrong == result.views_wrong == 0, shown
    assert all(k.back_after is not None for k in result.kills), shown
    assert result.stop_code == 0, shown
