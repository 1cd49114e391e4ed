"""Files to and from an SSH machine over the connection's SFTP channel.

Trialbus's own files go to ``<root>/bin/<hash>/`` once per content hash, on each connection
before the agent starts (:meth:`Transfers.install`); code snapshots to ``<root>/code/<sha256>/``
once per machine and hash, unpacked there by the agent, so a second experiment with the same
code uploads nothing (:meth:`Transfers.code_dir`); and scratch files both ways, such as
checkpoint archives (:meth:`Transfers.download`, :meth:`Transfers.upload`). The bundle and
snapshots are written under a temporary name and moved into place, so a dropped connection
leaves nothing half written where it is looked for.

Each :class:`~services.adapters.remote.client.Machine` owns one :class:`Transfers` (its
``files``): the machine hands it each new connection's SFTP client, and the agent's root once
the agent said where it is; the transfers keep the snapshots known to be on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncssh

from services.adapters.errors import PermanentError
from services.adapters.keeper import Bundle
from services.adapters.remote.machine_errors import AgentError, MachineDown

log = logging.getLogger(__name__)


class Transfers:
    """A machine's file transfers (the module's docstring)."""

    def __init__(
        self,
        *,
        name: str,
        bundle: Bundle,
        remote_root: str,
        up: asyncio.Event,
        down_reason: Callable[[], str],
        call: Callable[..., Awaitable[Any]],
    ) -> None:
        """``up``, ``down_reason`` and ``call``: the machine's connection state, and its agent."""
        self.name, self.bundle, self.remote_root = name, bundle, remote_root
        self._up, self._down_reason, self._call = up, down_reason, call
        self.sftp: asyncssh.SFTPClient | None = None  # this connection's
        self.root = ""  # absolute, once the agent said where
        self.code: dict[str, str] = {}  # sha256 → unpacked folder on the machine
        self._uploads: dict[str, asyncio.Task[str]] = {}

    def lost(self) -> None:
        """The connection is gone, and its SFTP client and uploads with it."""
        self.sftp = None
        self._uploads.clear()

    async def install(self, conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> None:
        """On a new connection: Trialbus's files under ``<root>/bin/<hash>/``, uploaded unless already there."""
        self.sftp = sftp
        root = self.remote_root.rstrip("/")
        folder = f"{root}/bin/{self.bundle.hash}"
        if await sftp.exists(f"{folder}/.complete"):
            return
        tmp = f"{root}/bin/.{self.bundle.hash}-{secrets.token_hex(4)}"
        await sftp.makedirs(f"{tmp}/nni_shim/nni", exist_ok=True)
        for name, data in self.bundle.files.items():
            await sftp.makedirs(f"{tmp}/{os.path.dirname(name)}", exist_ok=True)
            async with sftp.open(f"{tmp}/{name}", "wb") as f:
                await f.write(data)
        async with sftp.open(f"{tmp}/.complete", "wb") as f:
            await f.write(b"")
        try:
            await sftp.rename(tmp, folder)
        except asyncssh.SFTPError:  # another adapter replica installed it meanwhile
            if not await sftp.exists(f"{folder}/.complete"):
                raise
            await conn.run(f"rm -rf {shlex.quote(tmp)}", check=False)
        log.info("installed Trialbus's files on %s (%s)", self.name, folder)

    async def code_dir(self, digest: str, archive: Callable[[], Awaitable[bytes]]) -> str:
        """The unpacked snapshot ``digest`` on the machine, uploaded unless it is there."""
        if (path := self.code.get(digest)) is not None:
            return path
        task = self._uploads.get(digest)
        if task is None:
            task = self._uploads[digest] = asyncio.create_task(self._upload(digest, archive))
        path = await asyncio.shield(task)
        self.code[digest] = path
        return path

    async def _upload(self, digest: str, archive: Callable[[], Awaitable[bytes]]) -> str:
        dest = f"{self.root}/code/{digest}"
        sftp = self.sftp
        if sftp is None:  # the connection went down meanwhile (as _transfer says)
            raise MachineDown(self._down_reason(), delay=1.0)
        if not await sftp.isdir(dest):
            data = await archive()
            await sftp.makedirs(f"{self.root}/code", exist_ok=True)
            tmp = f"{self.root}/code/.{digest}-{secrets.token_hex(4)}.tar.gz"
            async with sftp.open(tmp, "wb") as f:
                await f.write(data)
            try:
                await self._call("unpack", archive=tmp, dest=dest, timeout=300)
            except AgentError as exc:  # an unsafe archive, a full disk: the same again would fail again
                raise PermanentError(f"cannot unpack code snapshot sha256:{digest} on {self.name}: {exc}") from None
            log.info("uploaded code snapshot sha256:%s to %s (%d bytes)", digest[:12], self.name, len(data))
        return dest

    def scratch(self, name: str) -> str:
        """A new path for a temporary file on the machine (``<root>/tmp/``, which the agent cleans)."""
        return f"{self.root}/tmp/{name}-{secrets.token_hex(6)}"

    async def download(self, remote: str, local: Path) -> None:
        """Copy the machine's file ``remote`` to ``local`` over SFTP, then remove it there."""
        async with self._transfer(f"copy {remote} from") as sftp:
            try:
                await sftp.get(remote, str(local))
            finally:
                with contextlib.suppress(asyncssh.Error, OSError):
                    await sftp.remove(remote)

    async def upload(self, local: Path, remote: str) -> None:
        """Copy ``local`` to the machine's ``remote`` over SFTP (its folder is made if need be)."""
        async with self._transfer(f"copy {remote} to") as sftp:
            await sftp.makedirs(os.path.dirname(remote), exist_ok=True)
            await sftp.put(str(local), remote)

    @contextlib.asynccontextmanager
    async def _transfer(self, what: str) -> AsyncIterator[asyncssh.SFTPClient]:
        """This connection's SFTP client; its errors as ours: MachineDown when the connection is
        (or went) down, else AgentError."""
        sftp = self.sftp
        if not self._up.is_set() or sftp is None:
            raise MachineDown(self._down_reason(), delay=1.0)
        try:
            yield sftp
        except (asyncssh.Error, OSError) as exc:
            if not self._up.is_set() or isinstance(exc, asyncssh.ConnectionLost | asyncssh.SFTPConnectionLost):
                raise MachineDown(self._down_reason(), delay=1.0) from None
            raise AgentError(f"cannot {what} {self.name}: {getattr(exc, 'reason', None) or exc}") from None
