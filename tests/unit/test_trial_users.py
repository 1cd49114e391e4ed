"""Who local trials run as (services/adapters/local_gpu/users.py): ``TRIALBUS_TRIAL_USER``'s decision,
and the start failing clearly where the user cannot be used."""

from __future__ import annotations

import asyncio
import os
import pwd

import pytest

from contracts import ExperimentConfig, TrialRequest
from services.adapters.local_gpu import users
from services.adapters.local_gpu.users import (
    DEFAULT_USER,
    NAME_MAX,
    TEAM_PREFIX,
    TrialUser,
    TrialUserError,
    TrialUsers,
    choose,
    resolve,
    team_user_name,
)


def test_auto_is_the_trial_user_for_root_and_the_adapters_own_user_otherwise() -> None:
    assert choose("auto", 0) == DEFAULT_USER
    assert choose("auto", 1000) is None  # not root: it cannot switch, trials are not isolated
    assert choose("alice", 0) == choose("alice", 1000) == "alice"


def test_a_teams_user_is_named_after_the_team_within_useradds_limit() -> None:
    assert team_user_name("vision") == "trialbus-t-vision"
    assert team_user_name("a" * 20) == TEAM_PREFIX + "a" * 20  # 31 characters: kept whole
    long = team_user_name("a" * 21)  # cut to 12, and 8 hex digits of its hash: 32 characters
    assert len(long) == NAME_MAX and long.startswith(TEAM_PREFIX + "a" * 12 + "-")
    assert len(team_user_name("b" * 32)) == NAME_MAX
    # two long names with the same beginning get different users; no short name meets a long one's
    assert team_user_name("research-group-one") != team_user_name("research-group-two")
    assert team_user_name("a" * 12 + "-x" * 5) != team_user_name("a" * 12 + "-y" * 5)
    names = [team_user_name(t) for t in ("admins", "a" * 20, "a" * 21, "a" * 22, "a" * 32)]
    assert len(set(names)) == len(names) and all(len(n) <= NAME_MAX for n in names)
    assert DEFAULT_USER not in names  # (the user of experiments without a team)


def test_a_user_that_does_not_exist_fails_the_start() -> None:
    with pytest.raises(TrialUserError, match="no such user"):
        resolve("trialbus-no-such-user")


def test_the_adapters_own_user_runs_trials_unswitched() -> None:
    own = resolve(pwd.getpwuid(os.geteuid()).pw_name)
    assert (own.uid, own.switch) == (os.geteuid(), False)


def test_an_adapter_that_is_not_root_runs_trials_as_itself_and_cannot_switch_to_another_user() -> None:
    # (as root: the child becomes nobody, as an adapter that is not root is)
    nobody = os.geteuid() if os.geteuid() != 0 else pwd.getpwnam("nobody").pw_uid
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        status = 1
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(pwd.getpwnam("nobody").pw_gid)
                os.setuid(nobody)
            auto = resolve("auto")
            try:
                resolve("root")
            except TrialUserError as exc:
                status = 0 if auto.uid == nobody and not auto.switch and "not root" in str(exc) else 3
            else:
                status = 2
        finally:
            os._exit(status)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


LOCAL = ExperimentConfig.model_validate(
    {"trialCommand": "true", "trialCodeDirectory": ".", "trialConcurrency": 1, "trainingService": {"platform": "local"}}
).training_service


async def test_a_teams_user_is_made_once_however_many_launches_wait_and_a_failure_falls_back(monkeypatch) -> None:
    made: list[str] = []

    def team_user(team: str, groups: tuple[int, ...]) -> TrialUser:
        made.append(team)
        if team == "broken":
            raise TrialUserError("useradd said no")
        return TrialUser(team_user_name(team), 5000 + len(made), 5000, (5000, *groups), switch=True)

    monkeypatch.setattr(users, "team_user", team_user)
    trial_users = TrialUsers("auto")
    trial_users.user, trial_users.group = TrialUser(DEFAULT_USER, 4999, 4999, (4999, 44, 77), switch=True), 77
    asked = [request(team) for team in ("vision", "vision", "nlp", None, "broken", "vision")]
    found = await asyncio.gather(*(trial_users.trial_user_for(r) for r in asked))
    assert [u.name for u in found] == [
        "trialbus-t-vision",
        "trialbus-t-vision",
        "trialbus-t-nlp",
        DEFAULT_USER,  # an experiment without a team
        DEFAULT_USER,  # a team whose user cannot be made: the shared trial user (logged)
        "trialbus-t-vision",
    ]
    assert found[0].groups == (5000, 44, 77)  # trialbus-trial's groups (render: 44), its own (4999) not
    assert sorted(made) == ["broken", "nlp", "vision"]  # once each
    # a named TRIALBUS_TRIAL_USER (no shared group): that user for every team
    trial_users.group = None
    assert (await trial_users.trial_user_for(request("nlp"))).name == DEFAULT_USER


def test_a_trials_uid_is_who_its_directory_was_handed_to(tmp_path) -> None:
    trial_users = TrialUsers("auto")
    assert trial_users.uid_of(str(tmp_path)) is None  # trials run as the adapter: no user to match
    trial_users.user = TrialUser(DEFAULT_USER, os.geteuid() + 4321, os.getegid(), (), switch=True)
    assert trial_users.uid_of(str(tmp_path)) == os.geteuid() + 4321  # ours (taken back): the trial user's
    assert trial_users.uid_of(str(tmp_path / "gone")) == os.geteuid() + 4321
    if os.geteuid() == 0:
        team = TrialUser("trialbus-t-x", 4777, 4777, (), switch=True)
        trial_users.hand_over(str(tmp_path), team)
        assert trial_users.uid_of(str(tmp_path)) == 4777
        assert (tmp_path.stat().st_uid, tmp_path.stat().st_mode & 0o777) == (4777, 0o700)


def request(team: str | None) -> TrialRequest:
    return TrialRequest(
        experiment_id="e",
        trial_id="t",
        sequence_id=0,
        parameter_record="{}",
        trial_command="true",
        training_service=LOCAL,
        team=team,
        token="x" * 32,
    )
