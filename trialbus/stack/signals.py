"""Stop requests (SIGINT, SIGTERM, SIGHUP) recorded without locks, so a handler can never hang.

A Python signal handler runs in the main thread between two bytecodes of whatever it was
doing, possibly while that code holds a lock; a handler that takes the same lock (as
``threading.Event.set`` does) waits for itself forever. So the handler here only appends to
a list, which takes no lock, and :func:`signal.set_wakeup_fd` writes a byte to a pipe that
:meth:`StopSignals.wait` selects on, so a waiting supervisor wakes at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterator
from types import FrameType

#: What stops the stack: Ctrl-C, ``kill``/``trialbus down``, and a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """The stop requests received so far. The first asks for an ordered stop, the second
    for an immediate kill. Not installed (the default), it only sleeps in :meth:`wait`."""

    def __init__(self) -> None:
        self._received: list[int] = []
        self._pipe: tuple[int, int] | None = None

    @property
    def count(self) -> int:
        return len(self._received)

    @property
    def requested(self) -> bool:
        return bool(self._received)

    @property
    def hurried(self) -> bool:
        """A second request came: kill, do not wait."""
        return len(self._received) > 1

    @property
    def first(self) -> signal.Signals | None:
        return signal.Signals(self._received[0]) if self._received else None

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Record a request, as a signal would (for callers that stop the stack themselves)."""
        self._received.append(signum)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self._received.append(signum)  # list.append takes no lock; the wakeup fd does the waking

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Handle :data:`STOP_SIGNALS` inside the block (main thread only), then restore."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        previous = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}
        self._pipe = (read, write)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_fd)
            self._pipe = None
            os.close(read)
            os.close(write)

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, less if a signal arrives; whether any stop was requested."""
        if self._pipe is None:
            time.sleep(timeout)
            return self.requested
        read = self._pipe[0]
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([read], [], [], max(timeout, 0.0))
            if ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(read, 512):
                        pass
        return self.requested
