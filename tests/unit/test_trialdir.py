"""The trial directory's layout (services/adapters/trialdir.py), as every keeper-running adapter reads it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from services.adapters import trialdir


def attempt(root: Path, experiment: str, trial: str, number: int, reported: bool = False) -> str:
    path = trialdir.attempt_dir(str(root), experiment, trial, number)
    os.makedirs(f"{path}/{trialdir.META}")
    if reported:
        trialdir.mark_reported(path)
    return path


def test_names_parse_back_and_other_names_are_not_attempts() -> None:
    assert trialdir.parse_name("t-1-2") == ("t-1", 2)
    assert trialdir.parse_name("abc") is None
    assert trialdir.parse_name("-3") is None
    assert trialdir.parse_name("abc-x") is None


def test_unreported_attempts_are_what_a_restart_adopts(tmp_path: Path) -> None:
    running = attempt(tmp_path, "e1", "a", 0)
    attempt(tmp_path, "e1", "b", 0, reported=True)
    later = attempt(tmp_path, "e2", "c", 3)
    (tmp_path / "e2" / "notes.txt").write_text("not an attempt")

    assert trialdir.unreported(str(tmp_path)) == [("e1", "a", 0, running), ("e2", "c", 3, later)]


def test_the_newest_attempt_unless_one_is_named(tmp_path: Path) -> None:
    attempt(tmp_path, "e", "a", 0, reported=True)
    second = attempt(tmp_path, "e", "a", 1)
    attempt(tmp_path, "e", "ab", 5)

    assert trialdir.newest(str(tmp_path / "e"), "a") == (1, second)
    assert trialdir.newest(str(tmp_path / "e"), "a", 0) == (0, trialdir.attempt_dir(str(tmp_path), "e", "a", 0))
    assert trialdir.newest(str(tmp_path / "e"), "a", 7) is None
    assert trialdir.newest(str(tmp_path / "missing"), "a") is None


def test_marking_again_keeps_the_first_mark_so_expiry_does_not_move(tmp_path: Path) -> None:
    path = attempt(tmp_path, "e", "a", 0, reported=True)
    os.utime(f"{path}/{trialdir.REPORTED}", (1000, 1000))

    trialdir.mark_reported(path)

    assert trialdir.is_reported(path)
    assert os.path.getmtime(f"{path}/{trialdir.REPORTED}") == 1000


def test_expired_reported_attempts_go_and_running_ones_stay(tmp_path: Path) -> None:
    old = attempt(tmp_path, "e1", "a", 0, reported=True)
    os.utime(f"{old}/{trialdir.REPORTED}", (1000, 1000))
    fresh = attempt(tmp_path, "e2", "b", 0, reported=True)
    running = attempt(tmp_path, "e2", "c", 1)

    removed, kept = trialdir.remove_expired(str(tmp_path), deadline=time.time() - 60)

    assert removed == 1
    assert kept == {("e2", "c")}
    assert not os.path.exists(old) and not (tmp_path / "e1").exists()  # the emptied experiment folder too
    assert os.path.isdir(fresh) and os.path.isdir(running)
