"""Code archives are untrusted input: what check_archive and extract_code accept and refuse.

Every refusal names the member, writes nothing (not in the target, not beside it, not
outside it), and a bomb is refused after reading about as much as the cap allows.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from services.common import code_archive
from services.common.code import MAX_BYTES, pack_code
from services.common.code_archive import UnsafeArchive, check_archive, extract_code

ONLY_FILES = "holds only regular files and directories"
OUTSIDE = "would land outside the code directory"
Member = tuple[tarfile.TarInfo, bytes]


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    return info, data


def tar_gz(*members: Member) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def header_bomb(declared: int, inflated_mib: int, then: bytes = b"") -> bytes:
    """A gzip whose tar stream starts with a pax header that claims ``declared`` bytes, then
    ``inflated_mib`` MiB of zeros (a 1 MiB gzip member of zeros, about 1 KB, repeated), then ``then``."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, declared
    zeros = gzip.compress(b"\0" * (1 << 20))
    return gzip.compress(header.tobuf(tarfile.USTAR_FORMAT)) + zeros * inflated_mib + then


def refused(data: bytes, target: Path, **limits) -> str:
    """The message of both refusals (check and unpack), after checking nothing was written."""
    with pytest.raises(UnsafeArchive) as checked:
        check_archive(data, **limits)
    with pytest.raises(UnsafeArchive) as unpacked:
        extract_code(data, target / "code", **limits)
    assert os.listdir(target) == [], "a refused archive leaves nothing, not even a temporary folder"
    assert str(checked.value) == str(unpacked.value)
    return str(checked.value)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """Where archives are unpacked (``target/code``); ``tmp_path`` around it is "outside"."""
    (tmp_path / "in").mkdir()
    return tmp_path / "in"


def test_a_packed_code_directory_is_accepted_and_unpacks_to_its_files(tmp_path, target):
    code = tmp_path / "src"
    (code / "pkg").mkdir(parents=True)
    (code / "trial.py").write_text("print('hi')\n")
    (code / "run.sh").write_text("#!/bin/sh\n")
    (code / "run.sh").chmod(0o755)
    (code / "pkg" / "data.txt").write_text("data\n")
    archive = pack_code(code)

    assert check_archive(archive.data) == archive.ref
    extract_code(archive.data, target / "code")

    files = sorted(str(p.relative_to(target / "code")) for p in (target / "code").rglob("*"))
    assert files == ["pkg", "pkg/data.txt", "run.sh", "trial.py"]
    assert (target / "code" / "pkg" / "data.txt").read_text() == "data\n"
    assert os.access(target / "code" / "run.sh", os.X_OK) and not os.access(target / "code" / "trial.py", os.X_OK)
    assert os.listdir(target) == ["code"], "no temporary folder is left beside it"


def test_an_archive_made_by_tar_with_dot_slash_names_is_accepted(target):
    data = tar_gz(member("./", tarfile.DIRTYPE), member("./pkg/", tarfile.DIRTYPE), member("./pkg/a.py", data=b"a"))

    check_archive(data)
    extract_code(data, target / "code")

    assert (target / "code" / "pkg" / "a.py").read_bytes() == b"a"


A_PY = member("a.py", data=b"a")
UNSAFE = [
    # (what, members, words after "code archive member ")
    (
        "symlink to /etc/passwd",
        [member("pw", tarfile.SYMTYPE, link="/etc/passwd")],
        f"'pw' is a symbolic link to '/etc/passwd': a code snapshot {ONLY_FILES}",
    ),
    ("symlink to ../x", [member("up", tarfile.SYMTYPE, link="../x")], "'up' is a symbolic link to '../x'"),
    # packing follows links and never writes one, so a link inside the tree is refused too
    ("symlink inside", [A_PY, member("b.py", tarfile.SYMTYPE, link="a.py")], "'b.py' is a symbolic link to 'a.py'"),
    (
        "hard link out",
        [member("pw", tarfile.LNKTYPE, link="../../etc/passwd")],
        "'pw' is a hard link to '../../etc/passwd'",
    ),
    ("hard link inside", [A_PY, member("b.py", tarfile.LNKTYPE, link="a.py")], "'b.py' is a hard link to 'a.py'"),
    ("char device", [member("tty", tarfile.CHRTYPE)], f"'tty' is a character device: a code snapshot {ONLY_FILES}"),
    ("block device", [member("disk", tarfile.BLKTYPE)], "'disk' is a block device"),
    ("fifo", [member("pipe", tarfile.FIFOTYPE)], f"'pipe' is a FIFO: a code snapshot {ONLY_FILES}"),
    ("unknown type", [member("odd", b"Z")], "'odd' is of tar type b'Z'"),
    ("absolute", [member("/etc/cron.d/evil", data=b"x")], f"'/etc/cron.d/evil' {OUTSIDE}"),
    ("dot dot", [member("../escape.py", data=b"x")], f"'../escape.py' {OUTSIDE}"),
    ("dot dot inside", [member("pkg/../../up.py", data=b"x")], f"'pkg/../../up.py' {OUTSIDE}"),
    (
        "under a file",
        [member("a", data=b"x"), member("a/b.py", data=b"y")],
        "'a/b.py' is inside 'a', which the archive has as a file",
    ),
    ("file and dir", [member("a", tarfile.DIRTYPE), member("a", data=b"x")], "'a' is in the archive twice"),
]


@pytest.mark.parametrize(("members", "words"), [pytest.param(m, w, id=i) for i, m, w in UNSAFE])
def test_unsafe_members_are_refused_by_name_and_nothing_is_written(tmp_path, target, members, words):
    message = refused(tar_gz(*members), target)

    assert f"code archive member {words}" in message
    assert sorted(os.listdir(tmp_path)) == ["in"], "nothing lands outside the target either"


def test_more_members_than_the_limit_are_refused_at_the_first_one_past_it(target):
    data = tar_gz(*(member(f"f{i}.py", data=b"x") for i in range(4)))

    check_archive(data, max_files=4)
    assert "member 'f3.py' is past the limit of 3 files and directories" in refused(data, target, max_files=3)


def test_files_past_the_size_cap_are_refused_by_their_declared_size(target):
    data = tar_gz(member("a.bin", data=b"\0" * 600), member("b.bin", data=b"\0" * 600))

    check_archive(data, max_bytes=1200)
    message = refused(data, target, max_bytes=1000)

    assert "member 'b.bin' (600 bytes) takes the archive past 1000 bytes of files" in message


def test_a_small_gzip_that_expands_past_the_cap_is_refused_after_reading_about_the_cap(target):
    # 10 KB of gzip claiming an 8 GiB header, followed by 10 MiB of zeros and then garbage:
    # a reader that went past about the cap would report the garbage, not the bomb
    data = header_bomb(2**33 - 1, 10, then=b"not gzip at all")
    assert len(data) < 12_000

    message = refused(data, target, max_files=5, max_bytes=10_000)

    assert "code archive expands to more than" in message and "a decompression bomb" in message
    assert "at its first member" in message and "at most 10000 bytes of files" in message


def test_a_bomb_after_the_last_member_is_refused_too(target):
    zeros = gzip.compress(b"\0" * (1 << 20))
    data = tar_gz(member("trial.py", data=b"print(1)\n")) + zeros * 2  # a valid tar, then 2 MiB more

    message = refused(data, target, max_files=5, max_bytes=10_000)

    assert "expands to more than" in message and "after the end of its tar data" in message


def test_the_real_cap_bounds_a_gigabyte_bomb_in_time_and_memory():
    data = header_bomb(2**33 - 1, 1024)  # about 1 MB of gzip, 1 GiB once inflated
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeArchive, match=r"expands to more than 31\d MiB"):
            check_archive(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < len(data) + 16 * 1024 * 1024, f"inflated in memory: {peak} bytes at peak"
    assert MAX_BYTES == 300 * 1024 * 1024


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"this is not a tar.gz", "not a tar.gz of a code directory"),
        (gzip.compress(b"x" * 5000), "not a tar.gz of a code directory"),
        (tar_gz(member("a.py", data=b"a" * 5000))[:-40], "not a tar.gz of a code directory"),
    ],
    ids=["not gzip", "gzip, not tar", "truncated"],
)
def test_what_is_not_a_tar_gz_is_refused(target, data, words):
    assert words in refused(data, target)


@pytest.mark.parametrize("filters", [True, False], ids=["python-filters", "without-filters"])
def test_unpacked_files_are_ours_without_setuid_or_write_for_others_with_or_without_pythons_filters(tmp_path, filters):
    """Debian bookworm's own Python 3.11.2 has no tarfile extraction filters (the image built on it
    runs without them): the unpacking does what the "data" filter would, either way."""
    script, folder = member("run.sh", data=b"echo hi\n"), member("sub", tarfile.DIRTYPE)
    script[0].mode, folder[0].mode = 0o6777, 0o1777
    script[0].uid = folder[0].uid = 4242
    data = tar_gz(folder, script)
    dest = tmp_path / "out"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for info in tar:
            code_archive._extract(tar, info, dest, filters=filters)
    assert (dest / "run.sh").read_bytes() == b"echo hi\n"
    assert (dest / "run.sh").stat().st_mode & 0o7777 == 0o755, "no setuid/setgid, no write for others"
    assert (dest / "sub").stat().st_mode & 0o7777 == 0o755, "no sticky bit, no write for others"
    assert (dest / "run.sh").stat().st_uid == os.getuid(), "owned by whoever unpacks it, never the archive's uid"
