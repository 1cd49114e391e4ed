"""Code snapshots on this host: each ``sha256:<hex>`` downloaded and unpacked once, under
``<work_dir>/code/<hex>/``, and shared by every trial that runs it (also after a restart: a
directory that is there is not downloaded again). Concurrent launches of one snapshot share
one download; a launch that gives up does not abort it for the others. Each snapshot is made
readable for the trial user once per run of the adapter (``share``: :meth:`.users.TrialUsers.share`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from services.adapters.errors import PermanentError
from services.common.code_archive import UnsafeArchive, extract_code
from services.common.tasks import cancel_and_wait

_CODE_REF = re.compile(r"^sha256:([0-9a-f]{64})$")


class CodeCache:
    """Unpacked code snapshots, by hash (the module's docstring)."""

    def __init__(
        self, root: Path, fetch: Callable[[str], Awaitable[bytes]], share: Callable[[str], None] = lambda path: None
    ) -> None:
        """``root``: ``<work_dir>/code``; ``fetch(hex)``: the snapshot's archive (from the bus);
        ``share(dir)``: let the trials read an unpacked snapshot (blocking: run in a thread)."""
        self.root, self.fetch, self.share = root, fetch, share
        self._dirs: dict[str, str] = {}  # sha256 hex → unpacked directory
        self._downloads: dict[str, asyncio.Task] = {}

    async def dir(self, code_ref: str) -> str:
        """The unpacked snapshot for ``code_ref``: downloaded once per hash, shared by every trial."""
        match = _CODE_REF.match(code_ref)
        if match is None:
            raise PermanentError(f"code reference {code_ref!r} is not sha256:<64 hex digits>")
        digest = match.group(1)
        if (path := self._dirs.get(digest)) is not None:
            return path
        dest = self.root / digest
        if not dest.is_dir():
            task = self._downloads.get(digest)
            if task is None:
                task = self._downloads[digest] = asyncio.create_task(self._download(digest, dest))
                task.add_done_callback(lambda _: self._downloads.pop(digest, None))
            await asyncio.shield(task)  # one launch giving up must not abort the others' download
        await asyncio.to_thread(self.share, str(dest))
        self._dirs[digest] = str(dest)
        return str(dest)

    async def _download(self, digest: str, dest: Path) -> None:
        archive = await self.fetch(digest)
        try:
            await asyncio.to_thread(extract_code, archive, dest)
        except UnsafeArchive as exc:
            raise PermanentError(f"code snapshot sha256:{digest}: {exc}") from exc

    async def close(self) -> None:
        """Cancel the downloads under way."""
        await cancel_and_wait(list(self._downloads.values()))
