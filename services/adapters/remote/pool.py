"""The remote adapter's pool of machines: one connection per machine and credentials, made on
first use, checked for an experiment, closed when idle, and described in the replica's status.

The pool also keeps what waits for a machine that is away: the trial directories given up on
while it was unreachable (killed and reported when it is back) and those released meanwhile
(reported when it is back); :meth:`MachinePool.settle` does both. What else a machine that comes
back needs (adopting its trials, reading its GPUs) is the adapter's, told through ``on_up``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Iterable, ValuesView

from contracts import TrainingService
from contracts.experiment import RemoteConfig, RemoteMachineConfig
from services.adapters.errors import PermanentError, TransientError
from services.adapters.keeper import Bundle
from services.adapters.remote.client import Machine, machine_key
from services.adapters.remote.placement import MachinePlacement
from services.adapters.remote.settings import RemoteSettings
from services.adapters.remote.trial import TrialTable

log = logging.getLogger(__name__)

#: Seconds a machine's connection stays open with no trial on it and no experiment asking.
IDLE_CLOSE = 600.0


class MachinePool:
    """The remote adapter's pool of machines (the module's docstring)."""

    def __init__(
        self,
        *,
        settings: RemoteSettings,
        bundle: Bundle,
        trials: TrialTable,
        placement: MachinePlacement,
        on_event: Callable[[Machine, dict], None],
        on_up: Callable[[Machine], None],
    ) -> None:
        """``trials`` and ``placement`` say which machines are busy; ``on_event`` hears every
        machine's agent events, ``on_up`` of every machine that is (back) up."""
        self.settings, self.bundle = settings, bundle
        self._trials, self._placement = trials, placement
        self._on_event, self._on_up = on_event, on_up
        self.machines: dict[str, Machine] = {}
        self.abandoned: dict[str, set[str]] = {}  # machine → trial dirs given up on: kill when back
        self.unreported: dict[str, set[str]] = {}  # machine → trial dirs to mark reported when back
        self.wanted: dict[str, set[str]] = {}  # running experiment → the keys of its machines
        self.pools: dict[str, str] = {}  # running experiment → its trainingService.pool, if it names one

    def machine(self, config: RemoteMachineConfig) -> Machine:
        """The pool's connection for a machine with these credentials (made on first use)."""
        key = machine_key(config)
        machine = self.machines.get(key)
        if machine is None:
            machine = self.machines[key] = Machine(config, self.settings, self.bundle, self._on_event, self._on_up)
            machine.start()
        machine.last_used = time.monotonic()
        return machine

    def values(self) -> ValuesView[Machine]:
        return self.machines.values()

    def of(self, ref: str) -> Machine | None:
        """The machine of a trial handle's ``ref`` (``<machine key>#<trial dir>``), if connected."""
        return self.machines.get(ref.split("#", 1)[0]) if "#" in ref else None

    async def connect(self, configs: Iterable[RemoteMachineConfig]) -> list[Machine]:
        """The machines of a ``machineList``, each after its first connection attempt."""
        machines = [self.machine(config) for config in configs]
        await asyncio.gather(*(m.ready(wait=0) for m in machines))
        return machines

    def want(self, experiment_id: str, service: RemoteConfig | None) -> None:
        """A running experiment uses these machines (None: it does not run any more)."""
        if service is None:
            self.wanted.pop(experiment_id, None)
            self.pools.pop(experiment_id, None)
        else:
            self.wanted[experiment_id] = {machine_key(m) for m in service.machine_list}
            if service.pool:
                self.pools[experiment_id] = service.pool

    async def close(self) -> None:
        await asyncio.gather(*(m.close() for m in self.machines.values()), return_exceptions=True)

    async def prune(self) -> None:
        """Close the connections no trial and no experiment has needed for ``IDLE_CLOSE`` seconds."""
        busy = self._trials.machine_keys() | set(self.abandoned) | set(self.unreported)
        busy |= self._placement.busy()
        idle = [m for m in self.machines.values() if m.key not in busy and time.monotonic() - m.last_used > IDLE_CLOSE]
        for machine in idle:
            del self.machines[machine.key]
            await self._placement.forget(machine)
            await machine.close()
            log.info("closed the idle connection to %s", machine.name)

    # ------------------------------------------------------------------ checks

    async def check(self, service: TrainingService) -> list[str]:
        """Connect to every machine (or reuse the connection) and find its ``python3``."""
        if not isinstance(service, RemoteConfig):
            return [f"the remote adapter cannot run platform {service.platform!r}"]
        machines = await self.connect(service.machine_list)
        problems = [m.down_reason() for m in machines if not m.up.is_set()]
        for machine in machines:
            if machine.up.is_set():
                try:
                    await self.probe(machine, machine.config.python_path)
                except (PermanentError, TransientError) as exc:
                    problems.append(str(exc))
        return problems

    async def probe(self, machine: Machine, python_path: str | None) -> dict:
        """The machine's ``python3`` for this ``pythonPath`` (asked once); PermanentError if none."""
        probe = machine.probes.get(python_path)
        if probe is None:
            probe = await machine.call("probe", pythonPath=python_path, timeout=90)
            if not probe.get("python"):
                where = f"with pythonPath {python_path}" if python_path else "on its PATH (set pythonPath)"
                raise PermanentError(f"machine {machine.name} has no python3 {where}")
            found = probe.get("where") or ""
            if python_path and not found.startswith(python_path.rstrip("/") + "/"):
                raise PermanentError(
                    f"machine {machine.name} has no python3 in pythonPath {python_path} (trials would run {found})"
                )
            machine.probes[python_path] = probe
        return probe

    def give_up_if_all_down(self, machines: list[Machine]) -> None:
        """PermanentError when no machine can be used, or none was reachable for ``unreachable_timeout``."""
        if all(m.permanent for m in machines):
            raise PermanentError("no machine can be used: " + "; ".join(m.down_reason() for m in machines))
        now, timeout = time.monotonic(), self.settings.unreachable_timeout
        if all(m.down_since is not None and now - m.down_since > timeout for m in machines):
            raise PermanentError(
                f"no machine reachable for {timeout:g}s: " + "; ".join(m.down_reason() for m in machines)
            )

    # ------------------------------------------------------------------ what waits for a machine

    def kill_when_back(self, machine: Machine, trial_dir: str) -> None:
        self.abandoned.setdefault(machine.key, set()).add(trial_dir)

    def report_when_back(self, machine: Machine, trial_dir: str) -> None:
        self.unreported.setdefault(machine.key, set()).add(trial_dir)

    async def settle(self, machine: Machine) -> None:
        """The machine is back: kill and report the trials given up on, report those released."""
        for trial_dir in self.abandoned.pop(machine.key, set()):
            await machine.call("signal", dir=trial_dir, signal=signal.SIGKILL, group=True)
            await machine.call("report", dir=trial_dir)
        for trial_dir in self.unreported.pop(machine.key, set()):
            await machine.call("report", dir=trial_dir)

    # ------------------------------------------------------------------ status

    def describe(self) -> dict:
        """The machines running experiments use, and those holding trials here: a machine of
        finished experiments only (kept open a while, or waiting to clean up) is not shown."""
        shown = set().union(*self.wanted.values(), self._trials.machine_keys())
        pools: dict[str, set[str]] = {}  # machine key → the pools experiments put it in: O(experiments × machines)
        for experiment_id, pool in self.pools.items():
            for key in self.wanted.get(experiment_id, ()):
                pools.setdefault(key, set()).add(pool)
        machines = []
        for machine in self.machines.values():
            if machine.key not in shown:
                continue
            machines.append(
                {
                    "name": machine.name,
                    "up": machine.up.is_set(),
                    "error": machine.error,
                    "cpus": machine.cpus,
                    "running": self._placement.running(machine),
                    "gpus": self._placement.describe(machine),
                    "pools": sorted(pools.get(machine.key, ())),
                }
            )
        return {"machines": machines}
