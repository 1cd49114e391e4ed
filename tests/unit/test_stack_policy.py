"""How ``trialbus up`` decides to restart a part: compose's ``restart:`` values, back-off, crash loops."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trialbus.stack.compose import ComposeError, compose_services, nats_restart_policy
from trialbus.stack.policy import RestartPolicy, Restarts

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "mode", "limit"),
    [
        (None, "no", None),
        ("no", "no", None),
        (False, "no", None),
        ("always", "always", None),
        ("unless-stopped", "unless-stopped", None),
        ("on-failure", "on-failure", None),
        ("on-failure:3", "on-failure", 3),
    ],
)
def test_every_compose_restart_value_is_understood(value, mode, limit):
    policy = RestartPolicy.parse(value)
    assert (policy.mode, policy.max_restarts) == (mode, limit)


@pytest.mark.parametrize("value", ["sometimes", "on-failure:x", "always:2", "on-failure:-1"])
def test_an_unknown_restart_value_is_refused_with_what_is_accepted(value):
    with pytest.raises(ValueError, match="no, always, unless-stopped, on-failure"):
        RestartPolicy.parse(value)


def test_which_exits_restart():
    assert not RestartPolicy("no").restarts(-9, 0)
    assert RestartPolicy("always").restarts(0, 100) and RestartPolicy("unless-stopped").restarts(-9, 100)
    on_failure = RestartPolicy.parse("on-failure:2")
    assert on_failure.restarts(1, 0) and on_failure.restarts(-9, 1)  # a kill is a failure
    assert not on_failure.restarts(0, 0), "a clean exit is not a failure"
    assert not on_failure.restarts(1, 2), "at most two restarts"


def test_back_off_doubles_within_the_window_and_five_exits_are_a_crash_loop():
    restarts = Restarts(backoff=0.5, backoff_max=3, crash_loop=5, window=60)
    delays = [restarts.exited(t) for t in (0, 1, 2, 3)]
    assert delays == [0.5, 1.0, 2.0, 3.0], "doubling, capped at backoff_max"
    assert restarts.exited(4) is None, "the fifth exit within 60 s"


def test_a_part_that_stays_up_for_the_window_starts_again_from_the_first_delay():
    restarts = Restarts(backoff=0.5, crash_loop=3, window=10)
    assert restarts.exited(0) == 0.5 and restarts.exited(1) == 1.0
    assert restarts.exited(30) == 0.5, "the exits 30 s ago no longer count"
    assert restarts.exited(31) == 1.0 and restarts.exited(32) is None


def test_the_policies_come_from_compose_yaml_nats_included():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    services = compose_services(ROOT / "compose.yaml")
    assert services, "compose.yaml defines the stack"
    for service in services:
        assert str(service.restart) == compose[service.name]["restart"] == "unless-stopped", service.name
    assert str(nats_restart_policy(ROOT / "compose.yaml")) == compose["nats"]["restart"] == "unless-stopped"


def test_a_bad_restart_in_compose_yaml_names_the_file_and_the_service(tmp_path):
    path = tmp_path / "compose.yaml"
    path.write_text("services:\n  dispatcher:\n    command: [python, -m, services.dispatcher]\n    restart: maybe\n")
    with pytest.raises(ComposeError, match=r"compose.yaml, service dispatcher: restart: 'maybe'"):
        compose_services(path)
