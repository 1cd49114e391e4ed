"""Code archives are untrusted input, end to end: ``POST /api/v1/code`` of a running dispatcher
refuses every unsafe archive with a 400 that names the member and stores nothing, a bomb
past the real 300 MiB cap included; and a local trial whose snapshot is unsafe fails with
that message and nothing unpacked."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import sys
import tarfile

import nats
import pytest
from nats.js.errors import NotFoundError

from services.common.code import MAX_BYTES, MAX_FILES
from tests.e2e.helpers import create, ended, submit
from tests.fixtures.stack import Stack

GZIP = {"Content-Type": "application/gzip"}
MiB = 1024 * 1024
Member = tuple[tarfile.TarInfo, bytes]


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    return info, data


def tar_gz(*members: Member) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def zeros_gzip(mib: int) -> bytes:
    """``mib`` MiB of zeros as gzip (one 1 MiB member of about 1 KB, repeated)."""
    return gzip.compress(b"\0" * MiB) * mib


def honest_bomb(size: int) -> bytes:
    """One file of ``size`` zero bytes (declared as such), about ``size / 1000`` bytes of gzip."""
    header, _ = member("weights.bin")
    header.size = size
    padding = -size % tarfile.BLOCKSIZE
    return (
        gzip.compress(header.tobuf(tarfile.USTAR_FORMAT))
        + zeros_gzip(size // MiB)
        + gzip.compress(b"\0" * (size % MiB + padding + 2 * tarfile.BLOCKSIZE))
    )


def header_bomb() -> bytes:
    """A pax header that claims 8 GiB and inflates to 1 GiB of zeros: about 1 MB of gzip."""
    header, _ = member("././@PaxHeader", tarfile.XHDTYPE)
    header.size = 2**33 - 1
    return gzip.compress(header.tobuf(tarfile.USTAR_FORMAT)) + zeros_gzip(1024)


async def stored_codes(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        store = await nc.jetstream().object_store("code")
        return [info.name for info in await store.list()]
    except NotFoundError:  # no bucket, or an empty one
        return []
    finally:
        await nc.close()


@pytest.fixture
def api(tmp_path, nats_server):
    stack = Stack(root=tmp_path, nats=nats_server).start("dispatcher")
    yield stack
    stack.stop()


UNSAFE = [
    (
        "symlink to /etc/passwd",
        tar_gz(member("pw", tarfile.SYMTYPE, link="/etc/passwd")),
        "'pw' is a symbolic link to '/etc/passwd'",
    ),
    ("symlink to ../x", tar_gz(member("up", tarfile.SYMTYPE, link="../x")), "'up' is a symbolic link to '../x'"),
    (
        "hard link out",
        tar_gz(member("pw", tarfile.LNKTYPE, link="../../etc/passwd")),
        "'pw' is a hard link to '../../etc/passwd'",
    ),
    (
        "hard link inside",
        tar_gz(member("a.py", data=b"x"), member("b.py", tarfile.LNKTYPE, link="a.py")),
        "'b.py' is a hard link to 'a.py'",
    ),
    ("char device", tar_gz(member("null", tarfile.CHRTYPE)), "'null' is a character device"),
    ("fifo", tar_gz(member("pipe", tarfile.FIFOTYPE)), "'pipe' is a FIFO"),
    ("absolute", tar_gz(member("/tmp/evil.py", data=b"x")), "'/tmp/evil.py' would land outside the code directory"),
    ("dot dot", tar_gz(member("../evil.py", data=b"x")), "'../evil.py' would land outside the code directory"),
    (
        "too many",
        tar_gz(*(member(f"f{i:04d}") for i in range(MAX_FILES + 1))),
        f"'f{MAX_FILES:04d}' is past the limit of {MAX_FILES} files and directories",
    ),
]


def test_unsafe_archives_are_refused_with_the_member_and_nothing_is_stored(api):
    for what, archive, words in UNSAFE:  # one dispatcher for every case: the suite's time
        answer = api.rest("POST", "/code", content=archive, headers=GZIP)

        assert answer.status_code == 400, (what, answer.text)
        assert f"code archive member {words}" in answer.json()["error"], what
    assert asyncio.run(stored_codes(api.nats.url)) == []


def test_bombs_past_the_real_cap_are_refused_and_a_good_archive_still_goes_in(api):
    honest = honest_bomb(MAX_BYTES + MiB)  # a real 301 MiB file: refused by its declared size, unread
    bomb = header_bomb()
    assert len(honest) < 400_000 and len(bomb) < 1_200_000

    answer = api.rest("POST", "/code", content=honest, headers=GZIP)
    assert answer.status_code == 400, answer.text
    assert "member 'weights.bin' (301 MiB) takes the archive past 300 MiB of files" in answer.json()["error"]

    answer = api.rest("POST", "/code", content=bomb, headers=GZIP)
    assert answer.status_code == 400, answer.text
    assert "code archive expands to more than 31" in answer.json()["error"]
    assert "a decompression bomb" in answer.json()["error"]
    assert asyncio.run(stored_codes(api.nats.url)) == []

    good = tar_gz(member("trial.py", data=b"print('hi')\n"))
    answer = api.rest("POST", "/code", content=good, headers=GZIP)
    assert answer.status_code == 201, answer.text
    digest = hashlib.sha256(good).hexdigest()
    assert answer.json() == {"codeRef": f"sha256:{digest}"}
    assert asyncio.run(stored_codes(api.nats.url)) == [digest]


async def put_code(url: str, archive: bytes) -> str:
    """Store an archive straight in the ``code`` store, as an older dispatcher might have."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            store = await js.object_store("code")
        except NotFoundError:
            store = await js.create_object_store("code")
        digest = hashlib.sha256(archive).hexdigest()
        await store.put(digest, archive)
        return digest
    finally:
        await nc.close()


def test_a_trial_whose_snapshot_is_unsafe_fails_with_the_member_and_nothing_is_unpacked(stack):
    archive = tar_gz(member("trial.py", data=b"x"), member("pw", tarfile.SYMTYPE, link="/etc/passwd"))
    digest = asyncio.run(put_code(stack.nats.url, archive))
    experiment = create(
        stack,
        {
            "trialCommand": f"{sys.executable} trial.py",
            "trialCodeRef": f"sha256:{digest}",
            "trialConcurrency": 1,
            "trainingService": {"platform": "local"},
        },
    )

    trial = ended(stack, submit(stack, experiment, {"x": 1}))

    assert trial["status"] == "FAILED", trial
    assert "code archive member 'pw' is a symbolic link to '/etc/passwd'" in trial["message"]
    assert not [p for p in stack.root.rglob("*") if p.name in ("pw", "trial.py")], "nothing was unpacked"
