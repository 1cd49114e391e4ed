"""Snapshots of a ``trialCodeDirectory``: a deterministic tar.gz, stored once by content hash.

Guarantees:

- The same files give the same bytes, so the same ``sha256:<hex>`` ref: members are
  sorted, mtimes, uids and gids are zero, owner names empty, modes normalised (0755 for
  directories and executables, 0644 otherwise), and the gzip header has no name or time.
- ``.nniignore`` is honoured with gitignore rules, as NNI does: one pattern per line,
  ``#`` starts a comment, ``!`` re-includes, a trailing ``/`` matches directories only,
  a pattern with a ``/`` is anchored to the folder of its ``.nniignore`` (otherwise it
  matches a name at any depth), ``*``/``?``/``[…]`` stay within one path part and ``**``
  crosses parts. An ignored directory is skipped with everything in it. A ``.nniignore``
  in a sub-folder adds rules for that sub-folder, as ``.gitignore`` does.
- NNI's limits hold: at most 2000 files and directories and 300 MiB of file content
  (``validateCodeDir`` in NNI's training services); past them packing stops with an
  error that says what to ignore.
- ``.trialbus/`` at the top (the data directory of ``trialbus up`` run in the code
  directory: a live NATS store and trial directories, never code) is always left out.
- Symbolic links are followed, as NNI does; a broken link or a loop is an error.
- :func:`upload_code` stores the archive in the ``code`` object store under its hex
  digest only when no object of that name exists, so a second upload sends nothing.
- An archive from anyone else (``POST /api/v1/code``, the store) is untrusted input: it is
  checked and unpacked only by :mod:`services.common.code_archive`, never by tarfile directly.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.object_store import ObjectStore

from contracts.streams import CODE_STORE, bucket_name

IGNORE_FILE = ".nniignore"
#: Left out before any .nniignore is read; a .nniignore may re-include it with ``!``.
DEFAULT_IGNORE = "/.trialbus/\n"
#: NNI's limits on a code directory (files and directories counted together).
MAX_FILES = 2000
MAX_BYTES = 300 * 1024 * 1024


class PackingError(ValueError):
    """The code directory cannot be packed; the message says what to change."""


class CodeArchive(NamedTuple):
    """A packed code directory: the tar.gz bytes and their ``sha256:<hex>`` ref."""

    data: bytes
    ref: str

    @property
    def digest(self) -> str:
        """The hex digest: the object's name in the ``code`` store."""
        return self.ref.removeprefix("sha256:")


class CodeUpload(NamedTuple):
    """The result of :func:`upload_code`."""

    #: ``sha256:<hex>``, the value of ``trialCodeRef``.
    ref: str
    #: Size of the archive in bytes.
    size: int
    #: False when the store already held this snapshot and nothing was sent.
    uploaded: bool


@dataclass(frozen=True)
class _Rule:
    base: str  # folder of the .nniignore, relative to the code dir ("" for the top)
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        return self.regex.fullmatch(rel) is not None


def _glob_to_regex(pattern: str) -> str:
    """Translate one gitignore glob (without ``!`` and trailing ``/``) to a regex."""
    anchored = "/" in pattern
    pattern = pattern.lstrip("/")
    out = [] if anchored else ["(?:.*/)?"]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            before_ok = i == 0 or pattern[i - 1] == "/"
            after = pattern[i + 2 : i + 3]
            if before_ok and after == "/":  # "**/": any number of leading folders
                out.append("(?:.*/)?")
                i += 3
                continue
            if before_ok and i + 2 == n:  # trailing "/**": everything inside
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")  # other "**" are plain "*"
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_ignore(text: str, base: str = "") -> list[_Rule]:
    """The rules of one ``.nniignore`` whose folder is ``base`` (relative, posix)."""
    rules = []
    for line in text.splitlines():
        # trailing spaces are dropped unless escaped with a backslash
        line = line[:-2].rstrip() + "\\ " if line.endswith("\\ ") else line.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate or line.startswith(("\\!", "\\#")):  # "\\!" and "\\#" are literal
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        try:
            regex = re.compile(_glob_to_regex(line))
        except re.error as exc:
            where = f"{base}/{IGNORE_FILE}" if base else IGNORE_FILE
            raise PackingError(f"{where}: bad pattern {line!r}: {exc}") from None
        rules.append(_Rule(base=base, regex=regex, negate=negate, dir_only=dir_only))
    return rules


def is_ignored(rules: list[_Rule], rel: str, is_dir: bool) -> bool:
    """gitignore's rule: the last matching pattern decides."""
    ignored = False
    for rule in rules:
        if rule.matches(rel, is_dir):
            ignored = not rule.negate
    return ignored


def _walk(root: Path, rel: str, rules: list[_Rule], seen: frozenset[str]) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Yield (relative path, path, stat) of every entry kept, depth first, sorted by name."""
    folder = root / rel if rel else root
    real = os.path.realpath(folder)
    if real in seen:
        raise PackingError(f"symbolic link loop at {folder}: remove the link or list it in {IGNORE_FILE}")
    ignore_file = folder / IGNORE_FILE
    if ignore_file.is_file():
        rules = rules + parse_ignore(ignore_file.read_text(errors="replace"), rel)
    for name in sorted(os.listdir(folder)):
        child_rel = f"{rel}/{name}" if rel else name
        path = folder / name
        try:
            st = path.stat()
        except OSError as exc:
            raise PackingError(
                f"cannot read {path}: {exc.strerror} (a broken link?); remove it or list it in {IGNORE_FILE}"
            ) from None
        is_dir = stat.S_ISDIR(st.st_mode)
        if not (is_dir or stat.S_ISREG(st.st_mode)) or is_ignored(rules, child_rel, is_dir):
            continue
        yield child_rel, path, st
        if is_dir:
            yield from _walk(root, child_rel, rules, seen | {real})


def pack_code(directory: str | Path, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> CodeArchive:
    """Pack ``directory`` into a deterministic tar.gz; raise :class:`PackingError` on a problem."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise PackingError(f"trialCodeDirectory {root} is not a directory")
    buffer = io.BytesIO()
    count = total = 0
    hint = f"list what trials do not need (data, checkpoints, virtual environments) in {root / IGNORE_FILE}"
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel, path, st in _walk(root, "", parse_ignore(DEFAULT_IGNORE), frozenset()):
            count += 1
            if count > max_files:
                raise PackingError(f"{root} has more than {max_files} files and directories; {hint}")
            info = tarfile.TarInfo(rel)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
                continue
            total += st.st_size
            if total > max_bytes:
                raise PackingError(f"{root} holds more than {max_bytes // (1024 * 1024)} MiB of files; {hint}")
            info.size = st.st_size
            info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
            try:
                with path.open("rb") as f:
                    tar.addfile(info, f)
            except OSError as exc:  # unreadable, or not the size it said (/proc, a file being written)
                raise PackingError(
                    f"cannot read {path}: {exc.strerror or exc}; remove it or list it in {IGNORE_FILE}"
                ) from None
    data = buffer.getvalue()
    return CodeArchive(data, "sha256:" + hashlib.sha256(data).hexdigest())


class HasJetStream(Protocol):
    """What holds a JetStream context as ``js`` (a ``Bus``)."""

    @property
    def js(self) -> JetStreamContext: ...


async def code_store(js: JetStreamContext) -> ObjectStore:
    """The ``code`` object store, created with its shared definition when missing."""
    bucket = bucket_name(CODE_STORE)
    try:
        return await js.object_store(bucket)
    except NotFoundError:
        pass
    try:
        return await js.create_object_store(bucket, config=CODE_STORE)
    except BadRequestError:  # created by someone else in between
        return await js.object_store(bucket)


async def store_archive(bus_or_js: JetStreamContext | HasJetStream, data: bytes, ref: str) -> str:
    """Put an archive in the ``code`` store under its digest unless it is there; return ``ref``.

    Check an archive that is not from :func:`pack_code` with ``code_archive.check_archive`` first.
    """
    js = bus_or_js if isinstance(bus_or_js, JetStreamContext) else bus_or_js.js
    store = await code_store(js)
    digest = ref.removeprefix("sha256:")
    try:
        await store.get_info(digest)
    except NotFoundError:
        await store.put(digest, data)
    return ref


async def upload_code(bus_or_js: JetStreamContext | HasJetStream, directory: str | Path) -> CodeUpload:
    """Pack ``directory`` and store it as ``<hex>`` in the ``code`` store unless already there.

    ``bus_or_js`` is a JetStream context or anything with a ``js`` attribute (a ``Bus``).
    Packing runs in a worker thread so the event loop keeps serving.
    """
    js = bus_or_js if isinstance(bus_or_js, JetStreamContext) else bus_or_js.js
    archive = await asyncio.to_thread(pack_code, directory)
    store = await code_store(js)
    try:
        await store.get_info(archive.digest)
        return CodeUpload(archive.ref, len(archive.data), uploaded=False)
    except NotFoundError:
        pass
    await store.put(archive.digest, archive.data)
    return CodeUpload(archive.ref, len(archive.data), uploaded=True)
