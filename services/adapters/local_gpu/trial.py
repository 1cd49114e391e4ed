"""One attempt on this host, as the local-gpu adapter keeps it: the :class:`Trial` record and
the names its directory ``<work_dir>/trials/<experiment>/<trial>-<attempt>/`` is built from.

Shared by every part of :class:`~services.adapters.local_gpu.adapter.LocalGpuAdapter`; nothing
here does I/O.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from services.adapters import trialdir
from services.adapters.base import TrialHandle, TrialOutcome
from services.adapters.local_gpu import client

#: Seconds a trial directory may wait for its keeper's first ``state.json`` before the trial
#: counts as failed: a restart caught the keeper starting (~15 ms), or it died starting.
UNBORN_GRACE = 10.0
#: Experiment and trial ids name directories: no separators, no dot-only names.
SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
#: The GPUs a trial holds, in its directory: ``{"indices": [0, 2], "perGpu": 1}``.
GPUS_FILE = trialdir.GPUS


@dataclass(eq=False)
class Trial:
    """One attempt on this host: its directory, its keeper, and its outcome once known."""

    handle: TrialHandle
    dir: str
    keeper: client.Keeper | None  # None: the keeper's pid is not known (yet)
    outcome: TrialOutcome | None = None
    kill: asyncio.TimerHandle | None = field(default=None, repr=False)
    gpus: tuple[int, ...] = ()  # the GPU indices it holds while it runs
    per_gpu: int = 1  # its maxTrialNumberPerGpu
    sid: int | None = None  # its session: processes on a GPU in it are ours
    template: str | None = None  # the key of the warm template it was forked from
    grace: float | None = None  # its seconds from SIGTERM to SIGKILL (None: the adapter's kill_grace)
    ended_notice: bool = False  # its keeper, kept for more trials, said this one ended (.ends)

    @property
    def running(self) -> bool:
        return self.outcome is None and (self.keeper is None or self.keeper.alive)


def dead_keeper(pid: int) -> client.Keeper:
    """The keeper ``pid`` found gone (or no longer ours): a handle that says so."""
    keeper = client.Keeper(pid)
    keeper.alive = False
    return keeper
