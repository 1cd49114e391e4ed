"""One SSH machine as the remote adapter sees it: a connection and the agent on it.

:class:`Machine` keeps one multiplexed SSH connection (asyncssh) per ``user@host:port`` and
reconnects it with back-off when it drops. On each connection it makes sure Trialbus's
files are on the machine (``<root>/bin/<hash>/``: ``agent.py`` and its helpers,
``trial_keeper.py`` and the ``nni`` shim, uploaded over SFTP once per content hash), then runs
the agent (``agent.py``) on an exec channel and talks JSON lines to it (:meth:`Machine.call`).
Files go to and from the machine over SFTP (its ``files``, a :class:`~.transfers.Transfers`):
Trialbus's files, code snapshots (once per machine and hash), checkpoint archives.

Host keys are checked against ``known_hosts``: an unknown host is refused unless the
operator asked for trust on first use, and a changed key is always refused. Credentials
(password, key, passphrase) never appear in a message: errors name the machine by
``user@host:port`` only (``machine_errors.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh
from pydantic import SecretStr

from contracts.experiment import RemoteMachineConfig
from services.adapters import trialdir
from services.adapters.keeper import Bundle
from services.adapters.remote.machine_errors import (
    AgentError,
    AgentProblem,
    KeyProblem,
    MachineDown,
    UnknownHost,
    describe_error,
    is_permanent,
    key_problem,
)
from services.adapters.remote.settings import RemoteSettings
from services.adapters.remote.transfers import Transfers

log = logging.getLogger(__name__)
#: asyncssh logs every channel at INFO: ours says what matters (connected, dropped, why).
logging.getLogger("asyncssh").setLevel(logging.WARNING)

AGENT_PATH = Path(__file__).with_name("agent.py")
#: What the agent needs on the machine besides the keeper: itself and its helpers (stdlib only).
AGENT_FILES = {
    "agent.py": AGENT_PATH,
    "agent_checkpoints.py": Path(__file__).with_name("agent_checkpoints.py"),
    "agent_host.py": Path(__file__).with_name("agent_host.py"),
    "trialdir.py": Path(trialdir.__file__),
}


def _quote(path: str) -> str:
    """A path for the remote shell; ``~/`` stays unquoted so that the shell expands it."""
    return shlex.quote(path)


#: Salt of :func:`machine_key`, new in every process: the key never tells a password.
_KEY_SALT = secrets.token_bytes(16)


def machine_key(config: RemoteMachineConfig) -> str:
    """The pool key of a machine: its address and a digest of its credentials, so that two
    experiments naming one machine with different credentials never share a connection."""
    secret = "\0".join(
        value.get_secret_value() if isinstance(value, SecretStr) else str(value or "")
        for value in (config.password, config.ssh_key, config.ssh_key_file, config.ssh_passphrase, config.python_path)
    )
    return f"{config.address}/{hmac.new(_KEY_SALT, secret.encode(), 'sha256').hexdigest()[:16]}"


class Machine:
    """One SSH machine: connect, keep connected, run the agent, call it (module docstring)."""

    def __init__(
        self,
        config: RemoteMachineConfig,
        settings: RemoteSettings,
        bundle: Bundle,
        on_event: Callable[[Machine, dict], None],
        on_up: Callable[[Machine], None],
    ) -> None:
        self.name = config.address
        self.key = machine_key(config)
        self.config = config  # the newest experiment's credentials win
        self.settings, self.bundle = settings, bundle
        self._on_event, self._on_up = on_event, on_up
        self.conn: asyncssh.SSHClientConnection | None = None
        self._agent: asyncssh.SSHClientProcess | None = None
        self.up = asyncio.Event()
        self.root = ""  # absolute, once the agent said where
        self.cpus = 1
        self.keeper_version = ""  # what the keepers there announce to the gateway
        self.error: str | None = None  # why it is down
        self.permanent = False  # the error is the config's (credentials, host key): retrying cannot help
        self.down_since: float | None = time.monotonic()  # monotonic; None while up
        self.down_wall = time.time()
        self.tried = False  # a connection attempt has finished
        self._tried = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = 0
        self.probes: dict[str | None, dict] = {}  # pythonPath → what python3 there is
        self.last_used = time.monotonic()  # an idle machine's connection is closed after a while
        self.files = Transfers(
            name=self.name,
            bundle=bundle,
            remote_root=settings.remote_root,
            up=self.up,
            down_reason=self.down_reason,
            call=self.call,
        )

    # ------------------------------------------------------------------ connection

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._keep_connected(), name=f"ssh {self.name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._lost("the adapter stopped")

    async def ready(self, wait: float) -> bool:
        """Connected now, or within ``wait`` seconds (the first attempt is always awaited)."""
        self.start()
        if self.up.is_set():
            return True
        if not self.tried:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.ssh_connect_timeout + 30):
                    await self._tried.wait()
        if not self.up.is_set() and wait > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.up.wait()
        return self.up.is_set()

    def down_reason(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.down_wall))
        return f"machine {self.name} unreachable since {since}: {self.error or 'connecting'}"

    async def _keep_connected(self) -> None:
        delay = 0.5
        while True:
            try:
                conn = await self._connect()
            except Exception as exc:  # noqa: BLE001 - every failure is a reason people read
                before = self.error
                self._lost(describe_error(exc, self.config, self.settings), permanent=is_permanent(exc))
                if self.error != before:  # once per distinct reason, not once per retry
                    log.warning("%s", self.down_reason())
            else:
                delay = 0.5
                self.tried = True
                self._tried.set()
                self.up.set()
                log.info("connected to %s (agent in %s, %d CPUs)", self.name, self.root, self.cpus)
                self._on_up(self)
                await conn.wait_closed()
                self._lost("the SSH connection dropped")
                log.warning("%s; reconnecting", self.down_reason())
            self.tried = True
            self._tried.set()
            await asyncio.sleep(self.settings.max_backoff if self.permanent else delay)
            delay = min(delay * 2, self.settings.max_backoff)

    def _lost(self, why: str, permanent: bool = False) -> None:
        if self.down_since is None or self.up.is_set():
            self.down_since, self.down_wall = time.monotonic(), time.time()
        self.up.clear()
        self.error, self.permanent = why, permanent
        for future in self._pending.values():
            if not future.done():
                future.set_exception(MachineDown(self.down_reason(), delay=1.0))
        self._pending.clear()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self.conn is not None:
            self.conn.abort()
            self.conn = None
        self._agent = None
        self.files.lost()

    async def _connect(self) -> asyncssh.SSHClientConnection:
        config, settings = self.config, self.settings
        try:
            known_hosts, trusting = self._known_hosts()
        except UnknownHost:  # say "nothing listens" rather than "unknown key" when that is the problem
            async with asyncio.timeout(settings.ssh_connect_timeout):
                _, writer = await asyncio.open_connection(config.host, config.port)
            writer.close()
            raise
        options: dict = {
            "username": config.user,
            "known_hosts": known_hosts,
            "connect_timeout": settings.ssh_connect_timeout,
            "keepalive_interval": settings.ssh_keepalive,
            "keepalive_count_max": 3,
        }
        if config.password is not None:
            options.update(
                password=config.password.get_secret_value(),
                client_keys=None,
                agent_path=None,
                preferred_auth="password,keyboard-interactive",
            )
        elif config.ssh_key is not None or config.ssh_key_file:
            passphrase = config.ssh_passphrase.get_secret_value() if config.ssh_passphrase else None
            try:
                if config.ssh_key is not None:
                    key = asyncssh.import_private_key(config.ssh_key.get_secret_value(), passphrase)
                else:
                    assert config.ssh_key_file  # no ssh_key: the elif's other half holds
                    key = asyncssh.read_private_key(os.path.expanduser(config.ssh_key_file), passphrase)
            except (OSError, asyncssh.KeyImportError, ValueError) as exc:
                raise KeyProblem(key_problem(exc, config)) from None
            options.update(client_keys=[key], agent_path=None)
        conn = await asyncssh.connect(config.host, config.port, **options)
        try:
            if trusting:
                self._remember(conn)
            self.conn = conn
            await self.files.install(conn, await conn.start_sftp_client())
            await self._start_agent(conn)
        except BaseException:
            conn.abort()
            self.conn = None
            raise
        self.down_since, self.error, self.permanent = None, None, False
        return conn

    def _known_hosts(self) -> tuple[str | None, bool]:
        """The ``known_hosts`` argument, and whether this is a first connection we trust."""
        path = self.settings.known_hosts_path
        config = self.config
        if path.exists():
            keys = asyncssh.read_known_hosts(str(path)).match(config.host, "", config.port)
            if any(keys):
                return str(path), False
        if self.settings.ssh_trust_new_hosts:
            return None, True
        raise UnknownHost(self._unknown_host_message())

    def _unknown_host_message(self) -> str:
        path, config = self.settings.known_hosts_path, self.config
        target = config.host if config.port == 22 else f"[{config.host}]:{config.port}"
        return (
            f"the host key of {self.name} is not in {path}: add it after checking it "
            f"(ssh-keyscan -p {config.port} {config.host} >> {path}), or set TRIALBUS_SSH_TRUST_NEW_HOSTS=true "
            f"to trust {target} on first use"
        )

    def _remember(self, conn: asyncssh.SSHClientConnection) -> None:
        key = conn.get_server_host_key()
        if key is None:
            return
        config, path = self.config, self.settings.known_hosts_path
        target = config.host if config.port == 22 else f"[{config.host}]:{config.port}"
        algorithm, data = key.export_public_key().decode().split()[:2]  # without the comment
        line = f"{target} {algorithm} {data}\n"
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "a") as f:
            f.write(line)
        log.warning(
            "trusted the new host key of %s (%s) on first use; added to %s", self.name, key.get_fingerprint(), path
        )

    async def _start_agent(self, conn: asyncssh.SSHClientConnection) -> None:
        root = self.settings.remote_root.rstrip("/")
        path = self.config.python_path
        prefix = f'PATH={_quote(path)}:"$PATH" ' if path else ""
        command = (
            f"{prefix}exec python3 -S -I {_quote(root)}/bin/{self.bundle.hash}/agent.py {_quote(root)} "
            f"2>{_quote(root)}/agent.log"
        )  # never a stderr pipe nobody reads
        self._agent = await conn.create_process(command, encoding=None)
        try:
            async with asyncio.timeout(30):
                line = await self._agent.stdout.readline()
        except TimeoutError:
            raise AgentProblem(f"the Trialbus agent did not start on {self.name} within 30s") from None
        if not line:
            err = (await conn.run(f"tail -c 2000 {_quote(root)}/agent.log", check=False)).stdout or ""
            err = err.strip() if isinstance(err, str) else err.decode(errors="replace").strip()
            if "not found" in err or self._agent.exit_status == 127:
                where = f" (pythonPath {path})" if path else " (set pythonPath in machineList)"
                raise AgentProblem(f"python3 not found on {self.name}{where}")
            raise AgentProblem(f"the Trialbus agent failed to start on {self.name}: {err[-300:] or 'no output'}")
        ready = json.loads(line)["ready"]
        self.root, self.cpus = ready["root"], int(ready.get("cpus") or 1)
        self.files.root = self.root
        self.keeper_version = str(ready.get("keeper") or "")
        self._reader = asyncio.create_task(self._read(self._agent))

    async def _read(self, agent: asyncssh.SSHClientProcess) -> None:
        while line := await agent.stdout.readline():
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("unreadable line from the agent on %s: %r", self.name, line[:200])
                continue
            if "event" in message:
                self._on_event(self, message)
                continue
            future = self._pending.pop(message.get("id"), None)
            if future is None or future.done():
                continue
            if "error" in message:
                future.set_exception(AgentError(f"{self.name}: {message['error']}"))
            else:
                future.set_result(message.get("result"))
        if self.conn is not None:  # the agent died but SSH is up: start over
            self.conn.close()

    # ------------------------------------------------------------------ calls

    async def call(self, op: str, timeout: float | None = None, **args) -> Any:
        """One request to the agent (its answer: the op's JSON, whose shape the op decides); MachineDown
        when the machine is unreachable."""
        if not self.up.is_set() or self._agent is None:
            raise MachineDown(self.down_reason(), delay=1.0)
        self._ids += 1
        future = self._pending[self._ids] = asyncio.get_running_loop().create_future()
        self._agent.stdin.write(json.dumps({"id": self._ids, "op": op, **args}).encode() + b"\n")
        try:
            async with asyncio.timeout(timeout or self.settings.call_timeout):
                return await future
        except TimeoutError:
            self._pending.pop(self._ids, None)
            if self.conn is not None:
                self.conn.close()  # an agent that does not answer: reconnect
            raise MachineDown(f"machine {self.name} did not answer {op} in time", delay=1.0) from None
