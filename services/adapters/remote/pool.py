"""The remote adapter's pool of machines: one connection per machine and credentials, made on
first use, checked for an experiment, settled when a machine is (back) up, closed when idle,
and described in the replica's status.

A machine that comes back gets what waited for it: the trials given up on while it was away are
killed and reported, those released meanwhile reported, trials it runs that this adapter does not
know are adopted, and the ones it knows read at once. Part of
:class:`~services.adapters.remote.adapter.RemoteAdapter` (a mixin: it uses the adapter's
``machines``, ``trials``, ``placement`` and bookkeeping).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING

from contracts import TrainingService
from contracts.experiment import RemoteConfig, RemoteMachineConfig
from services.adapters.errors import PermanentError, TransientError
from services.adapters.remote.client import AgentError, Machine, MachineDown, machine_key

if TYPE_CHECKING:
    from services.adapters.remote.adapter import RemoteAdapter

log = logging.getLogger(__name__)

#: Seconds a machine's connection stays open with no trial on it and no experiment asking.
IDLE_CLOSE = 600.0


class MachinePool:
    """The remote adapter's pool of machines (the module's docstring)."""

    def machine(self: RemoteAdapter, config: RemoteMachineConfig) -> Machine:
        """The pool's connection for a machine with these credentials (made on first use)."""
        key = machine_key(config)
        machine = self.machines.get(key)
        if machine is None:
            machine = self.machines[key] = Machine(config, self.settings, self.bundle, self._on_agent_event,
                                                   self._on_up)  # fmt: skip
            machine.start()
        machine.last_used = time.monotonic()
        return machine

    async def _prune(self: RemoteAdapter) -> None:
        """Close the connections no trial and no experiment has needed for ``IDLE_CLOSE`` seconds."""
        busy = {t.machine.key for t in self.trials.values()} | set(self.abandoned) | set(self.unreported)
        busy |= self.placement.busy()
        idle = [m for m in self.machines.values()
                if m.key not in busy and time.monotonic() - m.last_used > IDLE_CLOSE]  # fmt: skip
        for machine in idle:
            del self.machines[machine.key]
            await self.placement.forget(machine)
            await machine.close()
            log.info("closed the idle connection to %s", machine.name)

    async def check(self: RemoteAdapter, service: TrainingService) -> list[str]:
        """Connect to every machine (or reuse the connection) and find its ``python3``."""
        if not isinstance(service, RemoteConfig):
            return [f"the remote adapter cannot run platform {service.platform!r}"]
        machines = [self.machine(config) for config in service.machine_list]
        await asyncio.gather(*(m.ready(wait=0) for m in machines))
        problems = [m.down_reason() for m in machines if not m.up.is_set()]
        for machine in machines:
            if machine.up.is_set():
                try:
                    await self._probe(machine, machine.config.python_path)
                except (PermanentError, TransientError) as exc:
                    problems.append(str(exc))
        return problems

    def _give_up_if_all_down(self: RemoteAdapter, machines: list[Machine]) -> None:
        if all(m.permanent for m in machines):
            raise PermanentError("no machine can be used: " + "; ".join(m.down_reason() for m in machines))
        now, timeout = time.monotonic(), self.settings.unreachable_timeout
        if all(m.down_since is not None and now - m.down_since > timeout for m in machines):
            raise PermanentError(
                f"no machine reachable for {timeout:g}s: " + "; ".join(m.down_reason() for m in machines)
            )

    def _on_up(self: RemoteAdapter, machine: Machine) -> None:
        """A machine is (back) up: settle what waited for it, look for trials, wake waiters."""
        asyncio.ensure_future(self._reconnected(machine))

    async def _reconnected(self: RemoteAdapter, machine: Machine) -> None:
        try:
            for trial_dir in self.abandoned.pop(machine.key, set()):
                await machine.call("signal", dir=trial_dir, signal=signal.SIGKILL, group=True)
                await machine.call("report", dir=trial_dir)
            for trial_dir in self.unreported.pop(machine.key, set()):
                await machine.call("report", dir=trial_dir)
            found = await machine.call("list")
            for entry in found:
                key = (entry["trial"], entry["attempt"])
                if key not in self.trials:
                    trial = self._adopt_entry(machine, entry)
                    self.found(trial.handle)
            ours = [t for t in self.trials.values() if t.machine is machine and t.running]
            if ours:
                await self._refresh(machine, ours)
            if (scheduler := self.placement.gpus.get(machine.key)) is not None:
                await scheduler.read()
        except (MachineDown, AgentError) as exc:
            log.warning("cannot settle %s after reconnecting: %s", machine.name, exc)
        self.capacity_freed()
        self.notify()

    def describe(self: RemoteAdapter) -> dict:
        """The machines running experiments use, and those holding trials here: a machine of
        finished experiments only (kept open a while, or waiting to clean up) is not shown."""
        shown = set().union(*self.wanted.values(), (t.machine.key for t in self.trials.values()))
        machines = []
        for machine in self.machines.values():
            if machine.key not in shown:
                continue
            machines.append({
                "name": machine.name, "up": machine.up.is_set(), "error": machine.error, "cpus": machine.cpus,
                "running": self.placement.running(machine), "gpus": self.placement.describe(machine),
            })  # fmt: skip
        return {"machines": machines}
