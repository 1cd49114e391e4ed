"""Who local trials run as (services/adapters/local_gpu/users.py): ``TRIALBUS_TRIAL_USER``'s decision,
and the start failing clearly where the user cannot be used."""

from __future__ import annotations

import os
import pwd

import pytest

from services.adapters.local_gpu.users import DEFAULT_USER, TrialUserError, choose, resolve


def test_auto_is_the_trial_user_for_root_and_the_adapters_own_user_otherwise() -> None:
    assert choose("auto", 0) == DEFAULT_USER
    assert choose("auto", 1000) is None  # not root: it cannot switch, trials are not isolated
    assert choose("alice", 0) == choose("alice", 1000) == "alice"


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
