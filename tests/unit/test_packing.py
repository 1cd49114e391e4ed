"""Code snapshots: the same files give the same bytes; .nniignore and NNI's limits hold."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from services.common.code import PackingError, is_ignored, pack_code, parse_ignore


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def members(archive: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return tar.getmembers()


def names(archive: bytes) -> list[str]:
    return [m.name for m in members(archive)]


def test_same_files_give_the_same_bytes_whatever_their_times_and_owners(tmp_path: Path) -> None:
    # Given a code directory and a copy of it made later, with other times
    files = {"trial.py": "print(1)\n", "lib/util.py": "X = 1\n", "lib/data/table.csv": "a,b\n"}
    first = make_tree(tmp_path / "one", files)
    second = make_tree(tmp_path / "two", dict(reversed(files.items())))
    for path in second.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))

    # When both are packed (one of them twice)
    a, b, c = pack_code(first), pack_code(first), pack_code(second)

    # Then the archives and refs are identical, and the ref is the sha256 of the bytes
    assert a == b == c
    assert a.ref.startswith("sha256:") and len(a.digest) == 64
    # and nothing in them depends on the machine or the moment
    assert a.data[4:8] == b"\0\0\0\0"  # gzip header mtime
    infos = members(a.data)
    assert [i.name for i in infos] == ["lib", "lib/data", "lib/data/table.csv", "lib/util.py", "trial.py"]
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0, 0, "", "")}


def test_a_changed_file_changes_the_ref(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"trial.py": "print(1)\n"})
    before = pack_code(root).ref
    (root / "trial.py").write_text("print(2)\n")
    assert pack_code(root).ref != before


def test_modes_are_normalised_but_the_executable_bit_is_kept(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"run.sh": "#!/bin/sh\n", "notes.txt": "x"})
    (root / "run.sh").chmod(0o700)
    (root / "notes.txt").chmod(0o600)
    modes = {i.name: i.mode for i in members(pack_code(root).data)}
    assert modes == {"notes.txt": 0o644, "run.sh": 0o755}


def test_the_archive_extracts_to_the_same_files(tmp_path: Path) -> None:
    files = {"trial.py": "import nni\n", "pkg/__init__.py": "", "pkg/model.py": "W = [1, 2]\n"}
    root = make_tree(tmp_path / "code", files)
    (root / "empty").mkdir()
    with tarfile.open(fileobj=io.BytesIO(pack_code(root).data), mode="r:gz") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    out = tmp_path / "out"
    assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()} == files
    assert (out / "empty").is_dir()


def test_nniignore_patterns_follow_gitignore_rules(tmp_path: Path) -> None:
    # Given a code directory with an .nniignore using comments, globs, anchors,
    # directory-only patterns, ** and a negation
    root = make_tree(
        tmp_path,
        {
            ".nniignore": "\n".join(
                [
                    "# caches and outputs",
                    "__pycache__/",
                    "*.log",
                    "!keep.log",
                    "/build",
                    "data/**/*.bin",
                    "checkpoints/",
                    "",
                ]
            ),
            "trial.py": "",
            "keep.log": "",
            "run.log": "",
            "src/__pycache__/m.pyc": "",
            "src/debug.log": "",
            "src/build/x.py": "",  # "/build" is anchored: only the top-level one goes
            "build/out.o": "",
            "data/a/b/w.bin": "",
            "data/a/readme.md": "",
            "checkpoints/epoch1.pt": "",
            "src/checkpoints": "a file, not a directory",
        },
    )
    assert names(pack_code(root).data) == [
        ".nniignore",
        "data",
        "data/a",
        "data/a/b",
        "data/a/readme.md",
        "keep.log",
        "src",
        "src/build",
        "src/build/x.py",
        "src/checkpoints",
        "trial.py",
    ]


def test_a_nested_nniignore_applies_to_its_own_folder(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        {
            "lib/.nniignore": "/generated\n*.tmp\n",
            "lib/generated/g.py": "",
            "lib/a.tmp": "",
            "lib/ok.py": "",
            "generated/kept.py": "",
            "b.tmp": "",
        },
    )
    assert names(pack_code(root).data) == [
        "b.tmp",
        "generated",
        "generated/kept.py",
        "lib",
        "lib/.nniignore",
        "lib/ok.py",
    ]


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "ignored"),
    [
        ("*.py", "a/b/c.py", False, True),
        ("a/*.py", "a/b/c.py", False, False),
        ("a/**/c.py", "a/c.py", False, True),
        ("**/c.py", "x/y/c.py", False, True),
        ("a/**", "a/b", False, True),
        ("model?.pt", "model1.pt", False, True),
        ("model[0-2].pt", "model3.pt", False, False),
        ("model[!0-2].pt", "model3.pt", False, True),
        ("logs/", "logs", False, False),
        ("logs/", "logs", True, True),
        (r"\#notes", "#notes", False, True),
    ],
)
def test_single_patterns(pattern: str, path: str, is_dir: bool, ignored: bool) -> None:
    assert is_ignored(parse_ignore(pattern), path, is_dir) is ignored


def test_too_many_files_is_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {f"f{i}.txt": "" for i in range(6)})
    with pytest.raises(PackingError, match=r"more than 5 files and directories.*\.nniignore"):
        pack_code(root, max_files=5)
    (root / ".nniignore").write_text("f*.txt\n")
    assert names(pack_code(root, max_files=5).data) == [".nniignore"]


def test_too_many_bytes_is_an_error(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"big.bin": "x" * 3000})
    with pytest.raises(PackingError, match=r"more than 0 MiB.*\.nniignore"):
        pack_code(root, max_bytes=2048)


def test_nni_limits_are_the_defaults(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {f"d/f{i}": "" for i in range(2000)})
    with pytest.raises(PackingError, match="more than 2000"):
        pack_code(root)  # 2000 files + their folder


def test_a_missing_directory_or_a_broken_link_is_named(tmp_path: Path) -> None:
    with pytest.raises(PackingError, match="is not a directory"):
        pack_code(tmp_path / "nope")
    root = make_tree(tmp_path / "code", {"trial.py": ""})
    (root / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(PackingError, match="dangling"):
        pack_code(root)


def test_links_are_followed_and_loops_refused(tmp_path: Path) -> None:
    shared = make_tree(tmp_path / "shared", {"util.py": "U = 1\n"})
    root = make_tree(tmp_path / "code", {"trial.py": ""})
    (root / "shared").symlink_to(shared)
    assert names(pack_code(root).data) == ["shared", "shared/util.py", "trial.py"]
    (root / "loop").symlink_to(root)
    with pytest.raises(PackingError, match="loop"):
        pack_code(root)


def test_the_gzip_stream_is_valid(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"trial.py": "x"})
    archive = pack_code(root).data
    assert gzip.decompress(archive)[:9] == b"trial.py\0"


def test_the_stack_data_directory_is_never_packed(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"trial.py": "", ".trialbus/nats/jetstream/x": "", "sub/.trialbus/kept.py": ""})
    assert names(pack_code(root).data) == ["sub", "sub/.trialbus", "sub/.trialbus/kept.py", "trial.py"]
