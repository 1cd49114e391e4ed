"""Where a remote trial runs: the machine with most free room, and its GPUs there.

GPU trials go to a machine whose GPUs can take them now — NNI's placement rules and the
scheduler that local-gpu uses (``services/adapters/gpu/``), one per machine, fed by
``nvidia-smi -q -x`` run by the machine's agent — least loaded machine first. Other
trials go to the machine with the fewest of our trials per CPU. A trial being started
counts as placed (its GPUs taken) from the moment it is chosen, so concurrent launches
never pick the same GPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol

from contracts import GpuStatus, TrialRequest, subjects
from services.adapters.errors import PermanentError, Waiting
from services.adapters.gpu import placement
from services.adapters.gpu.inventory import Inventory, parse_nvidia_smi_xml
from services.adapters.gpu.scheduler import GpuScheduler, Holding
from services.adapters.remote.client import Machine, MachineDown
from services.adapters.remote.settings import RemoteSettings

#: The keeper environment for the trial's GPUs, the GPU indices it holds, its maxTrialNumberPerGpu.
Where = tuple[dict[str, str], tuple[int, ...], int]


class Placed(Protocol):
    """What placement reads of a tracked trial (``trial.Trial``)."""

    machine: Machine
    gpus: tuple[int, ...]
    per_gpu: int
    status: dict

    @property
    def running(self) -> bool: ...

    @property
    def key(self) -> str: ...


class MachinePlacement:
    """Choose machines and GPUs for the remote adapter (module docstring)."""

    def __init__(
        self,
        settings: RemoteSettings,
        adapter: str,
        trials: Callable[[], Iterable[Placed]],
        capacity_freed: Callable[[], None],
    ) -> None:
        self.settings, self.adapter = settings, adapter
        self._trials, self._capacity_freed = trials, capacity_freed
        self.gpus: dict[str, GpuScheduler] = {}  # machine key → its scheduler (made on its first GPU trial)
        self._started: dict[str, asyncio.Future] = {}  # machine key → its scheduler's first inventory read
        #: machine key → trials being started there: (trial, attempt) → (GPUs, maxTrialNumberPerGpu)
        self._placing: dict[str, dict[tuple[str, int], tuple[tuple[int, ...], int]]] = {}

    async def stop(self) -> None:
        for scheduler in self.gpus.values():
            await scheduler.stop()

    async def forget(self, machine: Machine) -> None:
        self._started.pop(machine.key, None)
        if (scheduler := self.gpus.pop(machine.key, None)) is not None:
            await scheduler.stop()

    def busy(self) -> set[str]:
        """Machines with a trial being started."""
        return {key for key, placing in self._placing.items() if placing}

    @contextmanager
    def starting(self, machine: Machine, key: tuple[str, int], held: tuple[int, ...], per_gpu: int) -> Iterator[None]:
        """Count the trial as placed on the machine until it is tracked (or its start failed)."""
        placing = self._placing.setdefault(machine.key, {})
        placing[key] = (held, per_gpu)
        try:
            yield
        finally:
            placing.pop(key, None)

    def running(self, machine: Machine) -> int:
        """Our trials on the machine, those being started there included."""
        placing = len(self._placing.get(machine.key, ()))
        return placing + sum(1 for t in self._trials() if t.machine is machine and t.running)

    async def choose(self, request: TrialRequest, up: list[Machine], machines: list[Machine]) -> tuple[Machine, Where]:
        """The machine with most free room, its keeper environment for GPUs, the GPUs held."""
        if not request.trial_gpu_number:
            machine = min(up, key=lambda m: (self.running(m) / max(1, m.cpus), self.running(m)))
            return machine, (({} if request.trial_gpu_number is None else {"TRIALBUS_GPUS": ""}), (), 1)
        waits, nevers = [], []
        for machine in sorted(up, key=lambda m: self.running(m)):
            config = machine.config
            ask = placement.GpuAsk(
                trial=subjects.dispatch_id(request.trial_id, request.attempt),
                count=request.trial_gpu_number,
                indices=tuple(config.gpu_indices) if config.gpu_indices is not None else None,
                per_gpu=config.max_trial_number_per_gpu,
                use_active=config.use_active_gpu,
            )
            scheduler = await self.scheduler(machine)
            indices = [g.index for g in scheduler.inventory.gpus]
            if (why := placement.never_reason(ask, indices, host=machine.name)) is not None:
                error = scheduler.inventory.error
                nevers.append(why + (f" ({error})" if error and not indices else ""))
                continue
            try:
                held = scheduler.place(ask)
            except Waiting as exc:
                waits.append(f"{machine.name}: {exc}")
                continue
            where = {"TRIALBUS_GPUS": ",".join(map(str, held)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
            return machine, (where, held, ask.per_gpu)
        if waits or len(up) < len(machines):
            down = [m.down_reason() for m in machines if not m.up.is_set()]
            raise Waiting("; ".join(waits + down))
        raise PermanentError("no machine can ever run this trial: " + "; ".join(nevers))

    async def scheduler(self, machine: Machine) -> GpuScheduler:
        """The machine's GPU scheduler once its first inventory is read; concurrent callers
        all wait for that read (an empty inventory would fail their trials for good)."""
        started = self._started.get(machine.key)
        if started is None:
            scheduler = self.gpus[machine.key] = GpuScheduler(
                self.settings,
                self.adapter,
                lambda: self.holdings(machine),
                self._capacity_freed,
                read=lambda: self._inventory(machine),
            )
            started = self._started[machine.key] = asyncio.ensure_future(scheduler.start())
        try:
            await asyncio.shield(started)
        except Exception:
            if self._started.get(machine.key) is started:  # the next trial tries again
                self._started.pop(machine.key, None)
                self.gpus.pop(machine.key, None)
            raise
        return self.gpus[machine.key]

    async def _inventory(self, machine: Machine) -> Inventory:
        current = self.gpus[machine.key].inventory
        try:
            found = await machine.call("gpus", nvidiaSmi=self.settings.nvidia_smi)
        except MachineDown:
            return current  # as last seen: its trials hold their GPUs
        if found.get("error"):
            return Inventory("none", error=f"{machine.name}: {found['error']}")
        try:
            gpus = parse_nvidia_smi_xml(found["xml"])
        except ValueError as exc:
            return Inventory("none", error=f"{machine.name}: {exc}")
        sessions = {int(pid): sid for pid, sid in found.get("sessions", {}).items()}
        return Inventory("nvidia-smi", gpus, sessions=sessions)

    def holdings(self, machine: Machine) -> list[Holding]:
        placing = [
            Holding(subjects.dispatch_id(*key), held, per_gpu, None)
            for key, (held, per_gpu) in self._placing.get(machine.key, {}).items()
            if held
        ]
        return placing + [
            Holding(t.key, t.gpus, t.per_gpu, (t.status.get("state") or {}).get("pgid"))
            for t in self._trials()
            if t.machine is machine and t.gpus and t.running
        ]

    def describe(self, machine: Machine) -> list[GpuStatus]:
        scheduler = self.gpus.get(machine.key)
        return scheduler.describe()["gpus"] if scheduler else []
