"""The pool of warm templates (``warm_pool.py``) as adapters use it: which template a trial forks
from, what it preloads (read ahead, learned, never a GPU), and what happens when one dies."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.warm import PYTHON, code, host  # noqa: F401 - fixtures


def test_the_template_learns_what_trials_import(host, code, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "heavy.py").write_text("import time\ntime.sleep(0.3)  # an import worth preloading\n")
    host.env["PYTHONPATH"] = str(site)
    # (an import the script's source does not show: learned, never read ahead)
    (code / "uses_heavy.py").write_text("import sys\nprint('heavy' in sys.modules)\n__import__('heavy')\n")
    first = host.warm(f"{PYTHON} uses_heavy.py")
    first.wait()
    assert first.out() == "False\n"
    assert "heavy" in (first.dir / ".trialbus/imports").read_text().split()
    guessed = host.pool.next.get(first.template)  # (what the script's source shows: sys)
    assert guessed is None or guessed.wait_ready(30)
    template = host.pool.template_for(f"{PYTHON} uses_heavy.py", host.environ(f"{PYTHON} uses_heavy.py")[1])
    host.pool.learn(first.template, str(first.dir))
    assert template.wait_ready(30), host.template_log(template)
    second = host.warm(f"{PYTHON} uses_heavy.py")
    second.wait()
    assert second.out() == "True\n"
    assert not (second.dir / ".trialbus/imports").exists()  # nothing new to learn
    assert host.pool.current[first.template] is template and template.process.poll() is None  # learned in place


def test_a_template_learns_in_place_and_trials_wait_while_it_imports(host, code, tmp_path):
    # A site with a package the template preloads, and a submodule of it a trial imported lazily,
    # slow to import: the template is still importing it when the next trial comes.
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg" / "lazy.py").write_text("import time\ntime.sleep(1)\n")
    host.env["PYTHONPATH"] = str(site)
    command = f"{PYTHON} probe.py"
    first = host.warm(command, preload=["pkg"])
    assert first.wait()["exitCode"] == 0
    _, environ = host.environ(command)
    guessed = host.pool.next.get(first.template)  # from the script's own imports, at the first trial
    assert guessed is None or guessed.wait_ready(30)
    template = host.pool.template_for(command, environ, ["pkg"])  # swapped in: nothing on its way
    assert first.template not in host.pool.next and template.poll() == "ready"
    pid, loaded = template.process.pid, len(template.preload)

    trial_dir = tmp_path / "learned"
    (trial_dir / ".trialbus").mkdir(parents=True)
    (trial_dir / ".trialbus" / "imports").write_text("pkg.lazy\nimportlib.readers\n")
    host.pool.learn(first.template, str(trial_dir))
    assert host.pool.waiting(command, environ, ["pkg"]) is template  # importing: trials wait for it
    assert template.wait_ready(30), host.template_log(template)
    assert template.process.pid == pid and template.preload[loaded:] == ["importlib.readers", "pkg.lazy"]
    assert host.pool.waiting(command, environ, ["pkg"]) is None and first.template not in host.pool.next
    (code / "lazy.py").write_text("import sys\nprint('pkg.lazy' in sys.modules)\n")
    after = host.warm(f"{PYTHON} lazy.py", preload=["pkg"])  # (the script is not part of the key)
    assert after.wait()["exitCode"] == 0 and after.template == first.template and after.out() == "True\n"


def test_a_template_that_dies_is_replaced_and_said(host, code):
    first = host.warm(f"{PYTHON} probe.py")
    first.wait()
    guessed = host.pool.next.pop(first.template)  # the one its imports, read ahead, would bring
    guessed.close()
    template = host.pool.current[first.template]
    os.kill(template.process.pid, signal.SIGKILL)
    template.process.wait()
    _, environ = host.environ(f"{PYTHON} probe.py")
    with pytest.raises(OSError):
        template.fork(environ)  # what the adapter then does: start the trial cold
    second = host.warm(f"{PYTHON} probe.py")
    assert second.wait()["exitCode"] == 0
    assert any("is gone" in line for line in host.logs)


def test_commands_that_are_not_a_python_script_start_cold(host, code):
    for command in (
        "/bin/echo hi",
        f"{PYTHON} -c print(1)",
        f"{PYTHON} probe.py > out.txt",
        "probe.py",
        f"{PYTHON} -i probe.py",
    ):
        _, environ = host.environ(command)
        assert host.pool.template_for(command, environ) is None, command


def test_a_different_interpreter_or_environment_gets_its_own_template(host, code):
    a = host.warm(f"{PYTHON} probe.py")
    b = host.warm(f"{PYTHON} -u probe.py")
    c = host.warm(f"{PYTHON} probe.py", USER_SETTING="1")
    d = host.warm(f"{PYTHON} probe.py", TRIALBUS_GPUS="0")  # GPU placement is per trial: same template
    assert all(t.wait()["exitCode"] == 0 for t in (a, b, c, d))
    assert len({a.template, b.template, c.template}) == 3 and d.template == a.template
    assert c.probe()["env"]["USER_SETTING"] == "1" and d.probe()["env"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_key_is_found_once_per_command_and_environment(host, code):
    command = f"{PYTHON} probe.py"
    (_, first), (_, second) = host.environ(command), host.environ(command)  # two trials: ids, dirs, parameters
    assert first["TRIALBUS_TRIAL_ID"] != second["TRIALBUS_TRIAL_ID"]
    assert host.pool.key_of(command, first) is host.pool.key_of(command, second)  # found once, for both
    _, other = host.environ(command, USER_SETTING="1")
    assert host.pool.key_of(command, other)[0] != host.pool.key_of(command, first)[0]
    assert host.pool.key_of(f"{PYTHON} -u probe.py", first)[0] != host.pool.key_of(command, first)[0]


def test_a_template_is_keyed_by_the_user_it_runs_as(host, code):
    # (an adapter running as root runs each team's trials as a user of its own: TRIALBUS_RUN_AS)
    command = f"{PYTHON} probe.py"
    _, alone = host.environ(command)
    _, team_a = host.environ(command, TRIALBUS_RUN_AS="54321:54321:54321,54300")
    _, team_b = host.environ(command, TRIALBUS_RUN_AS="54322:54322:54322,54300")
    keys = {host.pool.key_of(command, environ)[0] for environ in (alone, team_a, team_b)}
    assert len(keys) == 3  # a trial never forks from a template of another user
    assert host.pool.users[host.pool.key_of(command, team_a)[0]] == (54321, 54321, (54321, 54300))
    assert host.pool.users[host.pool.key_of(command, alone)[0]] is None  # the caller's own
    _, own = host.environ(command, TRIALBUS_RUN_AS=f"{os.geteuid()}:{os.getegid()}:")
    assert host.pool.users[host.pool.key_of(command, own)[0]] is None  # no switch to itself


@pytest.fixture
def gpu_init(host, tmp_path):
    """A module ``gpu_init`` on the trials' path whose import opens a stand-in GPU device file, as cuInit opens
    /dev/nvidiactl (the template's check looks for open files under /dev/nvidia)."""
    if os.geteuid() != 0:  # /dev is root's: a stand-in device file cannot be made otherwise
        if os.environ.get("CI") == "true":
            pytest.fail("this test makes a stand-in GPU device file under /dev: run it as root")
        pytest.skip("making a stand-in GPU device file under /dev needs root")
    device = Path(f"/dev/nvidia-trialbus-test-{os.getpid()}")
    device.write_bytes(b"")
    site = tmp_path / "site"
    site.mkdir()
    (site / "gpu_init.py").write_text(f"HANDLE = open({str(device)!r})\n")
    host.env["PYTHONPATH"] = str(site)
    yield
    device.unlink(missing_ok=True)


def test_an_import_that_opens_a_gpu_is_never_preloaded(host, code, gpu_init):
    (code / "uses_gpu.py").write_text("import sys\nprint('gpu_init' in sys.modules)\nimport gpu_init\n")
    _, environ = host.environ(f"{PYTHON} uses_gpu.py")
    template = host.pool.template_for(f"{PYTHON} uses_gpu.py", environ, ["gpu_init"])
    assert not template.wait_ready(30) and template.unsafe == "gpu_init"
    trial = host.warm(f"{PYTHON} uses_gpu.py")  # the next template leaves it out
    assert trial.wait()["exitCode"] == 0 and trial.out() == "False\n"
    assert any("gpu_init" in line for line in host.logs)


def test_a_learned_import_that_opens_a_gpu_ends_its_template_and_is_never_preloaded(host, code, gpu_init):
    command = f"{PYTHON} lazy_gpu.py"  # (imported lazily: learned from the trial, not read ahead)
    (code / "lazy_gpu.py").write_text("import sys\nprint('gpu_init' in sys.modules)\n__import__('gpu_init')\n")
    first = host.warm(command)
    assert first.wait()["exitCode"] == 0 and first.out() == "False\n"
    guessed = host.pool.next.get(first.template)
    assert guessed is None or guessed.wait_ready(30)
    template = host.pool.template_for(command, host.environ(command)[1])
    host.pool.learn(first.template, str(first.dir))
    assert not template.wait_ready(30) and template.unsafe == "gpu_init"
    template.process.wait(10)  # gone: no trial forks from it any more (the pool ends it if it has not)
    assert template.state == "dead"
    trial = host.warm(command)  # a new template, without it
    assert trial.wait()["exitCode"] == 0 and trial.out() == "False\n"
    assert host.pool.current[first.template] is not template
    assert any("gpu_init touched a GPU" in line for line in host.logs), host.logs


def test_a_template_that_cannot_start_is_given_up_and_its_trials_start_cold(host, code, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "crasher.py").write_text("import os\nos._exit(9)  # kills whatever imports it\n")
    host.env["PYTHONPATH"] = str(site)
    command = f"{PYTHON} probe.py"
    for _ in range(2):
        _, environ = host.environ(command)
        template = host.pool.template_for(command, environ, ["crasher"])
        assert template is not None and not template.wait_ready(30)
    _, environ = host.environ(command)
    assert host.pool.template_for(command, environ, ["crasher"]) is None  # cold from now on
    assert any("failed to start twice" in line and "template.log" in line for line in host.logs), host.logs
    trial = host.cold(command)  # what the adapter then does
    assert trial.wait()["exitCode"] == 0


def test_the_scripts_own_imports_are_read_ahead_for_the_next_template(host, code, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "slow_import.py").write_text("import time\ntime.sleep(0.2)\n")
    host.env["PYTHONPATH"] = str(site)
    runs = tmp_path / "model-runs"
    (code / "model.py").write_text(f"import slow_import\nopen({str(runs)!r}, 'a').write('ran\\n')\n")  # own code: read
    (code / "reads.py").write_text("import sys\nprint('slow_import' in sys.modules)\nimport model\n")
    _, environ = host.environ(f"{PYTHON} reads.py")
    bare = host.pool.template_for(f"{PYTHON} reads.py", environ)
    guessed = host.pool.next[bare.key]  # started at once, before any trial ran
    assert guessed.wait_ready(30) and "slow_import" in guessed.preload and "model" in guessed.preload
    trial = host.warm(f"{PYTHON} reads.py")
    assert trial.wait()["exitCode"] == 0 and trial.out() == "True\n"
    assert runs.read_text() == "ran\n"  # by the trial only: the template never runs the trial's code


def test_an_import_that_initialises_torch_cuda_is_never_preloaded(host, code, tmp_path):
    # torch's own word, as the template asks it: a stand-in torch.cuda that says it is initialised
    site = tmp_path / "site"
    site.mkdir()
    (site / "cuda_user.py").write_text(
        "import sys, types\n"
        "sys.modules['torch.cuda'] = types.SimpleNamespace(is_initialized=lambda: True)  # as after torch.cuda.init()\n"
    )
    host.env["PYTHONPATH"] = str(site)
    (code / "plain.py").write_text("import sys\nprint('cuda_user' in sys.modules)\n")
    _, environ = host.environ(f"{PYTHON} plain.py")
    template = host.pool.template_for(f"{PYTHON} plain.py", environ, ["cuda_user"])
    assert not template.wait_ready(30) and template.unsafe == "cuda_user"
    trial = host.warm(f"{PYTHON} plain.py")
    assert trial.wait()["exitCode"] == 0 and trial.out() == "False\n"


def test_experiments_of_the_same_code_and_environment_share_a_template_and_no_other(host, code, tmp_path):
    other_code = tmp_path / "other-code"
    other_code.mkdir()
    (other_code / "probe.py").write_text((code / "probe.py").read_text())
    command = f"{PYTHON} probe.py"
    first = host.warm(command)
    second = host.warm(command, TRIALBUS_EXPERIMENT_ID="exp2")  # another experiment of the same code
    setting = host.warm(command, TRIALBUS_EXPERIMENT_ID="exp3", USER_SETTING="1")
    moved = host.warm(command, TRIALBUS_EXPERIMENT_ID="exp4", TRIALBUS_CODE_DIR=str(other_code))
    assert all(t.wait()["exitCode"] == 0 for t in (first, second, setting, moved))
    assert first.template == second.template
    assert len({first.template, setting.template, moved.template}) == 3
    # Each trial sees its own experiment, never the one whose trial started the template
    assert [t.probe()["env"]["NNI_EXP_ID"] for t in (first, second)] == ["exp1", "exp2"]


def test_a_starting_template_is_stalled_only_while_it_uses_no_cpu(host, code, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "busy.py").write_text("import time\nend = time.process_time() + 4\nwhile time.process_time() < end: pass\n")
    (site / "hung.py").write_text("import time\ntime.sleep(60)\n")
    host.env["PYTHONPATH"] = str(site)
    command = f"{PYTHON} probe.py"
    busy = host.pool.template_for(command, host.environ(command)[1], ["busy"])
    hung = host.pool.template_for(command, host.environ(command, USER_SETTING="1")[1], ["hung"])
    stalled = {"busy": False, "hung": False}
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # (busy imports for 4 s of CPU: it is still starting)
        assert busy.poll() == hung.poll() == "starting"
        stalled = {"busy": stalled["busy"] or busy.stalled(1.0), "hung": hung.stalled(1.0)}
        time.sleep(0.02)
    assert stalled == {"busy": False, "hung": True}
