"""Trials cannot read the stack's secrets: an adapter running as root runs each trial — its keeper,
the keeper zygote and the warm templates that import the trial's code — as an unprivileged user of
its team, ``trialbus-t-<team>`` (``TRIALBUS_TRIAL_USER=auto``, docs/security.md). A trial tries to
read what it must not (the stack's credentials as ``trialbus up`` writes them, the adapter's
environment, a finished experiment's trial directory, another team's running trial) and reports
what it could; it still writes its own directory and checkpoints, reports metrics, and is canceled
like any trial.

Needs root (skipped otherwise: the decision an adapter that is not root takes is in
tests/unit/test_trial_users.py) and an interpreter the trial user may run.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import stat
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest

from contracts.people import ADMIN_TEAM
from services.adapters.local_gpu.users import DEFAULT_USER, SHARED_GROUP, team_user_name
from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, wait_until
from tests.e2e.test_people import add, as_
from tests.e2e.test_warm_start import templates, trial_dir, warm_of
from tests.fixtures.nats import require_binary
from tests.fixtures.stack import Stack
from trialbus import local
from trialbus.stack import credentials

USER = team_user_name(ADMIN_TEAM)  # (the stack's token is its admin's, of team admins)
#: What the trial tries; each answer is "ok" or the exception's name.
TRIAL = textwrap.dedent(
    """
    import json, os, time
    import nni

    params = nni.get_next_parameter()

    def attempt(path, write=False):
        try:
            if path.endswith("/"):
                os.listdir(path)
            else:
                with open(path, "w" if write else "r") as f:
                    f.write("mine") if write else f.read()
            return "ok"
        except OSError as exc:
            return type(exc).__name__

    progress = os.path.join(os.environ["TRIALBUS_CHECKPOINT_DIR"], "progress")
    previous = open(progress).read() if os.path.exists(progress) else ""
    with open(progress, "w") as f:
        f.write(os.environ["TRIALBUS_ATTEMPT"])
    if params.get("fail_first") and not previous:
        raise SystemExit(3)
    seen = {name: attempt(path) for name, path in params.get("read", {}).items()}
    seen["previous"] = previous
    seen["own dir"] = attempt(os.path.join(os.environ["NNI_OUTPUT_DIR"], "mine.txt"), write=True)
    seen["checkpoint"] = attempt(os.path.join(os.environ["TRIALBUS_CHECKPOINT_DIR"], "step"), write=True)
    seen["uid"], seen["groups"] = os.getuid(), json.dumps(sorted(os.getgroups()))
    seen["env"] = json.dumps(sorted(k for k in os.environ if k.startswith("TRIALBUS_")))
    nni.report_intermediate_result(1)
    time.sleep(params.get("sleep", 0))
    nni.report_final_result({"default": 1, **seen})
    """
)


def python_for_others() -> str | None:
    """An interpreter every user may run (this one may live under a private home: /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(os.path.realpath(candidate))
        if not path.is_file():
            continue
        if path.stat().st_mode & 0o005 == 0o005 and all(p.stat().st_mode & 0o001 for p in path.parents):
            return str(path)
    return None


@pytest.fixture(params=["zygote and templates"])
def isolated(nats_server, stacks, request):
    """A stack whose adapter runs as root with ``TRIALBUS_TRIAL_USER=auto``, in a folder others may pass
    through (pytest's own are private), with the credentials ``trialbus up`` writes in its data dir.
    Its keepers start from the zygote and warm templates, or (``cold``) each as a new interpreter."""
    if os.geteuid() != 0:  # a laptop's user cannot switch users; CI runs as root, where this must run
        require_binary(None, "root (to run trials as another user)")
    python = require_binary(python_for_others(), "a Python interpreter that another user may run")
    root = Path(tempfile.mkdtemp(prefix="trialbus-isolation-"))
    root.chmod(0o711)
    code = root / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    cold = {"TRIALBUS_KEEPER_ZYGOTE": "false", "TRIALBUS_WARM_START": "false"} if request.param == "cold" else {}
    stack = Stack(root=root, nats=nats_server, extra_env={"TRIALBUS_TRIAL_USER": "auto", **cold})
    data = root / "data"
    data.mkdir()
    credentials.secret_file(data / "api-token", lambda: stack.token)  # as `trialbus up` writes them
    stack_file = local.LocalStack(
        nats_url=nats_server.url, nats_user="client", nats_password="p" * 16, api_url=stack.api, webui_url=stack.webui
    )
    local.write(data, stack_file)
    stacks.append(stack)
    stack.start()
    yield stack, code, python
    shutil.rmtree(root, ignore_errors=True)


def work_dir(stack: Stack) -> Path:
    return stack.root / "data" / "local-gpu" / "test-host"


def keeper_uid(stack: Stack, experiment: str, trial_id: str) -> int:
    """The user the trial's keeper runs as; -1 before it started, or once it ended."""
    try:
        state = json.loads((work_dir(stack) / "trials" / experiment / f"{trial_id}-0/.trialbus/state.json").read_text())
    except (OSError, ValueError):
        return -1
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(state["keeperPid"]).uids().real
    return -1


def uid_of(name: str) -> int:
    """The uid of user ``name``; -2 while there is none (a team's is created on its first trial)."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return -2


def process_uid(stack: Stack, experiment: str, trial_id: str, pid_of: str) -> int:
    """The real uid of the trial's process ``pid_of`` (``keeperPid``, ``trialPid``) in ``/proc``; -1 when gone."""
    with contextlib.suppress(OSError, ValueError, KeyError, StopIteration):  # (not yet started, or ended)
        state = json.loads((work_dir(stack) / "trials" / experiment / f"{trial_id}-0/.trialbus/state.json").read_text())
        status = Path(f"/proc/{state[pid_of]}/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Uid:")).split()[1])
    return -1


def test_a_trial_reads_none_of_the_stacks_secrets_nor_a_finished_experiments_files(isolated):
    stack, code, python = isolated
    pwd.getpwnam(DEFAULT_USER)  # created by the adapter as it started (for experiments without a team)
    command = f"{python} trial.py"
    # Given a finished experiment whose trial wrote its files
    first = create(stack, config(code, trialCommand=command, trialConcurrency=1, experimentName="first"))
    done = submit(stack, first, {})
    assert ended(stack, done)["status"] == "SUCCEEDED"
    trial_user = pwd.getpwnam(USER)  # created by the adapter as its team's first trial started
    finished = trial_dir(stack, first, done)
    # (taken back once its end is published)
    wait_until(lambda: finished.stat().st_uid == 0, 10, "the finished trial's directory to be the adapter's")
    assert (finished / "mine.txt").read_text() == "mine"
    data = stack.root / "data"
    reads = {
        "client.json": str(data / "client.json"),
        "api-token": str(data / "api-token"),
        "adapter environ": f"/proc/{stack.procs['adapter'].pid}/environ",
        "finished stdout": str(finished / "stdout"),
        "finished parameters": str(finished / "parameter.cfg"),
        "trials listing": f"{work_dir(stack)}/trials/",
        "code listing": f"{work_dir(stack)}/code/",
    }
    # When a trial of another experiment tries to read them, warm (forked from a template) and cold
    for warm in (True, False):
        experiment = create(
            stack, config(code, trialCommand=command, trialConcurrency=1, warmStart=warm, experimentName=f"w{warm}")
        )
        trial_id = submit(stack, experiment, {"read": reads})
        body = ended(stack, trial_id, 90)
        assert body["status"] == "SUCCEEDED", body
        seen = body["finalMetric"]
        # Then every read fails with PermissionError
        assert {name: seen[name] for name in reads} == dict.fromkeys(reads, "PermissionError"), seen
        # And it ran as the trial user, with none of root's groups, and wrote its own files
        assert seen["uid"] == trial_user.pw_uid != 0
        assert 0 not in json.loads(seen["groups"])
        assert grp.getgrnam(SHARED_GROUP).gr_gid in json.loads(seen["groups"])  # (it reads the code through it)
        assert (seen["own dir"], seen["checkpoint"]) == ("ok", "ok"), seen
        checkpoint = data / "checkpoints" / experiment / trial_id / "step"
        assert checkpoint.read_text() == "mine"
        # And it got none of the stack's settings, only what a trial gets (its ask token: docs/optuna.md)
        assert json.loads(seen["env"]) == [
            "TRIALBUS_ASK_OWNER",
            "TRIALBUS_ASK_TOKEN",
            "TRIALBUS_ATTEMPT",
            "TRIALBUS_CHECKPOINT_DIR",
            "TRIALBUS_GATEWAY_URL",
        ]
        # And its metrics reached the gateway
        values = [m["value"] for m in stack.rest("GET", f"/trials/{trial_id}/metrics").json()]
        assert values and values[0] in (1, "1"), values
        assert warm_of(stack, experiment, trial_id) is warm
    # And the templates that imported the trials' code run as the trial user too
    pids = templates(stack)
    assert pids
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            assert psutil.Process(pid).uids().real == trial_user.pw_uid
    # And the adapter's folders are passed through, never listed, by trials
    for folder in (work_dir(stack), work_dir(stack) / "trials", work_dir(stack) / "trials" / first):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o711 and folder.stat().st_uid == 0
    # And the stack's credentials are the stack user's alone
    for secret in ("client.json", "api-token"):
        assert stat.S_IMODE((data / secret).stat().st_mode) == 0o600


def test_a_retried_trial_goes_on_from_its_checkpoint(isolated):
    stack, code, python = isolated
    # Given a trial that fails on its first attempt, after saving its checkpoint
    experiment = create(stack, config(code, trialCommand=f"{python} trial.py", retry={"trial": 1, "backoff": "0s"}))
    trial_id = submit(stack, experiment, {"fail_first": True})
    # Then its second attempt, as the trial user again, reads that checkpoint and succeeds
    done = ended(stack, trial_id, 90)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    assert done["finalMetric"]["previous"] == "0"
    assert done["finalMetric"]["uid"] == pwd.getpwnam(USER).pw_uid


@pytest.mark.parametrize("isolated", ["zygote and templates", "cold"], indirect=True)
def test_a_trial_running_as_the_trial_user_is_canceled(isolated):
    stack, code, python = isolated
    experiment = create(stack, config(code, trialCommand=f"{python} trial.py", trialConcurrency=1))
    trial_id = submit(stack, experiment, {"sleep": 300})
    wait_until(lambda: keeper_uid(stack, experiment, trial_id) == uid_of(USER), 60, "the trial to run")
    state = json.loads((trial_dir(stack, experiment, trial_id) / ".trialbus/state.json").read_text())
    # When its experiment is stopped
    assert stack.rest("DELETE", f"/experiments/{experiment}").status_code == 200
    # Then the trial is canceled, and nothing of its process group is left
    assert ended(stack, trial_id, 30)["status"] == "USER_CANCELED"
    wait_until(lambda: not psutil.pid_exists(state["trialPid"]), 10, "the trial's process to end")


def test_a_teams_trial_reads_nothing_of_another_teams_running_trial(isolated):
    stack, code, python = isolated
    tokens = {"ana": add(stack, "ana", "vision"), "bo": add(stack, "bo", "nlp")}
    command = f"{python} trial.py"

    def start(person: str, parameters: dict, warm: bool = True) -> tuple[str, str]:
        made = as_(
            stack,
            tokens[person],
            "POST",
            "/experiments",
            json=config(code, trialCommand=command, trialConcurrency=1, warmStart=warm, experimentName=person),
        )
        assert made.status_code == 201, made.text
        experiment = made.json()["id"]
        return experiment, submit(stack, experiment, parameters)

    # Given a trial of team vision that runs (warm), with its directory and its checkpoint
    a_experiment, a_trial = start("ana", {"sleep": 300})
    vision, nlp = team_user_name("vision"), team_user_name("nlp")
    wait_until(lambda: keeper_uid(stack, a_experiment, a_trial) == uid_of(vision), 60, "vision's trial to run")
    a_dir = trial_dir(stack, a_experiment, a_trial)
    a_checkpoint = stack.root / "data" / "checkpoints" / a_experiment / a_trial
    wait_until(lambda: (a_checkpoint / "progress").exists(), 30, "vision's trial to write its checkpoint")
    reads = {
        "their dir": f"{a_dir}/",
        "their parameters": str(a_dir / "parameter.cfg"),
        "their checkpoints": f"{a_checkpoint}/",
        "their checkpoint": str(a_checkpoint / "progress"),
    }
    # When a trial of team nlp, running beside it, tries to read them
    b_experiment, b_trial = start("bo", {"read": reads, "sleep": 3})
    wait_until(lambda: process_uid(stack, b_experiment, b_trial, "trialPid") > 0, 60, "nlp's trial to run")
    # Then the two trials, and their keepers, run as two users: their teams'
    running = {
        (team, name): process_uid(stack, experiment, trial_id, name)
        for team, experiment, trial_id in (("vision", a_experiment, a_trial), ("nlp", b_experiment, b_trial))
        for name in ("keeperPid", "trialPid")
    }
    assert running == {
        ("vision", "keeperPid"): uid_of(vision),
        ("vision", "trialPid"): uid_of(vision),
        ("nlp", "keeperPid"): uid_of(nlp),
        ("nlp", "trialPid"): uid_of(nlp),
    }, running
    assert uid_of(vision) != uid_of(nlp) and 0 not in (uid_of(vision), uid_of(nlp))
    # And every read fails with EACCES, while it writes its own directory and checkpoint
    body = ended(stack, b_trial, 90)
    assert body["status"] == "SUCCEEDED", body
    seen = body["finalMetric"]
    assert {name: seen[name] for name in reads} == dict.fromkeys(reads, "PermissionError"), seen
    assert (seen["own dir"], seen["checkpoint"], seen["uid"]) == ("ok", "ok", uid_of(nlp)), seen
    # And each forked from a warm template of its own team's user: none is shared
    assert warm_of(stack, a_experiment, a_trial) and warm_of(stack, b_experiment, b_trial)
    owners = {psutil.Process(pid).uids().real for pid in templates(stack)}
    assert owners == {uid_of(vision), uid_of(nlp)}, owners
    a_keeper = json.loads((a_dir / ".trialbus/state.json").read_text())["keeperPid"]
    a_template = psutil.Process(a_keeper).ppid()
    assert a_template in templates(stack) and psutil.Process(a_template).uids().real == uid_of(vision)
    # And the running trial's directory and checkpoints are its own, private
    for path in (a_dir, a_checkpoint):
        assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (uid_of(vision), 0o700)
    assert stack.rest("DELETE", f"/experiments/{a_experiment}").status_code == 200
    assert ended(stack, a_trial, 30)["status"] == "USER_CANCELED"
    # And trials that start cold fork their keepers from a zygote of their own team's user
    cold = {person: start(person, {"sleep": 30}, warm=False) for person in ("ana", "bo")}
    wait_until(
        lambda: all(process_uid(stack, *started, "trialPid") > 0 for started in cold.values()),
        60,
        "the cold trials to run",
    )
    zygotes = {}
    for person, (experiment, trial_id) in cold.items():
        keeper = json.loads((trial_dir(stack, experiment, trial_id) / ".trialbus/state.json").read_text())["keeperPid"]
        zygote = psutil.Process(psutil.Process(keeper).ppid())
        assert "--zygote" in zygote.cmdline(), zygote.cmdline()
        zygotes[person] = (zygote.pid, zygote.uids().real)
    assert zygotes["ana"][1] == uid_of(vision) and zygotes["bo"][1] == uid_of(nlp), zygotes
    assert zygotes["ana"][0] != zygotes["bo"][0]
    for experiment, trial_id in cold.values():
        assert stack.rest("DELETE", f"/experiments/{experiment}").status_code == 200
        assert ended(stack, trial_id, 30)["status"] == "USER_CANCELED"
