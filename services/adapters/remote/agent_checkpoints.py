"""Trial checkpoint directories on an SSH machine, for the remote agent (stdlib only, Python >= 3.9).

Shipped beside ``agent.py``. The remote adapter keeps a copy of each trial's checkpoint directory
(``<root>/checkpoints/<experiment>/<trial>``) in a JetStream object store, so that a retry on
another machine resumes from it (``checkpoints.py`` on the adapter's side). Here, on the machine:

- :func:`scan`: a cheap signature of a directory (newest mtime, bytes, files), to tell whether it
  changed since the last copy without reading it;
- :func:`pack`: the directory as a tar.gz, of regular files and directories only (links, devices and
  FIFOs are left out; a file is opened without following a link swapped in meanwhile);
- :func:`unpack`: such an archive into place, read as untrusted input with the rules of
  ``services/common/code_archive.py``: only regular files and directories, no absolute name and no
  ``..``, at most ``max_bytes`` of files and ``MAX_FILES`` members, decompression bounded by the
  same caps (plus room for headers), tarfile's ``data`` filter on top where Python has it. It
  unpacks beside the directory and then swaps it in, so a refused archive changes nothing.
"""

import contextlib
import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zlib

#: Members (files and directories) of a checkpoint directory that is copied at most.
MAX_FILES = 10000
#: Room in the decompressed stream for one member's headers and padding, and for the end (as code_archive).
HEADER_ROOM = 8 * 1024
TAIL_ROOM = 64 * 1024
_CHUNK = 1024 * 1024
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)


def scan(path):
    """``(signature, members)`` of the directory ``path``: the signature is ``[newest mtime in ns,
    bytes of files, files, directories]`` (None when ``path`` is not a directory), the members its
    relative paths, directories first, as ``(name, is_dir)``. Links and special files are skipped.
    It stops past ``MAX_FILES`` members: such a directory is not copied anyway."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None, []
    except (FileNotFoundError, NotADirectoryError):
        return None, []
    newest = size = files = dirs = 0
    members: list[tuple[str, bool]] = []  # (name, is a directory)
    todo = [""]
    while todo and len(members) <= MAX_FILES:
        relative = todo.pop()
        try:
            entries = list(os.scandir(os.path.join(path, relative) if relative else path))
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed meanwhile
        for entry in entries:
            name = relative + "/" + entry.name if relative else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                dirs += 1
                todo.append(name)
                members.append((name, True))
            elif stat.S_ISREG(info.st_mode):
                files += 1
                size += info.st_size
                members.append((name, False))
            else:
                continue
            newest = max(newest, info.st_mtime_ns)
    members.sort(key=lambda m: (not m[1], m[0]))
    return [newest, size, files, dirs], members


def pack(path, archive, max_bytes, since=None):
    """Write the directory ``path`` to ``archive`` (a new tar.gz, mode 0600) unless it is unchanged
    since the signature ``since``, empty, or too big. The answer always has the ``signature``, and
    one of ``unchanged``, ``empty``, ``over`` (bytes or members past the caps) or ``size`` (of the
    archive written)."""
    signature, members = scan(path)
    if since is not None and signature == since:
        return {"signature": signature, "unchanged": True}
    if signature is None or signature[2] == 0:
        return {"signature": signature, "empty": True}
    if signature[1] > max_bytes or len(members) > MAX_FILES:
        return {"signature": signature, "over": True}
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    written = 0
    try:
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
            for name, is_dir in members:
                if is_dir:
                    info = tarfile.TarInfo(name)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    continue
                try:
                    member = os.open(os.path.join(path, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
                except OSError:
                    continue  # removed (or swapped for a link) since the scan: the next copy has it
                with os.fdopen(member, "rb") as f:
                    st = os.fstat(f.fileno())
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    written += st.st_size
                    if written > max_bytes:
                        raise _Over()
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), st.st_mode & 0o755 | 0o600
                    tar.addfile(info, f)  # a file shrunk meanwhile raises: this copy is given up
    except _Over:
        os.unlink(archive)
        return {"signature": signature, "over": True}
    except BaseException:
        os.unlink(archive)
        raise
    return {"signature": signature, "size": os.path.getsize(archive)}


class _Over(Exception):
    """The directory grew past ``max_bytes`` while it was packed."""


class _Capped:
    """The decompressed stream of an archive, raising past ``cap`` bytes (a decompression bomb)."""

    def __init__(self, raw, cap):
        self.raw, self.cap, self.pos = raw, cap, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(min(size, _CHUNK) if size and size > 0 else _CHUNK)
        self.pos += len(data)
        if self.pos > self.cap:
            raise ValueError(f"the checkpoint archive expands to more than {self.cap} bytes")
        return data


def refusal(member, seen):
    """Why the archive member is refused (None: accepted); ``seen`` counts members and bytes."""
    name = member.name
    seen["members"] += 1
    if seen["members"] > seen["max_members"]:
        return f"checkpoint archive has more than {seen['max_members']} members"
    if name.startswith("/") or ".." in name.split("/"):
        return f"checkpoint archive member {name!r} would land outside the checkpoint directory"
    if member.isdir():
        return None
    if member.type not in _FILE_TYPES or member.sparse is not None:
        target = f" to {member.linkname!r}" if member.issym() or member.islnk() else ""
        return f"checkpoint archive member {name!r} is not a regular file or directory{target}"
    seen["bytes"] += member.size
    if seen["bytes"] > seen["max_bytes"]:
        return f"checkpoint archive member {name!r} takes it past {seen['max_bytes']} bytes of files"
    return None


def unpack(archive, dest, max_bytes):
    """Unpack the tar.gz ``archive`` as the directory ``dest``, replacing what is there; the archive
    is removed either way. ValueError naming the member when it breaks a rule (``dest`` unchanged).
    Returns the signature of ``dest`` afterwards."""
    parent = os.path.dirname(dest)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(dest) + "-", dir=parent)
        try:
            _extract(archive, tmp, max_bytes)
            _swap(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(archive)
    return scan(dest)[0]


def _extract(archive, into, max_bytes):
    seen = {"members": 0, "bytes": 0, "max_members": MAX_FILES, "max_bytes": max_bytes}
    cap = max_bytes + (MAX_FILES + 1) * HEADER_ROOM + TAIL_ROOM
    filters = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with gzip.open(archive, "rb") as raw:
        stream = _Capped(raw, cap)
        try:
            # The stream mode only reads its file; typeshed asks every mode's methods (write, seek, ...).
            with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    why = refusal(member, seen)
                    if why:
                        raise ValueError(why)
                    if not filters:  # Python without extraction filters: what the data filter does
                        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
                        member.mode = (member.mode & 0o755) | (0o700 if member.isdir() else 0o600)
                    tar.extract(member, into, **filters)
            while stream.read(_CHUNK):  # the rest of the gzip: its checksum, and no bomb after the tar
                pass
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise ValueError(f"the checkpoint archive is not a readable tar.gz ({exc})") from None


def _swap(new, dest):
    """``new`` becomes ``dest``; what ``dest`` held is removed once it is out of the way."""
    old = None
    if os.path.lexists(dest):
        old = tempfile.mkdtemp(prefix="." + os.path.basename(dest) + "-old-", dir=os.path.dirname(dest))
        os.rename(dest, old + "/d")
    os.rename(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_stale(root, deadline, running):
    """Delete checkpoint directories (``<root>/<experiment>/<trial>``) unchanged since ``deadline``
    (a time), but those of ``running`` trials ((experiment, trial) pairs); the count.
    O(checkpoint directories)."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for experiment in os.scandir(root):
            if not experiment.is_dir():
                continue
            for entry in os.scandir(experiment.path):
                with contextlib.suppress(FileNotFoundError):
                    if (experiment.name, entry.name) not in running and entry.stat().st_mtime < deadline:
                        shutil.rmtree(entry.path, ignore_errors=True)
                        removed += 1
            with contextlib.suppress(OSError):  # only when empty
                os.rmdir(experiment.path)
    return removed
