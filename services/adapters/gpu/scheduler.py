"""GPU scheduling for one host: inventory, placement, reservations, status.

The local-gpu adapter runs one for its host; the remote adapter one per SSH machine,
whose inventory comes over SSH (``read``). It reads the inventory (``inventory.py``)
every ``gpu_refresh`` seconds, tells our trials'
processes on a GPU from foreign ones (by session: each trial runs in its own), and places
requests with ``placement.py`` against the inventory and what our running trials hold
(:class:`Holding`, supplied by the adapter). It keeps the requests that wait, to reserve
GPUs for the oldest once it has waited ``gpu_reserve_after`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from contracts import GpuStatus, PlatformStatus, TrialRequest, subjects
from services.adapters.errors import PermanentError, TransientError, Waiting
from services.adapters.gpu import inventory as gpus
from services.adapters.gpu import placement
from services.adapters.gpu.settings import GpuSettings
from services.common import platforms
from services.common.bus import Bus
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holding:
    """GPUs one of our running trials holds."""

    trial: str  # ``<trial>:<attempt>``
    gpus: tuple[int, ...]
    per_gpu: int  # its maxTrialNumberPerGpu
    session: int | None  # its session id: its processes on a GPU are ours


@dataclass
class _Waiter:
    ask: placement.GpuAsk
    since: float  # monotonic: first seen waiting
    seen: float  # monotonic: last offered


class GpuScheduler:
    """GPU placement for one adapter replica (see the module docstring)."""

    def __init__(
        self,
        settings: GpuSettings,
        adapter: str,
        holdings: Callable[[], Iterable[Holding]],
        capacity_freed: Callable[[], None],
        read: Callable[[], Awaitable[gpus.Inventory]] | None = None,
    ) -> None:
        """``read``: the inventory of another host (default: this host's, NVML or nvidia-smi)."""
        self.settings, self.adapter = settings, adapter
        self._holdings, self._capacity_freed = holdings, capacity_freed
        # Only local-gpu's settings choose a source (remote reads its machines over SSH: ``read``).
        source: gpus.ReaderSource = getattr(settings, "gpu_source", "auto")
        self._reader: gpus.GpuReader | None = None
        if read is None:
            reader = self._reader = gpus.GpuReader(source, settings.nvidia_smi)
            read = lambda: asyncio.to_thread(reader.read)  # noqa: E731
        self._read = read
        self.inventory = gpus.Inventory("none")
        #: GPU index → processes on it that are not ours: (pid, visible to us when read).
        self._foreign: dict[int, list[tuple[int, bool]]] = {}
        self._foreign_seen: dict[int, int] = {}  # foreign process counts at the last read
        self._waiters: dict[str, _Waiter] = {}
        self._task: asyncio.Task | None = None
        #: The other replicas' statuses, as of the last inventory read.
        self.peers: list[PlatformStatus] = []
        self.bus: Bus | None = None

    async def start(self) -> None:
        await self.read()
        listed = ", ".join(f"{g.index}: {g.name}" for g in self.inventory.gpus)
        log.info("GPUs from %s: %s", self.inventory.source, listed or f"none ({self.inventory.error})")
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        if self._reader is not None:
            await asyncio.to_thread(self._reader.close)

    # ------------------------------------------------------------------ placement

    @staticmethod
    def ask(request: TrialRequest) -> placement.GpuAsk | None:
        """The request's GPU needs; None when it asks for no GPU (``trialGpuNumber`` unset or 0)."""
        if not request.trial_gpu_number:
            return None
        service = request.training_service
        indices = getattr(service, "gpu_indices", None)
        return placement.GpuAsk(
            trial=subjects.dispatch_id(request.trial_id, request.attempt),
            count=request.trial_gpu_number,
            indices=tuple(indices) if indices is not None else None,
            per_gpu=getattr(service, "max_trial_number_per_gpu", 1),
            use_active=bool(getattr(service, "use_active_gpu", False)),
        )

    def place(self, ask: placement.GpuAsk) -> tuple[int, ...]:
        """The GPU indices the trial gets now; raises Waiting with the reason otherwise."""
        now = time.monotonic()
        views = self._views()
        result = placement.place(ask, placement.Snapshot(views, self._reservation(views, now)))
        if isinstance(result, placement.Never):  # the inventory changed since check_fits
            raise PermanentError(result.reason)
        if isinstance(result, placement.Wait):
            waiter = self._waiters.setdefault(ask.trial, _Waiter(ask, now, now))
            waiter.seen = now
            raise Waiting(result.reason)
        self._waiters.pop(ask.trial, None)
        return result.indices

    async def check_fits(self, ask: placement.GpuAsk, bus: Bus) -> None:
        """A trial this host can never run: left for a replica that can, or FAILED at once."""
        replica = self.settings.replica
        why = placement.never_reason(ask, [g.index for g in self.inventory.gpus], host=f"this host ({replica})")
        if why is None:
            return
        if not self.inventory.gpus and self.inventory.error:
            why += f": {self.inventory.error}"
        try:
            others = [s for s in await platforms.statuses(bus, self.adapter) if s.replica != replica]
        except Exception as exc:  # cannot tell: let it come round again
            raise TransientError(f"{why}; cannot read the other replicas' GPUs ({exc})", delay=2.0) from exc
        able = [s.replica for s in others if placement.never_reason(ask, [g.index for g in s.gpus]) is None]
        if able:
            raise TransientError(f"{why}; left for replica {', '.join(able)}", delay=0.2)
        if others:
            counts = ", ".join(f"{s.replica}: {len(s.gpus)}" for s in others)
            why += f"; no other {self.adapter} replica has enough either (GPUs by replica: {counts})"
        raise PermanentError(why)

    def room_elsewhere(self, ask: placement.GpuAsk) -> str | None:
        """A peer replica whose last status shows enough idle GPUs for the trial now."""
        for peer in self.peers:
            idle = [
                g
                for g in peer.gpus
                if (ask.indices is None or g.index in ask.indices)
                and not g.trials
                and (ask.use_active or not g.foreign_processes)
            ]
            if len(idle) >= ask.count:
                return peer.replica
        return None

    def _views(self) -> list[placement.GpuView]:
        held: dict[int, list[int]] = defaultdict(list)
        for holding in self._holdings():
            for index in holding.gpus:
                held[index].append(holding.per_gpu)
        return [
            placement.GpuView(
                g.index, tuple(held[g.index]), self._foreign_now(g.index), g.memory_used_mib, g.gpu_util or 0
            )
            for g in self.inventory.gpus
        ]

    def _foreign_now(self, index: int) -> int:
        """Foreign processes on a GPU as of now: one seen at the read that has exited since
        is gone; one never visible to us (another PID namespace) still counts."""
        return sum(1 for pid, visible in self._foreign.get(index, ()) if not visible or _alive(pid))

    def _reservation(self, views: list[placement.GpuView], now: float) -> dict[int, str]:
        """GPUs held back for the request that has waited longest, once it waited ``gpu_reserve_after``."""
        stale = now - max(5.0, 3 * self.settings.wait_hold)  # not offered lately: taken elsewhere, or canceled
        for key in [k for k, w in self._waiters.items() if w.seen < stale]:
            del self._waiters[key]
        due = [w for w in self._waiters.values() if now - w.since >= self.settings.gpu_reserve_after]
        if not due:
            return {}
        oldest = min(due, key=lambda w: w.since).ask
        return dict.fromkeys(placement.reserve(oldest, views), oldest.trial)

    # ------------------------------------------------------------------ inventory

    async def read(self) -> None:
        """Read the inventory now; say so when a foreign process left a GPU."""
        inventory = await self._read()
        ours = {h.session for h in self._holdings() if h.session}
        foreign: dict[int, list[tuple[int, bool]]] = {}
        for gpu in inventory.gpus:
            for process in gpu.processes:
                if inventory.sessions is not None:  # another host's: sessions as it saw them
                    if inventory.sessions.get(process.pid) in ours:
                        continue
                    visible = False  # its exit shows at the next read, not through a local pid
                else:
                    try:
                        if os.getsid(process.pid) in ours:
                            continue
                        visible = True
                    except ProcessLookupError:  # not in our PID namespace (or exited just now)
                        visible = False
                    except PermissionError:
                        visible = True
                foreign.setdefault(gpu.index, []).append((process.pid, visible))
        self.inventory, self._foreign = inventory, foreign
        now = {i: self._foreign_now(i) for i in foreign}
        if any(now.get(i, 0) < n for i, n in self._foreign_seen.items()):
            self._capacity_freed()  # compared with the last read: a process that exited in between counts
        self._foreign_seen = now

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.gpu_refresh)
            try:
                await self.read()
                if self.bus is not None:
                    found = await platforms.statuses(self.bus, self.adapter)
                    self.peers = [s for s in found if s.replica != self.settings.replica]
            except Exception:  # never stop refreshing
                log.exception("cannot read the GPU inventory or the other replicas' status")

    def describe(self) -> dict:
        """The GPU fields of the replica's :class:`~contracts.PlatformStatus`."""
        held: dict[int, list[str]] = defaultdict(list)
        for holding in self._holdings():
            for index in holding.gpus:
                held[index].append(holding.trial)
        return {
            "gpu_source": self.inventory.source,
            "gpu_error": self.inventory.error,
            "gpus": [
                GpuStatus(
                    index=g.index,
                    uuid=g.uuid,
                    name=g.name,
                    memory_total_mib=g.memory_total_mib,
                    memory_used_mib=g.memory_used_mib,
                    gpu_util=g.gpu_util,
                    memory_util=g.memory_util,
                    trials=held[g.index],
                    foreign_processes=self._foreign_now(g.index),
                )
                for g in self.inventory.gpus
            ],
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
