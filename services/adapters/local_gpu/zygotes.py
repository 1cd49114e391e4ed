"""The keeper zygotes of this host: one per trial user, each forking the keepers of that user's trials.

A zygote (:class:`~.client.KeeperZygote`) becomes its user as it starts (``TRIALBUS_RUN_AS``) and
forks keepers as that user, so a trial never gets a keeper forked from another user's process.
One is started on its user's first trial (the adapter's start starts the one of an adapter whose
trials all run as one user, as before teams); at most :data:`MOST` run, the least recently used
one ends when another user needs one (its keepers run on). A zygote that cannot start leaves its
user's keepers to start cold, each as a new interpreter (logged once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from services.adapters.local_gpu import client
from services.adapters.local_gpu.users import TrialUser

#: The zygotes that run at most (one per trial user; each an interpreter, ~10 MB).
MOST = 8

log = logging.getLogger(__name__)


class Zygotes:
    """The zygotes by trial user (the module's docstring)."""

    def __init__(self, python: str, keeper_path: str, log_path: Path, env: Mapping[str, str], most: int = MOST) -> None:
        """``env``: every zygote's own environment (never the adapter's secrets), which its keepers
        keep, plus its user's ``TRIALBUS_RUN_AS``; ``log_path``: where zygotes write their errors."""
        self.python, self.keeper_path, self.log_path, self.env, self.most = python, keeper_path, log_path, env, most
        #: By user (its ``run_as``): the zygote and when it last forked; None: it could not start.
        self.running: dict[str, tuple[client.KeeperZygote | None, float]] = {}

    def start(self, user: TrialUser) -> client.KeeperZygote | None:
        """``user``'s zygote, started now when it is not running; None when it cannot start."""
        key = user.run_as()
        if key in self.running:
            zygote = self.running[key][0]
            self.running[key] = (zygote, time.monotonic())
            return zygote
        while len(self.running) >= self.most:
            oldest = min(self.running, key=lambda k: self.running[k][1])
            self._close(self.running.pop(oldest)[0])
        env = dict(self.env)
        if user.switch:
            env["TRIALBUS_RUN_AS"] = key
        zygote = client.KeeperZygote(self.python, self.keeper_path, self.log_path, env)
        try:
            zygote.start()
        except OSError as exc:  # each of its keepers starts cold
            log.warning("cannot start the keeper zygote of %s with %s (%s)", user.name, self.python, exc)
            self.running[key] = (None, time.monotonic())
            return None
        self.running[key] = (zygote, time.monotonic())
        return zygote

    def spawn(self, env: Mapping[str, str], user: TrialUser) -> int | None:
        """A keeper with ``env`` forked from ``user``'s zygote; its pid. None when the zygote cannot
        start (the caller starts the keeper cold). Raises OSError when the zygote fails twice."""
        zygote = self.start(user)
        return zygote.spawn(env) if zygote is not None else None

    def close(self) -> None:
        for zygote, _used in self.running.values():
            self._close(zygote)
        self.running.clear()

    @staticmethod
    def _close(zygote: client.KeeperZygote | None) -> None:
        if zygote is not None:
            zygote.close()
