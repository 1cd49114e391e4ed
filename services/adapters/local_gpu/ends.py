"""The ends of trials whose keeper outlives them: a warm template keeps its keepers for trial after
trial (``services/trial_keeper/kept.py``), so a trial's end is no keeper's exit. Each such keeper, once its
trial's ``state.json`` says ``done``, sends the trial's directory to this socket (a UNIX datagram
socket in the abstract namespace, named in the keepers' ``TRIALBUS_DONE_SOCKET``); the adapter then
polls that trial at once. A notice only makes the adapter read the trial's ``state.json``: one that
names no trial of ours, or a trial not done, changes nothing. A keeper that cannot send it ends
instead, and its exit is noticed as any keeper's. Per notice O(1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)


class KeeperEnds:
    """The socket the adapter's kept keepers tell their trials' ends on; ``on_end(trial_dir)``."""

    def __init__(self, on_end: Callable[[str], None]) -> None:
        self.on_end = on_end
        #: As the keepers read it: ``@`` stands for the abstract namespace's leading NUL.
        self.address = f"@trialbus-keepers-{os.getpid()}-{secrets.token_hex(8)}"
        self._sock: socket.socket | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind("\0" + self.address[1:])
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # room for many ends at once (each is a few hundred bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._read)
        self._sock = sock

    def _read(self) -> None:
        while self._sock is not None:
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("reading the keepers' notices failed: %s", exc)
                return
            self.on_end(data.decode("utf-8", "surrogateescape"))

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
