"""``trialbus up``, ``down`` and ``status``: the whole stack as local processes, supervised.

- :mod:`.compose`: compose.yaml read once: the services, their settings, their ``restart:``.
- :mod:`.policy`: restart policies, back-off and crash loops (pure logic).
- :mod:`.options`: what ``up`` is asked for; the nats-server binary.
- :mod:`.credentials`: the stack's secrets under the data dir, and the NATS users they open.
- :mod:`.nats`: the nats-servers: one, or a JetStream cluster of 3 or 5 (``--cluster``), and their configs.
- :mod:`.parts`: starting and stopping the parts in order (the nats-servers, then the services).
- :mod:`.supervisor`: ``up``'s loop: restarts what dies, stops in order on a signal.
- :mod:`.signals`: stop requests recorded without locks (a handler that cannot hang).
- :mod:`.trials`: what a user's stop does to running trials.
- :mod:`.state`: the state file and lock under the data dir, and a killed supervisor's leftovers.
- :mod:`.processes`: processes by pid *and* start time, stopped by identity; who holds a port.
- :mod:`.probes`: whether a part is ready (its port, its ``/healthz``).
- :mod:`.control`: ``status`` and ``down`` from another terminal.
- :mod:`.commands`: the three commands of the CLI.

The names below load on first use: the CLI imports :mod:`.commands` for every command, and must
not read compose.yaml or load the services' code to print its help.
"""

from importlib import import_module
from typing import Any

#: Each exported name and the module that defines it.
_WHERE = {
    "LOCAL": "compose",
    "SERVICES": "compose",
    "ServiceDef": "compose",
    "compose_services": "compose",
    "StackError": "errors",
    "StackOptions": "options",
    "nats_server_binary": "options",
    "Stack": "parts",
    "RestartPolicy": "policy",
    "run": "supervisor",
}

__all__ = [
    "LOCAL",
    "SERVICES",
    "RestartPolicy",
    "ServiceDef",
    "Stack",
    "StackError",
    "StackOptions",
    "compose_services",
    "nats_server_binary",
    "run",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'trialbus.stack' has no attribute {name!r}")
    return getattr(import_module(f"trialbus.stack.{_WHERE[name]}"), name)
