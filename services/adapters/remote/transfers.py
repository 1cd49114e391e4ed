"""Files to and from an SSH machine over the connection's SFTP channel.

Trialbus's own files go to ``<root>/bin/<hash>/`` once per content hash, on each connection
before the agent starts (:meth:`Transfers._install`); code snapshots to ``<root>/code/<sha256>/``
once per machine and hash, unpacked there by the agent, so a second experiment with the same
code uploads nothing (:meth:`Transfers.code_dir`); and scratch files both ways, such as
checkpoint archives (:meth:`Transfers.download`, :meth:`Transfers.upload`). The bundle and
snapshots are written under a temporary name and moved into place, so a dropped connection
leaves nothing half written where it is looked for. Part of
:class:`~services.adapters.remote.client.Machine` (a mixin: it uses the machine's connection,
root and ``call``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shlex
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import asyncssh

from services.adapters.errors import PermanentError
from services.adapters.remote.machine_errors import AgentError, MachineDown

if TYPE_CHECKING:
    from services.adapters.remote.client import Machine

log = logging.getLogger(__name__)


class Transfers:
    """A machine's file transfers (the module's docstring)."""

    async def _install(self: Machine) -> None:
        """Trialbus's files under ``<root>/bin/<hash>/``, uploaded unless already there."""
        root, sftp = self.settings.remote_root.rstrip("/"), self.sftp
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
            await self.conn.run(f"rm -rf {shlex.quote(tmp)}", check=False)
        log.info("installed Trialbus's files on %s (%s)", self.name, folder)

    async def code_dir(self: Machine, digest: str, archive: Callable[[], asyncio.Future]) -> str:
        """The unpacked snapshot ``digest`` on the machine, uploaded unless it is there."""
        if (path := self.code.get(digest)) is not None:
            return path
        task = self._uploads.get(digest)
        if task is None:
            task = self._uploads[digest] = asyncio.create_task(self._upload(digest, archive))
        path = await asyncio.shield(task)
        self.code[digest] = path
        return path

    async def _upload(self: Machine, digest: str, archive: Callable[[], asyncio.Future]) -> str:
        dest = f"{self.root}/code/{digest}"
        if not await self.sftp.isdir(dest):
            data = await archive()
            await self.sftp.makedirs(f"{self.root}/code", exist_ok=True)
            tmp = f"{self.root}/code/.{digest}-{secrets.token_hex(4)}.tar.gz"
            async with self.sftp.open(tmp, "wb") as f:
                await f.write(data)
            try:
                await self.call("unpack", archive=tmp, dest=dest, timeout=300)
            except AgentError as exc:  # an unsafe archive, a full disk: the same again would fail again
                raise PermanentError(f"cannot unpack code snapshot sha256:{digest} on {self.name}: {exc}") from None
            log.info("uploaded code snapshot sha256:%s to %s (%d bytes)", digest[:12], self.name, len(data))
        return dest

    def scratch(self: Machine, name: str) -> str:
        """A new path for a temporary file on the machine (``<root>/tmp/``, which the agent cleans)."""
        return f"{self.root}/tmp/{name}-{secrets.token_hex(6)}"

    async def download(self: Machine, remote: str, local: Path) -> None:
        """Copy the machine's file ``remote`` to ``local`` over SFTP, then remove it there."""
        async with self._transfer(f"copy {remote} from") as sftp:
            try:
                await sftp.get(remote, str(local))
            finally:
                with contextlib.suppress(asyncssh.Error, OSError):
                    await sftp.remove(remote)

    async def upload(self: Machine, local: Path, remote: str) -> None:
        """Copy ``local`` to the machine's ``remote`` over SFTP (its folder is made if need be)."""
        async with self._transfer(f"copy {remote} to") as sftp:
            await sftp.makedirs(os.path.dirname(remote), exist_ok=True)
            await sftp.put(str(local), remote)

    @contextlib.asynccontextmanager
    async def _transfer(self: Machine, what: str) -> AsyncIterator[asyncssh.SFTPClient]:
        """This connection's SFTP client; its errors as ours: MachineDown when the connection is
        (or went) down, else AgentError."""
        sftp = self.sftp
        if not self.up.is_set() or sftp is None:
            raise MachineDown(self.down_reason(), delay=1.0)
        try:
            yield sftp
        except (asyncssh.Error, OSError) as exc:
            if not self.up.is_set() or isinstance(exc, asyncssh.ConnectionLost | asyncssh.SFTPConnectionLost):
                raise MachineDown(self.down_reason(), delay=1.0) from None
            raise AgentError(f"cannot {what} {self.name}: {getattr(exc, 'reason', None) or exc}") from None
