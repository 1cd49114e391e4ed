"""Which GPUs of this host a trial gets: NNI's local rules, without its stalls.

Pure functions over a snapshot (no I/O), so every rule is unit-tested with injected
inventories. The adapter calls :func:`place` for a trial with ``trialGpuNumber`` ≥ 1:

- A GPU is a **candidate** when it is in the trial's ``gpuIndices`` (all GPUs when unset),
  holds fewer of our trials than ``maxTrialNumberPerGpu`` allows (the smallest limit among
  the trial and the trials already there, so sharing never exceeds what any of them
  allowed), and — unless ``useActiveGpu`` — runs no process that is not one of our trials
  (NNI counts any process, GUI ones included), and is not reserved for another trial.
- The trial gets ``trialGpuNumber`` candidates, least loaded first (our trials, then
  other processes, memory used, utilisation, index). It may take every GPU of the host.
- :class:`Never` when this host can never run it (fewer GPUs, or ``gpuIndices`` naming
  none of them); :class:`Wait` with what it waits for otherwise.

**Starvation.** Requests are retried in arrival order, and a request that has waited
``reserve_after`` seconds gets a reservation (:func:`reserve`): the ``trialGpuNumber`` GPUs
with the fewest of our trials become non-candidates for everyone else. No trial starts on
a reserved GPU, so the load on the reserved set only falls as trials end, and the waiting
trial starts once it reaches zero; smaller trials keep using the other GPUs meanwhile (no
head-of-line blocking). One reservation at a time: the oldest waiter's. The guarantee
needs trials to end; a foreign process that never leaves a GPU (with ``useActiveGpu``
false) is outside it, and the wait message names that GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuAsk:
    """What a trial asks of the host's GPUs (the experiment's config, NNI names)."""

    trial: str  # ``<trial>:<attempt>``: the key of holdings and reservations
    count: int  # trialGpuNumber, ≥ 1
    indices: tuple[int, ...] | None = None  # gpuIndices; None = every GPU
    per_gpu: int = 1  # maxTrialNumberPerGpu
    use_active: bool = False  # useActiveGpu


@dataclass(frozen=True)
class GpuView:
    """One GPU as placement sees it: what the inventory says and what we run there."""

    index: int
    #: ``maxTrialNumberPerGpu`` of each of our trials on it.
    ours: tuple[int, ...] = ()
    #: Processes on it that are not our trials (compute or graphics).
    foreign: int = 0
    memory_used_mib: int = 0
    gpu_util: int = 0


@dataclass(frozen=True)
class Placed:
    indices: tuple[int, ...]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.indices))


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class Never:
    reason: str


@dataclass(frozen=True)
class Snapshot:
    """The host's GPUs and the reservation in force (GPU index → trial key)."""

    gpus: Sequence[GpuView]
    reserved: Mapping[int, str] = field(default_factory=dict)


def eligible(ask: GpuAsk, indices: Sequence[int]) -> list[int]:
    """The host's GPUs the trial may ever use (``gpuIndices`` ∩ the host's)."""
    return [i for i in indices if ask.indices is None or i in ask.indices]


def never_reason(ask: GpuAsk, indices: Sequence[int], host: str = "this host") -> str | None:
    """Why ``host`` (with GPUs ``indices``) can never run the trial; None when it can."""
    usable = eligible(ask, indices)
    if len(usable) >= ask.count:
        return None
    have = f"{len(indices)} GPU{'s' if len(indices) != 1 else ''}" if indices else "no GPU"
    if ask.indices is not None:
        missing = sorted(set(ask.indices) - set(indices))
        have += f" ({len(usable)} of them in gpuIndices {list(ask.indices)}"
        have += f"; no GPU {', '.join(map(str, missing))})" if missing else ")"
    return f"trialGpuNumber is {ask.count} but {host} has {have}"


def _busy(ask: GpuAsk, gpu: GpuView, reserved: Mapping[int, str]) -> str | None:
    limit = min((ask.per_gpu, *gpu.ours))
    if len(gpu.ours) >= limit:
        return f"GPU {gpu.index} runs {len(gpu.ours)} trial(s), the most maxTrialNumberPerGpu {limit} allows"
    if gpu.foreign and not ask.use_active:
        return f"GPU {gpu.index} runs {gpu.foreign} process(es) that are not trials (useActiveGpu is false)"
    owner = reserved.get(gpu.index)
    if owner is not None and owner != ask.trial:
        return f"GPU {gpu.index} is reserved for trial {owner.rpartition(':')[0]}, which has waited longest"
    return None


def _order(gpu: GpuView) -> tuple:
    return (len(gpu.ours), gpu.foreign, gpu.memory_used_mib, gpu.gpu_util, gpu.index)


def place(ask: GpuAsk, snapshot: Snapshot) -> Placed | Wait | Never:
    """The GPUs the trial gets now, or why it must wait, or why it never can here."""
    if (why := never_reason(ask, [g.index for g in snapshot.gpus])) is not None:
        return Never(why)
    usable = set(eligible(ask, [g.index for g in snapshot.gpus]))
    free: list[GpuView] = []
    busy: list[str] = []  # why each usable GPU is not free
    for gpu in snapshot.gpus:
        if gpu.index in usable:
            if reason := _busy(ask, gpu, snapshot.reserved):
                busy.append(reason)
            else:
                free.append(gpu)
    if len(free) >= ask.count:
        chosen = sorted(free, key=_order)[: ask.count]
        return Placed(tuple(sorted(g.index for g in chosen)))
    plural = "s" if ask.count != 1 else ""
    return Wait(f"waiting for {ask.count} free GPU{plural} ({len(free)} free now): " + "; ".join(busy))


def reserve(ask: GpuAsk, gpus: Sequence[GpuView]) -> tuple[int, ...]:
    """The GPUs held back for a trial that waited too long: the ``count`` eligible ones
    with the fewest of our trials (they drain soonest), lowest index on a tie; GPUs that
    a foreign process blocks come last."""
    usable = set(eligible(ask, [g.index for g in gpus]))

    def drains_first(gpu: GpuView) -> tuple:  # a foreign process may never leave: last resort
        return (bool(gpu.foreign) and not ask.use_active, len(gpu.ours), gpu.index)

    candidates = sorted((g for g in gpus if g.index in usable), key=drains_first)
    return tuple(sorted(g.index for g in candidates[: ask.count]))
