"""One attempt on an SSH machine, as the remote adapter keeps it: the :class:`Trial` record.

Shared by every part of :class:`~services.adapters.remote.adapter.RemoteAdapter`; nothing here
does I/O. The attempt's directory on its machine is ``<root>/trials/<experiment>/<trial>-<attempt>/``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from contracts import subjects
from services.adapters.base import TrialHandle, TrialOutcome
from services.adapters.remote.checkpoints import TrialCheckpoint
from services.adapters.remote.client import Machine

#: Seconds a trial directory may wait for its keeper's first ``state.json`` (see local-gpu).
UNBORN_GRACE = 10.0


@dataclass(eq=False)
class Trial:
    handle: TrialHandle
    machine: Machine
    dir: str
    outcome: TrialOutcome | None = None
    status: dict = field(default_factory=dict)  # the agent's last word: state, alive, spool
    gpus: tuple[int, ...] = ()
    per_gpu: int = 1
    kill: asyncio.TimerHandle | None = field(default=None, repr=False)
    relaying: bool = False
    grace: float | None = None  # its seconds from SIGTERM to SIGKILL (None: the adapter's kill_grace)
    checkpoint: TrialCheckpoint | None = None  # its checkpoint directory's copies (checkpoints.py)

    @property
    def running(self) -> bool:
        return self.outcome is None

    @property
    def key(self) -> str:
        return subjects.dispatch_id(self.handle.trial_id, self.handle.attempt)
