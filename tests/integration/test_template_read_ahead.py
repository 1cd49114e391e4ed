"""What a trial template reads ahead for its trials (``warm_trial.read_ahead``): the script compiled
once and its folder listed once, used by a trial only while the file is still the one read."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

from services.trial_keeper import trial_template
from tests.fixtures.warm import PYTHON, code, host  # noqa: F401 - fixtures

WARM_TRIAL = Path(trial_template.__file__).with_name("warm_trial.py")


@pytest.fixture
def warm_trial():
    """A fresh copy of the trial side's module, as a template loads it (by path)."""
    found = importlib.util.spec_from_file_location("_warm_trial_under_test", WARM_TRIAL)
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def settled(path: Path, text: str) -> Path:
    """``path`` written with ``text``, once its change is older than a template's margin."""
    path.write_text(text)
    time.sleep(0.1)
    return path


def test_a_script_changed_in_place_after_it_was_read_ahead_runs_its_new_code(host, code):
    script = settled(code / "versioned.py", "print('version 1')\n")
    first = host.warm(f"{PYTHON} versioned.py")  # the template reads it ahead before forking this one
    assert first.wait()["exitCode"] == 0 and first.out() == "version 1\n"
    template = host.pool.current[first.template].process.pid
    before = script.stat()
    script.write_text("print('version 2')\n")  # same size, same inode: only its change time moves
    assert (script.stat().st_size, script.stat().st_ino) == (before.st_size, before.st_ino)
    os.utime(script, ns=(before.st_atime_ns, before.st_mtime_ns))  # even with its old modification time
    second = host.warm(f"{PYTHON} versioned.py")
    assert second.wait()["exitCode"] == 0 and second.out() == "version 2\n"
    assert host.pool.current[second.template].process.pid == template and second.state()["warm"] is True


def test_a_module_added_beside_a_read_ahead_script_still_sends_the_trial_cold(host, code):
    settled(code / "uses_json.py", "import json\nprint(json.VALUE)\n")
    first = host.warm(f"{PYTHON} uses_json.py")
    assert first.wait()["exitCode"] == 1 and "AttributeError" in first.err()  # the real json: no VALUE
    (code / "json.py").write_text("VALUE = 'the trial folder json'\n")  # now it shadows the loaded json
    second = host.warm(f"{PYTHON} uses_json.py")
    assert second.wait()["exitCode"] == 0, second.err()
    assert second.out() == "the trial folder json\n"
    assert "shadows the loaded module json" in (second.dir / ".trialbus/keeper.log").read_text()


def test_a_syntax_error_reads_as_in_a_cold_run(host, code):
    settled(code / "broken.py", "print('never')\ndef (:\n")
    cold, warm = host.cold(f"{PYTHON} broken.py"), host.warm(f"{PYTHON} broken.py")
    assert cold.wait()["exitCode"] == warm.wait()["exitCode"] == 1
    assert warm.err() == cold.err() and "SyntaxError" in warm.err()
    assert warm.state()["warm"] is True


def test_a_warm_trial_shows_its_own_command_line_to_ps(host, code):
    settled(code / "cmdline.py", "print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:3])\n")
    cold, warm = host.cold(f"{PYTHON} cmdline.py a"), host.warm(f"{PYTHON} cmdline.py a")
    assert cold.wait()["exitCode"] == warm.wait()["exitCode"] == 0
    assert warm.out() == cold.out() == f"[{PYTHON.encode()!r}, b'cmdline.py', b'a']\n"


def test_only_a_file_that_settled_is_read_ahead_and_only_while_it_is_unchanged(warm_trial, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the template's working directory: the code's
    fresh = tmp_path / "fresh.py"
    fresh.write_text("X = 1\n")
    plan = {"script": "fresh.py", "args": []}
    assert warm_trial.read_ahead(plan) is False  # changed just now: a later change could go unseen
    assert warm_trial.READ_AHEAD == {}
    time.sleep(0.1)
    assert warm_trial.read_ahead(plan) is True
    compiled, folder = warm_trial.script(str(fresh), fresh.stat())
    assert warm_trial.script(str(fresh), fresh.stat())[0] is compiled and folder == str(tmp_path)  # read ahead
    namespace: dict = {}
    exec(compiled, namespace)  # noqa: S102
    assert namespace["X"] == 1
    fresh.write_text("X = 2\n")
    again = warm_trial.script(str(fresh), fresh.stat())[0]
    assert again is not compiled
    namespace = {}
    exec(again, namespace)  # noqa: S102
    assert namespace["X"] == 2
    assert "fresh" in warm_trial.module_names(str(tmp_path))
    (tmp_path / "added.py").write_text("")
    assert "added" in warm_trial.module_names(str(tmp_path))  # the folder changed: listed again


def test_a_script_that_cannot_be_read_ahead_is_left_to_each_trial(warm_trial, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert warm_trial.read_ahead({"script": "missing.py", "args": []}) is True
    (tmp_path / "bad.py").write_text("def (:\n")
    time.sleep(0.1)
    assert warm_trial.read_ahead({"script": "bad.py", "args": []}) is True
    assert warm_trial.read_ahead({"module": "anything", "args": []}) is True
    assert warm_trial.READ_AHEAD == {}
