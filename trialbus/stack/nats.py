"""The stack's broker: one nats-server, or a JetStream cluster of 3 or 5 as production runs
(``trialbus up --cluster N``, after k8s/base/nats/nats.conf).

One server (the default) is what ``trialbus up`` always ran: part ``nats-server`` on
``--nats-port``, its JetStream store in ``<data>/nats``, ``<data>/nats.conf``. A cluster is parts
``nats-server-1`` … ``nats-server-N``, each with that ``server_name``: the first on
``--nats-port``, the others on free ports, each with its own store in
``<data>/nats-cluster/<name>``, a ``cluster {}`` on a free loopback port with routes to all, and
the HTTP monitoring port whose ``/healthz`` says ready once it is part of a cluster with a
JetStream meta leader and has caught up with every stream it keeps a copy of.

Guarantees:

- Every server has the users of auth.conf (``<data>/nats-auth.conf``, included by each config).
- Routes require a password: any local user can reach a loopback port, and a route is trusted
  with every subject. It is new at every ``up``, and written only into the node configs, which
  are mode 0600 (nothing else holds it; a node restarted by the supervisor reads the same file).
- Each node's ports stay the same for the stack's life: a node restarted on its store rejoins
  under its name at the same addresses, as a follower of the leaders elected meanwhile.
- A cluster's stores are kept for the next ``up`` of the same size; another size is refused
  (a JetStream cluster remembers its peers).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trialbus import local
from trialbus.stack import credentials
from trialbus.stack.errors import StackError

#: The cluster's name (as k8s/base/nats/nats.conf's).
CLUSTER_NAME = "trialbus"
#: The user nodes route to each other as.
ROUTE_USER = "route"
#: Where a cluster keeps its nodes' JetStream stores, one folder per node.
CLUSTER_STORE = "nats-cluster"
#: A JetStream stream keeps at most 5 copies (``TRIALBUS_STREAM_REPLICAS`` allows 1 to 5).
MAX_SIZE = 5


def check_size(size: int) -> None:
    """1 (one server), or an odd number of servers from 3 to 5; else :class:`StackError` saying why."""
    if size == 1 or (size % 2 == 1 and 3 <= size <= MAX_SIZE):
        return
    if size < 1:
        raise StackError(f"--cluster {size}: a stack needs at least one nats-server (1, 3 or 5)")
    if size > MAX_SIZE:
        raise StackError(
            f"--cluster {size}: at most {MAX_SIZE} servers, as JetStream keeps at most {MAX_SIZE} "
            "copies of a stream; use 3 or 5"
        )
    raise StackError(
        f"--cluster {size}: a JetStream cluster needs an odd number of servers, 3 or more ({size} survive no "
        f"more lost servers than {size - 1}: a quorum is {size // 2 + 1} of {size}); use 1 (one server), 3 or 5"
    )


@dataclass(frozen=True)
class Node:
    """One nats-server of the stack."""

    #: Its ``server_name`` and the name of its part.
    name: str
    #: Where clients connect.
    port: int
    #: Where the other nodes route to it; None for a single server.
    route_port: int | None
    #: HTTP monitoring (``/healthz``); None for a single server, which is ready once its port answers.
    monitor_port: int | None
    #: Its JetStream store (nats-server keeps its files in ``<store>/jetstream``).
    store: Path
    #: Its configuration file.
    config: Path

    def url(self, host: str) -> str:
        return f"nats://{host}:{self.port}"

    def health(self, host: str) -> str | None:
        return f"http://{host}:{self.monitor_port}/healthz" if self.monitor_port is not None else None


@dataclass(frozen=True)
class Broker:
    """The stack's nats-servers, as chosen at the start of an ``up``."""

    host: str
    nodes: tuple[Node, ...]

    @property
    def clustered(self) -> bool:
        return len(self.nodes) > 1

    @property
    def urls(self) -> str:
        """Every node's client URL, comma-separated (``TRIALBUS_NATS_URL``): the first is ``--nats-port``."""
        return ",".join(node.url(self.host) for node in self.nodes)

    @property
    def replicas(self) -> int:
        """Copies of each stream, bucket and the code store: one per server."""
        return len(self.nodes)

    @property
    def ports(self) -> dict[str, int]:
        """The client ports of the nodes after the first (``--nats-port``), for the state file."""
        return {f"nats-{i}": node.port for i, node in enumerate(self.nodes[1:], start=2)}


def plan(host: str, nats_port: int, size: int, data_dir: Path, taken: Iterable[int] = ()) -> Broker:
    """The nodes of a broker of ``size`` servers under ``data_dir``: ``nats_port`` for the first,
    free ports (none of ``taken``) for the rest. Refuses a cluster store of another size."""
    check_size(size)
    if size == 1:
        return Broker(host, (Node("nats-server", nats_port, None, None, data_dir / "nats", data_dir / "nats.conf"),))
    names = [f"nats-server-{i}" for i in range(1, size + 1)]
    _check_store(data_dir / CLUSTER_STORE, names)
    ports = free_ports(host, 3 * size - 1, {nats_port, *taken})
    client, routes, monitors = [nats_port, *ports[: size - 1]], ports[size - 1 : 2 * size - 1], ports[2 * size - 1 :]
    nodes = tuple(
        Node(name, client[i], routes[i], monitors[i], data_dir / CLUSTER_STORE / name, data_dir / f"{name}.conf")
        for i, name in enumerate(names)
    )
    return Broker(host, nodes)


def _check_store(store: Path, names: list[str]) -> None:
    """A cluster's stores left by an ``up`` of another size: refused, naming the size to use."""
    found = sorted(p.name for p in store.glob("nats-server-*") if p.is_dir()) if store.is_dir() else []
    if found and found != sorted(names):
        sizes = [int(m.group(1)) for name in found if (m := re.fullmatch(r"nats-server-(\d+)", name))]
        was = max(sizes, default=len(found))
        raise StackError(
            f"{store} holds the JetStream stores of a cluster of {was} servers, which remembers its peers: run "
            f"`trialbus up --cluster {was}`, or delete {store} to start a new cluster (its experiments are lost)"
        )


def free_ports(host: str, count: int, avoid: set[int]) -> list[int]:
    """``count`` different ports nothing listens on now, none of ``avoid`` (the kernel's choice,
    every one held until all are chosen, so none comes twice)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            held.append(socket.socket())
            held[-1].bind((host, 0))
            if (port := held[-1].getsockname()[1]) not in avoid:
                ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


def write_configs(broker: Broker, data_dir: Path) -> None:
    """Each node's configuration beside ``<data>/nats-auth.conf`` (a copy of auth.conf, new at every
    start, so it is always this version's). All mode 0600, as every file of the stack's own: a
    cluster's hold the route password; the others say who may do what on the bus."""
    local.write_private(data_dir / "nats-auth.conf", credentials.auth_conf().read_text())
    header = "# Written by `trialbus up` at every start; edit compose.yaml or k8s/base/nats/auth.conf instead.\n"
    if not broker.clustered:
        node = broker.nodes[0]
        local.write_private(
            node.config,
            header + f"listen: {json.dumps(f'{broker.host}:{node.port}')}\n"
            f"jetstream {{ store_dir: {json.dumps(str(node.store))} }}\n"
            "include nats-auth.conf\n",
        )
        return
    password = credentials.nats_password()
    routes = ", ".join(json.dumps(f"nats://{ROUTE_USER}:{password}@{broker.host}:{n.route_port}") for n in broker.nodes)
    for node in broker.nodes:
        node.store.mkdir(parents=True, exist_ok=True)
        local.write_private(
            node.config,
            (
                header + "# Mode 0600: it holds the password the nodes route to each other with.\n"
                f"server_name: {json.dumps(node.name)}\n"
                f"listen: {json.dumps(f'{broker.host}:{node.port}')}\n"
                f"http: {json.dumps(f'{broker.host}:{node.monitor_port}')}\n"
                f"jetstream {{ store_dir: {json.dumps(str(node.store))} }}\n"
                "cluster {\n"
                f"  name: {CLUSTER_NAME}\n"
                f"  listen: {json.dumps(f'{broker.host}:{node.route_port}')}\n"
                f"  authorization {{ user: {ROUTE_USER}, password: {json.dumps(password)} }}\n"
                f"  routes: [{routes}]\n"
                "}\n"
                "include nats-auth.conf\n"
            ),
        )
