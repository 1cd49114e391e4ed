"""``python -m bench sklearn`` (issue 34) end to end with few trials: ``trialbus experiment run`` twice
on a fresh stack of its own, then NNI 3.0, on NNI's scikit-learn example; every trial succeeds
(forked from a template on the Trialbus side) and the figure prints. Its values are the bench's
to judge, not a test's."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from bench.sklearn import sklearn_figure
from tests.fixtures.nats import nats_server_binary, require_binary
from tests.fixtures.nni import nni_sdk


def test_the_sklearn_bench_runs_both_experiments_and_nni_and_prints_the_figure(tmp_path: Path) -> None:
    sdk = nni_sdk()
    require_binary(nats_server_binary(), "nats-server")
    out = io.StringIO()
    figures = sklearn_figure(Console(file=out, width=250), tmp_path, trials=4, concurrency=2, sdk=sdk)
    assert figures.outcomes == [(4, 4), (4, 4)]  # (succeeded, forked) per experiment
    assert figures.first > 0 and figures.second > 0 and figures.nni > 0
    assert re.search(
        r"first [\d.]+ s, second [\d.]+ s; NNI 3.0 [\d.]+ s: [\d.]+× \(target ≥ 10×\), [\d.]+× \(target ≥ "
        r"15×\)",
        out.getvalue(),
    ), out.getvalue()
