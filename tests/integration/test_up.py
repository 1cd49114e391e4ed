"""``trialbus up``, ``down`` and ``status`` as a user runs them, over stand-in services and a real
nats-server: stopping on every signal, restarting what dies, leftovers of a killed supervisor."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nats
import pytest

from contracts.streams import EVENTS
from tests.fixtures.nats import nats_server_binary, require_binary
from tests.fixtures.standins import StandinStack
from tests.fixtures.up import gone
from trialbus.stack.processes import ProcessId

WEB = ("web", "unless-stopped", {"PORT": "{api_port}"})
WORKER = ("worker", "unless-stopped", {})
#: A command for `up -- CMD` that says it runs, then waits to be stopped.
SLEEPY = [sys.executable, "-c", "import time; print('command running', flush=True); time.sleep(600)"]


@pytest.fixture
def make_stack(tmp_path: Path):
    require_binary(nats_server_binary(), "nats-server")
    made: list[StandinStack] = []

    def make(**services: tuple[str, str, dict[str, str]]) -> StandinStack:
        stack = StandinStack(tmp_path / f"stack{len(made)}", services or {"web": WEB, "worker": WORKER})
        made.append(stack)
        return stack

    yield make
    for stack in made:
        stack.cleanup()


# -- stopping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "moment"),
    [
        ("ctrl-c", "starting"),
        ("ctrl-c", "up"),
        ("ctrl-c", "running"),
        ("sigterm", "starting"),
        ("sigterm", "up"),
        ("sigterm", "running"),
        ("sighup", "running"),
    ],
)
def test_every_signal_at_any_moment_stops_every_process_and_frees_every_port(make_stack, how, moment):
    # Given `trialbus up`, signalled while starting, as soon as it is up, or after a while
    stack = make_stack()
    up = stack.up()
    if moment == "starting":
        stack.wait_part("nats-server", lambda p: p["pid"])
    else:
        up.wait_for("Trialbus is up")
        time.sleep(2 if moment == "running" else 0)
    started = stack.processes()

    # When it gets the signal
    began = time.monotonic()
    up.ctrl_c() if how == "ctrl-c" else up.signal(signal.SIGTERM if how == "sigterm" else signal.SIGHUP)

    # Then it exits within 30 s, and every process it started is gone and every port free
    code = up.wait(30)
    assert time.monotonic() - began < 30
    assert code == (130 if moment == "starting" else 0), up.text()
    assert started and gone(started.values(), 1), up.text()
    assert stack.ports_free()
    if moment != "starting":
        assert "stopping (" in up.text() and "stopped nats-server" in up.text()


def test_a_second_signal_kills_at_once_and_says_so(make_stack):
    # Given a service that ignores SIGTERM (an ordered stop would wait 15 s for it)
    stack = make_stack(web=WEB, stubborn=("stubborn", "unless-stopped", {}))
    up = stack.up()
    up.wait_for("Trialbus is up")
    started = stack.processes()
    up.ctrl_c()
    up.wait_for("stopping (Ctrl-C)")
    time.sleep(0.5)

    # When Ctrl-C comes again
    began = time.monotonic()
    up.ctrl_c()

    # Then everything is killed at once
    assert up.wait(10) == 130
    assert time.monotonic() - began < 5
    assert "second signal: killed every part of the stack at once" in up.text()
    assert gone(started.values(), 1) and stack.ports_free()


def test_ctrl_c_reaches_the_command_once_and_stops_the_stack(make_stack, tmp_path):
    # Given `trialbus up -- CMD` where CMD counts the SIGINTs it gets and exits 5 on the first
    seen = tmp_path / "sigints"
    script = textwrap.dedent(f"""
        import signal, sys, time
        def on_int(*_):
            with open({str(seen)!r}, "a") as f:
                f.write("SIGINT\\n")
            time.sleep(0.5)  # a second one, if any, would arrive meanwhile
            sys.exit(5)
        signal.signal(signal.SIGINT, on_int)
        print("command running", flush=True)
        time.sleep(600)
    """)
    stack = make_stack()
    up = stack.up(command=[sys.executable, "-c", script])
    up.wait_for("command running")
    started = stack.processes()

    # When the user presses Ctrl-C in the terminal
    up.ctrl_c()

    # Then CMD got exactly one SIGINT, `up` exits with CMD's code, and the stack is gone
    assert up.wait(30) == 5, up.text()
    assert seen.read_text().splitlines() == ["SIGINT"]
    assert gone(started.values(), 1) and stack.ports_free()


def test_sigterm_to_up_stops_the_command_too(make_stack):
    stack = make_stack()
    up = stack.up(command=SLEEPY)
    up.wait_for("command running")
    started = stack.processes()
    up.signal(signal.SIGTERM)
    assert up.wait(30) == 128 + signal.SIGTERM, "CMD was ended by the SIGTERM it was passed"
    assert gone(started.values(), 1) and stack.ports_free()


# -- leftovers, down, status ----------------------------------------------------------------


def test_a_killed_supervisor_leaves_a_stack_that_status_shows_and_the_next_up_stops(make_stack):
    # Given `trialbus up` killed with SIGKILL: its parts live on
    stack = make_stack()
    first = stack.up()
    first.wait_for("Trialbus is up")
    left = stack.processes()
    first.proc.kill()
    first.proc.wait()
    assert all(p.alive() for p in left.values())

    # Then `trialbus status` says so, naming the way out
    status = stack.cli("status")
    assert status.returncode == 1 and "which is gone" in status.stdout and "trialbus down" in status.stdout
    seen = json.loads(stack.cli("status", "--json").stdout)
    assert seen["state"] == "leftovers" and {p["name"] for p in seen["parts"] if p["pid"]} == set(left)

    # When the user runs `up` again on the same data dir, it stops them, says so, and starts
    second = stack.up()
    second.wait_for("Trialbus is up")
    assert "found a stack left running" in second.text() and "stopped leftover nats-server" in second.text()
    assert gone(left.values(), 1)
    second.ctrl_c()
    assert second.wait(30) == 0


def test_the_command_of_a_killed_up_is_a_leftover_too(make_stack):
    stack = make_stack()
    first = stack.up(command=SLEEPY)
    first.wait_for("command running")
    stack.wait_part("nats-server", lambda p: p["state"] == "running")
    command = ProcessId(stack.state()["command"]["pid"], stack.state()["command"]["started"])
    first.proc.kill()
    first.proc.wait()
    assert command.alive()

    second = stack.up(command=["true"])
    assert second.wait(30) == 0, second.text()
    assert f"stopped leftover command (pid {command.pid})" in second.text()
    assert gone([command], 1)


def test_down_stops_a_running_stack_and_a_killed_ones_leftovers(make_stack):
    stack = make_stack()
    up = stack.up()
    up.wait_for("Trialbus is up")
    started = stack.processes()

    down = stack.cli("down")
    assert down.returncode == 0 and "stopped the stack on" in down.stderr, down.stderr
    assert up.wait(5) == 0 and "stopping (`trialbus down`)" in up.text()
    assert gone(started.values(), 1) and stack.ports_free()

    again = stack.up()
    again.wait_for("Trialbus is up")
    left = stack.processes()
    again.proc.kill()
    again.proc.wait()
    down = stack.cli("down")
    assert down.returncode == 0 and "stopped what a killed `trialbus up` left" in down.stderr, down.stderr
    assert gone(left.values(), 1) and stack.ports_free()
    assert "no stack is running" in stack.cli("down").stderr, "down is idempotent"


def test_a_pid_reused_by_another_program_is_never_killed(make_stack):
    # Given a state file whose recorded parts have exited and whose pids now belong to another program
    stack = make_stack()
    up = stack.up()
    up.wait_for("Trialbus is up")
    up.proc.kill()
    up.proc.wait()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = stack.state()
        for part in stack.processes().values():
            part.kill()
        for part in record["parts"]:
            part["pid"] = bystander.pid  # same pid, different start time: not ours
        (stack.data_dir / "stack.json").write_text(json.dumps(record))

        # When `up` looks for leftovers
        again = stack.up(command=["true"])
        assert again.wait(30) == 0, again.text()

        # Then the bystander is untouched
        assert bystander.poll() is None and "found a stack left running" not in again.text()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_foreign_program_on_a_port_is_named_and_left_alone(make_stack):
    stack = make_stack()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import socket, time
        s = socket.socket(); s.bind(("127.0.0.1", {stack.ports["api"]})); s.listen()
        print("listening", flush=True); time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "listening"
        up = stack.up()
        assert up.wait(30) == 1
        text = " ".join(up.text().split())
        assert f"port {stack.ports['api']} for the API is in use" in text
        assert f"(pid {holder.pid}:" in text and "--api-port" in text
        assert holder.poll() is None, "never killed"
    finally:
        holder.kill()
        holder.wait()


def test_a_second_up_on_the_same_data_dir_is_refused_naming_the_first(make_stack):
    stack = make_stack()
    first = stack.up()
    first.wait_for("Trialbus is up")
    second = stack.up()
    assert second.wait(30) == 1
    text = " ".join(second.text().split())
    assert f"a stack already runs on {stack.data_dir}: `trialbus up` (pid {first.proc.pid}" in text
    assert "trialbus down" in text
    assert first.proc.poll() is None, "the first is untouched"


# -- supervision ----------------------------------------------------------------------------


def test_a_killed_service_is_restarted_and_status_counts_it(make_stack):
    # Given a running stack
    stack = make_stack()
    up = stack.up()
    up.wait_for("Trialbus is up")
    worker = stack.processes()["worker"]

    # When the worker is SIGKILLed
    worker.kill()

    # Then it runs again under a new pid, and the console, its log and `status` say why
    restarted = stack.wait_part("worker", lambda p: p["state"] == "running" and p["pid"] not in (None, worker.pid))
    assert restarted["restarts"] == 1 and restarted["last_exit"] == "killed by SIGKILL"
    up.wait_for("worker ready again")
    assert "worker exited (killed by SIGKILL); restarting it in 0.5s" in " ".join(up.text().split())
    log = (stack.data_dir / "logs" / "worker.log").read_text()
    assert log.count("sleeping") == 2 and "restarted after killed by SIGKILL" in log, "the first run's log is kept"
    shown = json.loads(stack.cli("status", "--json").stdout)
    assert shown["state"] == "running"
    assert {p["name"]: (p["state"], p["restarts"]) for p in shown["parts"]} == {
        "nats-server": ("running", 0),
        "web": ("running", 0),
        "worker": ("running", 1),
    }
    assert next(p for p in shown["parts"] if p["name"] == "nats-server")["health"] == "ok"
    up.ctrl_c()
    assert up.wait(30) == 0


def test_nats_server_killed_is_restarted_on_the_same_store(make_stack):
    stack = make_stack()
    up = stack.up()
    up.wait_for("Trialbus is up")
    url = f"nats://127.0.0.1:{stack.ports['nats']}"
    # the dispatcher's user: the one that may create the EVENTS stream and publish its own events
    password = json.loads((stack.data_dir / "nats-passwords.json").read_text())["dispatcher"]

    async def publish() -> None:
        nc = await nats.connect(url, user="dispatcher", password=password, inbox_prefix="_INBOX_dispatcher")
        js = nc.jetstream()
        await js.add_stream(EVENTS)
        await js.publish("events.kept.one.dispatcher", b"1")
        await nc.close()

    async def count() -> int:
        nc = await nats.connect(url, user="dispatcher", password=password, inbox_prefix="_INBOX_dispatcher")
        try:
            return (await nc.jetstream().stream_info("EVENTS")).state.messages
        finally:
            await nc.close()

    asyncio.run(publish())
    broker = stack.processes()["nats-server"]
    broker.kill()
    stack.wait_part("nats-server", lambda p: p["state"] == "running" and p["pid"] != broker.pid)
    assert asyncio.run(count()) == 1
    up.ctrl_c()
    assert up.wait(30) == 0


def test_a_crash_loop_stops_the_stack_with_the_reason_and_the_log_tail(make_stack):
    # Given a service that dies 1.5 s after every start
    stack = make_stack(web=WEB, crasher=("crasher", "always", {}))
    up = stack.up()

    # Then after 5 exits within 60 s the stack stops, says why, shows the log, exits 1
    assert up.wait(60) == 1, up.text()
    text = " ".join(up.text().split())
    assert "crasher keeps dying: 5 exits within 60s, the last with exit code 3; stopped the stack" in text
    assert "crashing: no such config" in text
    assert text.count("crasher exited (exit code 3); restarting it in") == 4
    assert stack.ports_free()


def test_on_failure_with_a_limit_stops_the_stack_when_it_is_spent(make_stack):
    stack = make_stack(web=WEB, crasher=("crasher", "on-failure:1", {}))
    up = stack.up()
    assert up.wait(60) == 1, up.text()
    text = " ".join(up.text().split())
    assert "restarting it in 0.5s" in text
    assert "crasher stopped unexpectedly (exit code 3) and its restart policy is 'on-failure:1'" in text


def test_with_restart_no_a_death_stops_the_stack(make_stack):
    stack = make_stack(web=WEB, worker=("worker", "no", {}))
    up = stack.up()
    up.wait_for("Trialbus is up")
    stack.processes()["worker"].kill()
    assert up.wait(30) == 1
    assert "worker stopped unexpectedly (killed by SIGKILL) and its restart policy is 'no'" in " ".join(
        up.text().split()
    )
    assert ProcessId.of(up.proc.pid) is None and stack.ports_free()
