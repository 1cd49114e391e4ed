"""An adapter speaks only for its own trials: the dispatcher ignores, counts and logs an event
for a trial from anyone but the adapter it was dispatched to, or one whose payload names
another trial than its subject, and the trial ends as its own adapter reports.

The stack's nats-server has no users here, so anyone may publish on any subject: this tests the
dispatcher's own check (tests/integration/test_nats_permissions.py shows the broker refusing
an adapter's user another adapter's subject).
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path

import httpx
import nats

from contracts import TrialEvent, TrialStatus, subjects
from tests.e2e.conftest import config, write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.fixtures.stack import Stack

#: Runs until its ``release`` file exists, then reports ``x`` as its final result.
TRIAL = """
import os, time
import nni

params = nni.get_next_parameter()
while not os.path.exists(params["release"]):
    time.sleep(0.05)
nni.report_final_result(params["x"])
"""


def refused(stack: Stack) -> dict[str, float]:
    """``trialbus_dispatcher_events_refused_total`` by reason, from the dispatcher's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{stack.api_port}/metrics", headers=stack.auth, timeout=5).text
    found = re.findall(r'^trialbus_dispatcher_events_refused_total\{reason="([^"]+)"\} (\S+)$', text, re.M)
    return {reason: float(value) for reason, value in found}


async def forge(stack: Stack, *messages: tuple[str, TrialEvent]) -> None:
    """Publish each event on its subject, as anyone who can reach the broker can."""
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        for subject, event in messages:
            await js.publish(subject, event.encode())
    finally:
        await nc.drain()


def failed(experiment: str, trial_id: str, attempt: int, platform: str) -> TrialEvent:
    return TrialEvent(
        experiment_id=experiment,
        trial_id=trial_id,
        attempt=attempt,
        status=TrialStatus.FAILED,
        time=datetime.now(UTC),
        exit_code=13,
        message="forged",
        platform=platform,
    )


def test_an_event_from_another_adapter_or_about_another_trial_is_ignored(stack: Stack, tmp_path: Path):
    # Given two trials running on the local adapter, each until it is released
    code = write_code(tmp_path, TRIAL)
    release = tmp_path / "release"
    experiment = create(stack, config(code, trialConcurrency=2))
    first, second = (submit(stack, experiment, {"x": x, "release": str(release)}) for x in (1, 2))
    for trial_id in (first, second):
        wait_until(lambda t=trial_id: trial(stack, t)["status"] == "RUNNING", 30, f"trial {trial_id} to run")
    owner, attempt = trial(stack, first)["platform"], trial(stack, first)["attempt"]
    assert owner == "local-gpu"

    # When the openpai adapter says, twice, that the first failed,
    forged = failed(experiment, first, attempt, "openpai")
    openpai = subjects.events(experiment, first, "openpai")
    # and its own adapter publishes, on the first trial's subject, that the second failed
    about_another = (subjects.events(experiment, first, owner), failed(experiment, second, attempt, owner))
    asyncio.run(forge(stack, (openpai, forged), (openpai, forged), about_another))

    # Then the dispatcher counts them refused on its /metrics,
    counts = wait_until(lambda: (c := refused(stack)).get("subject mismatch") == 1 and c, 15, "the refusals")
    assert counts == {"not owner": 2.0, "subject mismatch": 1.0}, counts
    # says why in its log, once per trial,
    log = stack.log("dispatcher")
    not_owner = (
        f"ignoring openpai's FAILED event for trial {first} of experiment {experiment}: "
        "the trial was dispatched to local-gpu"
    )
    assert log.count(not_owner) == 1, log
    assert f"whose payload is about trial {second} of experiment {experiment}" in log, log
    # and both trials still run
    assert [trial(stack, t)["status"] for t in (first, second)] == ["RUNNING", "RUNNING"]

    # and once released, each ends as its own adapter reports it
    release.touch()
    outcomes = [ended(stack, t, 30) for t in (first, second)]
    assert [(t["status"], t["exitCode"], t["finalMetric"]) for t in outcomes] == [
        ("SUCCEEDED", 0, 1),
        ("SUCCEEDED", 0, 2),
    ], outcomes
