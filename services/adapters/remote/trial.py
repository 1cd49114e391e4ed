"""The attempts on SSH machines as the remote adapter keeps them: the :class:`Trial` record, and
:class:`TrialTable`, the replica's attempts by trial and attempt.

Shared by every part of :class:`~services.adapters.remote.adapter.RemoteAdapter`; nothing here
does I/O. The attempt's directory on its machine is ``<root>/trials/<experiment>/<trial>-<attempt>/``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, ValuesView
from dataclasses import dataclass, field
from datetime import datetime

from contracts import subjects
from services.adapters.base import TrialHandle, TrialOutcome, find_attempt
from services.adapters.remote.checkpoints import TrialCheckpoint
from services.adapters.remote.client import Machine

#: Seconds a trial directory may wait for its keeper's first ``state.json`` (see local-gpu).
UNBORN_GRACE = 10.0


@dataclass(eq=False)
class Trial:
    handle: TrialHandle
    machine: Machine
    dir: str
    checkpoint: TrialCheckpoint  # its checkpoint directory's copies (checkpoints.py)
    outcome: TrialOutcome | None = None
    status: dict = field(default_factory=dict)  # the agent's last word: state, alive, spool
    gpus: tuple[int, ...] = ()
    per_gpu: int = 1
    kill: asyncio.TimerHandle | None = field(default=None, repr=False)
    relaying: bool = False
    grace: float | None = None  # its seconds from SIGTERM to SIGKILL (None: the adapter's kill_grace)

    @property
    def running(self) -> bool:
        return self.outcome is None

    @property
    def key(self) -> str:
        return subjects.dispatch_id(self.handle.trial_id, self.handle.attempt)


class TrialTable:
    """The attempts this replica launched or adopted and has not released, by ``(trial, attempt)``."""

    def __init__(self, follow: Callable[[TrialHandle, Machine], TrialCheckpoint]) -> None:
        """``follow``: start following a new attempt's checkpoint directory (``CheckpointSync.track``)."""
        self._follow = follow
        self._trials: dict[tuple[str, int], Trial] = {}

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self._trials

    def __iter__(self) -> Iterator[Trial]:
        return iter(self._trials.values())

    def values(self) -> ValuesView[Trial]:
        return self._trials.values()

    def get(self, key: tuple[str, int]) -> Trial | None:
        return self._trials.get(key)

    def pop(self, key: tuple[str, int]) -> Trial | None:
        return self._trials.pop(key, None)

    def track(
        self, experiment_id: str, trial_id: str, attempt: int, machine: Machine, trial_dir: str, started: datetime
    ) -> Trial:
        """Keep a new attempt, its checkpoint directory followed."""
        handle = TrialHandle(experiment_id, trial_id, attempt, ref=f"{machine.key}#{trial_dir}", start_time=started)
        trial = self._trials[(trial_id, attempt)] = Trial(handle, machine, trial_dir, self._follow(handle, machine))
        return trial

    def find(self, handle: TrialHandle) -> Trial:
        """The attempt's trial; PermanentError when this replica does not track it."""
        return find_attempt(self._trials, handle)

    def running_on(self, machine: Machine) -> list[Trial]:
        return [t for t in self._trials.values() if t.machine is machine and t.running]

    def machine_keys(self) -> set[str]:
        """The machines holding one of the attempts."""
        return {t.machine.key for t in self._trials.values()}
