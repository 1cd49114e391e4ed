"""Stop requests as ``trialbus up`` records them: a signal wakes the waiting supervisor at once,
a second one means hurry, and the previous handlers come back afterwards."""

from __future__ import annotations

import os
import signal
import threading
import time

from trialbus.stack.signals import StopSignals


def send_later(signum: int, after: float) -> threading.Timer:
    timer = threading.Timer(after, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


def test_a_signal_wakes_the_waiting_supervisor_at_once_and_a_second_one_hurries():
    signals = StopSignals()
    previous = signal.getsignal(signal.SIGTERM)
    with signals.installed():
        send_later(signal.SIGTERM, 0.2)
        began = time.monotonic()
        assert signals.wait(10) is True
        assert time.monotonic() - began < 2, "woken by the signal, not by the timeout"
        assert (signals.count, signals.first, signals.hurried) == (1, signal.SIGTERM, False)

        send_later(signal.SIGINT, 0.1)
        signals.wait(10)
        assert signals.hurried and signals.count == 2
    assert signal.getsignal(signal.SIGTERM) is previous


def test_without_a_signal_wait_sleeps_its_timeout():
    signals = StopSignals()
    with signals.installed():
        began = time.monotonic()
        assert signals.wait(0.3) is False
        assert time.monotonic() - began >= 0.25
