"""Reading a code archive that anyone may have made: check it, unpack it, or refuse it by name.

Code snapshots come from our packer (:func:`services.common.code.pack_code`), but also from
``POST /api/v1/code``, so the dispatcher (on upload) and the adapters (before a snapshot is
unpacked or shipped) read them as untrusted input, through this one reader. Guarantees, for
:func:`check_archive` and :func:`extract_code` alike:

- Only regular files and directories. Packing follows symbolic links and writes none, so
  every link member is refused, symbolic or hard, pointing inside the tree or out of it; so
  are devices, FIFOs, sparse files and any other type. Pack links as the files they point
  to (``tar --dereference``, as ``pack_code`` does).
- No member lands outside the code directory: absolute names and ``..`` parts are refused,
  and unpacking applies tarfile's ``data`` filter on top of these checks.
- NNI's limits: at most ``MAX_FILES`` members and ``MAX_BYTES`` of file content (both can be
  lowered per call). A member's declared size is checked before its content is read.
- Decompression is bounded: the decompressed tar stream is read through a counter that
  stops at the content cap plus room for headers (``HEADER_ROOM`` a member), in chunks, so a
  small gzip that would inflate to gigabytes costs at most that much reading, no more memory
  than one chunk (or a tar header the cap allows), and nothing past the cap is written.
- Every refusal is an :class:`UnsafeArchive` whose message names the member.
- :func:`extract_code` is atomic: it unpacks into a temporary sibling, then renames it into
  place; a refused archive leaves nothing behind.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from services.common.code import MAX_BYTES, MAX_FILES, PackingError

#: Room in the decompressed stream for one member's headers (tar and pax, long names) and padding.
HEADER_ROOM = 8 * 1024
#: Room for the end-of-archive blocks and the record padding after the last member.
TAIL_ROOM = 64 * 1024
_CHUNK = 1024 * 1024
_MiB = 1024 * 1024

_FILE_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}
_ONLY = (
    "a code snapshot holds only regular files and directories "
    "(pack links as the files they point to: tar --dereference, as trialbus does)"
)


class UnsafeArchive(PackingError):
    """A code archive that is not a tar.gz of a code directory, or that breaks a rule or a
    limit of this module; the message names the member."""


class _PastCap(Exception):
    """The decompressed stream went past its cap (internal: turned into :class:`UnsafeArchive`)."""


def _size(n: int) -> str:
    return f"{n / _MiB:.0f} MiB" if n >= _MiB else f"{n} bytes"


class _CappedStream:
    """A forward-only view of a decompressed stream that never reads more than ``cap`` bytes.

    Implements what tarfile's seekable mode uses (``read``, ``tell``, forward ``seek``) so
    that tarfile reads a header by its declared size only when the cap allows it: a request
    that would pass the cap reads on in chunks, discarding, to tell a bomb (data goes on past
    the cap: :class:`_PastCap`) from a truncated archive (tarfile sees the short read).
    """

    def __init__(self, raw: io.BufferedIOBase, cap: int) -> None:
        self.raw, self.cap, self.pos = raw, cap, 0

    def read(self, size: int) -> bytes:
        if self.pos + size > self.cap:
            self.drain()
            return b""  # the stream ended before the cap: shorter than asked, tarfile says truncated
        data = self.raw.read(size)
        self.pos += len(data)
        return data

    def drain(self) -> None:
        """Read to the end of the stream (checking the gzip trailer), raising past the cap."""
        while chunk := self.raw.read(min(_CHUNK, self.cap + 1 - self.pos)):
            self.pos += len(chunk)
            if self.pos > self.cap:
                raise _PastCap

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET or offset < self.pos:
            raise OSError("a code archive is read forward only")
        while self.pos < offset and self.read(min(_CHUNK, offset - self.pos)):
            pass
        return self.pos


class _Rules:
    """The explicit checks, member by member, in archive order; they see what came before so
    that :func:`check_archive` accepts exactly what :func:`extract_code` can unpack."""

    def __init__(self, max_files: int, max_bytes: int) -> None:
        self.max_files, self.max_bytes = max_files, max_bytes
        self.count = self.total = 0
        self.files: set[PurePosixPath] = set()
        self.dirs: set[PurePosixPath] = set()

    def refusal(self, member: tarfile.TarInfo) -> str | None:
        """Why ``member`` is refused, or None (and it is counted)."""
        name, path = member.name, PurePosixPath(member.name)  # "./a/" is "a"
        what = f"code archive member {name!r}"
        self.count += 1
        if self.count > self.max_files:
            return f"{what} is past the limit of {self.max_files} files and directories in a code snapshot"
        if name.startswith("/") or ".." in path.parts:
            return f"{what} would land outside the code directory"
        is_dir = member.type == tarfile.DIRTYPE
        if not is_dir and (member.type not in _FILE_TYPES or member.sparse is not None):
            kind = "a sparse file" if member.sparse is not None else f"of tar type {member.type!r}"
            kind = _KINDS.get(member.type, kind)
            target = f" to {member.linkname!r}" if member.issym() or member.islnk() else ""
            return f"{what} is {kind}{target}: {_ONLY}"
        if not is_dir and not path.name:
            return f"{what} is a file without a name"
        if clash := next((p for p in path.parents if p in self.files), None):
            return f"{what} is inside {str(clash)!r}, which the archive has as a file"
        if path in self.files or (not is_dir and path in self.dirs):
            return f"{what} is in the archive twice (as a file, or as a file and a directory)"
        self.dirs.update(path.parents)
        if is_dir:
            self.dirs.add(path)
            return None
        self.files.add(path)
        self.total += member.size
        if self.total > self.max_bytes:
            return (
                f"{what} ({_size(member.size)}) takes the archive past {_size(self.max_bytes)} of files, "
                "the limit on what a code snapshot expands to"
            )
        return None


#: Python 3.11.4+ has tarfile's extraction filters (PEP 706); Debian bookworm's own 3.11.2 does not.
_HAS_FILTERS = hasattr(tarfile, "data_filter")
_FILTER_ERRORS: tuple[type[Exception], ...] = (tarfile.FilterError,) if _HAS_FILTERS else ()


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, *, filters: bool = _HAS_FILTERS) -> None:
    """Unpack one member that :class:`_Rules` accepted (a file or a directory, inside ``dest``)
    as the ``data`` filter would: with the "data" filter where Python has it, else with what it
    does to such a member done here (owned by us, no setuid/setgid/sticky bit, no write for others)."""
    if filters:
        tar.extract(member, dest, filter="data")
        return
    safe = copy.copy(member)
    safe.uid, safe.gid, safe.uname, safe.gname = os.getuid(), os.getgid(), "", ""
    safe.mode = (member.mode & 0o755) | (0o700 if member.isdir() else 0o600)
    tar.extract(safe, dest)


def _read(data: bytes, dest: Path | None, max_files: int, max_bytes: int) -> None:
    """Check every member of ``data`` in one streaming pass, unpacking into ``dest`` if given."""
    cap = max_bytes + (max_files + 1) * HEADER_ROOM + TAIL_ROOM
    stream = _CappedStream(gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"), cap)
    rules = _Rules(max_files, max_bytes)
    where = "at its first member"
    try:
        # typeshed's file object for tarfile has write and close too, which reading never calls
        with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
            for member in tar:
                if why := rules.refusal(member):
                    raise UnsafeArchive(why)
                where = f"after member {member.name!r}"
                if dest is not None:
                    try:
                        _extract(tar, member, dest)
                    except _FILTER_ERRORS as exc:  # our checks come first; this is the backstop
                        raise UnsafeArchive(f"code archive member {member.name!r}: {exc}") from None
                    except OSError as exc:
                        raise UnsafeArchive(f"cannot unpack code archive member {member.name!r}: {exc}") from None
        where = "after the end of its tar data"
        stream.drain()  # the rest of the gzip: its checksum, and no bomb hiding after the tar
    except _PastCap:
        raise UnsafeArchive(
            f"code archive expands to more than {_size(cap)} ({where}; a decompression bomb?): "
            f"a code snapshot holds at most {_size(max_bytes)} of files"
        ) from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise UnsafeArchive(f"the code archive is not a tar.gz of a code directory ({exc}; {where})") from None


def check_archive(data: bytes, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> str:
    """Check ``data`` as the module says, without writing anything; its ``sha256:<hex>`` ref.

    Raises :class:`UnsafeArchive` naming the first member refused.
    """
    _read(data, None, max_files, max_bytes)
    return "sha256:" + hashlib.sha256(data).hexdigest()


def extract_code(data: bytes, dest: Path, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> None:
    """Unpack the code archive ``data`` into ``dest`` atomically, with every check of
    :func:`check_archive`; another process that unpacked it first wins the race.

    Raises :class:`UnsafeArchive` naming the member refused; ``dest`` is then not created.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        _read(data, tmp, max_files, max_bytes)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():  # not "another process won the race"
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
