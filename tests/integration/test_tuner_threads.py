"""The threads a user's tuner class is called from: with ``multiThread``, results and ends reach it while its
proposals wait (NNI 2.x's pool); a call that never returns keeps neither a stop nor the process's exit waiting; and
closed classes leave no thread behind.

Real threads and, for the exit, a real Python process; the class is plain Python (NNI's base class is not needed).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from contracts import TrialStatus
from services.tuner.calls import Calls
from services.tuner.nni_classes import NniTuner
from services.tuner.protocol import TrialEnd
from services.tuner.threads import spawn

ROOT = Path(__file__).resolve().parents[2]


class WaitingTuner:
    """NNI's multi_thread case, polling faster: every proposal but the first waits for the first trial's result;
    it writes down each call with its thread's name."""

    def __init__(self) -> None:
        self.first_result_seen = False
        self.calls: list[tuple[str, object, str]] = []

    def note(self, method: str, what: object) -> None:
        self.calls.append((method, what, threading.current_thread().name))

    def update_search_space(self, search_space: dict) -> None:
        pass

    def generate_parameters(self, parameter_id: int, **kwargs: object) -> dict:
        self.note("generate_parameters", parameter_id)
        if parameter_id == 0:
            return {"x": 0}
        while not self.first_result_seen:
            time.sleep(0.02)
        return {"x": 1}

    def receive_trial_result(self, parameter_id: int, parameters: dict, value: float, **kwargs: object) -> None:
        self.note("receive_trial_result", parameter_id)
        if parameter_id == 0:
            self.first_result_seen = True

    def trial_end(self, parameter_id: int, success: bool) -> None:
        self.note("trial_end", parameter_id)


@pytest.mark.timeout(30)  # a result queued behind the waiting proposals never comes: the test fails here
def test_a_result_reaches_a_multi_thread_tuner_while_every_proposal_thread_waits() -> None:
    # Given a multiThread tuner (two threads) whose first trial was proposed, and two more proposals waiting for
    # its result: every proposal thread is taken
    instance = WaitingTuner()
    tuner = NniTuner(instance, {}, Calls("tuner class t.WaitingTuner", threads=2))
    assert tuner.proposers == 2
    assert tuner.propose(1).trials == [(0, {"x": 0})]
    waiting = [spawn("driver", tuner.propose, 1) for _ in range(2)]  # as the driver asks: a thread per proposal
    while sum(c[0] == "generate_parameters" for c in instance.calls) < 3:
        time.sleep(0.01)
    assert not any(p.done() for p in waiting)

    # When the first trial ends with its result
    tuner.finish([(0, TrialEnd("t0", TrialStatus.SUCCEEDED, 0.5))])

    # Then the tuner heard its result and its end meanwhile, and the waiting proposals return with theirs
    proposals = [p.result(timeout=10) for p in waiting]
    told = [(m, i) for m, i, _ in instance.calls if m != "generate_parameters"]
    assert told == [("receive_trial_result", 0), ("trial_end", 0)]  # NNI's order: the result, then the end
    assert sorted(p.trials[0] for p in proposals) == [(1, {"x": 1}), (2, {"x": 1})]
    threads = {m: {name.rpartition("-")[0] for n, _, name in instance.calls if n == m} for m, _, _ in instance.calls}
    assert threads == {
        "generate_parameters": {"tuner-propose"},
        "receive_trial_result": {"tuner-class"},
        "trial_end": {"tuner-class"},
    }
    tuner.close(ended=True)


def test_a_closed_class_leaves_no_thread_behind() -> None:
    instance = WaitingTuner()
    calls = Calls("tuner class t.WaitingTuner", threads=3)
    tuner = NniTuner(instance, {}, calls)
    tuner.propose(1)
    waiting = spawn("driver", tuner.propose, 2)  # ids 1 and 2: they wait for the result
    tuner.finish([(0, TrialEnd("t0", TrialStatus.SUCCEEDED, 0.5))])
    assert len(waiting.result(timeout=10).trials) == 2
    tuner.close(ended=True)
    deadline = time.monotonic() + 10
    while calls.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls.alive() == 0
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("tuner-class", "tuner-propose"))]


# A process whose tuner's proposal never returns, stopped as the tuner service stops a driver: the class closed,
# then the process exits. Python joins a ThreadPoolExecutor's threads at exit, so there it would never end.
NEVER_RETURNS = textwrap.dedent(
    """
    import threading
    from services.tuner.calls import Calls
    from services.tuner.nni_classes import NniTuner

    class Stuck:
        def update_search_space(self, search_space):
            pass

        def generate_parameters(self, parameter_id, **kwargs):
            threading.Event().wait()

    for threads in (1, 2):  # without multiThread and with it
        tuner = NniTuner(Stuck(), {}, Calls("tuner class t.Stuck", threads))
        proposing = threading.Thread(target=tuner.propose, args=(threads,), daemon=True)
        proposing.start()
        proposing.join(0.2)
        closing = threading.Thread(target=tuner.close, kwargs={"ended": True}, daemon=True)
        closing.start()
        closing.join(0.2)
    print("exiting")
    """
)


def test_a_proposal_that_never_returns_keeps_no_process_from_exiting() -> None:
    done = subprocess.run([sys.executable, "-c", NEVER_RETURNS], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, "exiting"), done.stderr
