"""What a long-lived installation keeps (issue 23): an experiment deleted with everything the bus
holds of it, and the EVENTS and METRICS limits the dispatcher's settings set."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from services.common import kvwatch
from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, wait_until

pytestmark = pytest.mark.timeout(120)

TRIALBUS = str(Path(sys.executable).parent / "trialbus")


async def bus_holds(url: str, experiment: str, trial_ids: list[str]) -> dict[str, int]:
    """How many messages of the experiment each stream and bucket still holds."""
    from services.common.bus import Bus

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        bus = Bus(nc, js)
        found = {}
        for stream, subject in (("EVENTS", f"events.{experiment}.>"), ("METRICS", f"metrics.{experiment}.>")):
            info = await js.stream_info(stream, subjects_filter=subject)
            found[stream] = sum((info.state.subjects or {}).values())
        found["trials"] = len([e for e in await kvwatch.current(bus, "trials") if e.key in trial_ids])
        found["experiments"] = len([e for e in await kvwatch.current(bus, "experiments") if e.key == experiment])
        return found
    finally:
        await nc.close()


def test_a_deleted_experiment_leaves_nothing_on_the_bus_and_the_others_untouched(stack, code_dir):
    # Given two experiments whose trials reported metrics
    doomed, kept = create(stack, config(code_dir)), create(stack, config(code_dir))
    doomed_trials = [submit(stack, doomed, {"x": i, "intermediate": 2}) for i in range(3)]
    kept_trial = submit(stack, kept, {"x": 9, "intermediate": 2})
    for trial_id in [*doomed_trials, kept_trial]:
        ended(stack, trial_id)
    held = asyncio.run(bus_holds(stack.nats.url, doomed, doomed_trials))
    # (a METRICS message is a keeper's batch: at least one per trial for its 3 records)
    assert held["EVENTS"] >= 6 and held["METRICS"] >= 3 and held["trials"] == 3 and held["experiments"] == 1
    # A running experiment is not deleted: the answer says what to do
    refused = stack.rest("POST", f"/experiments/{doomed}/delete")
    assert refused.status_code == 409 and f"stop it first (trialbus experiment stop {doomed})" in refused.text
    assert stack.rest("DELETE", f"/experiments/{doomed}").json()["status"] == "STOPPED"

    # When the user deletes it from the CLI
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url}
    deleted = subprocess.run(
        [TRIALBUS, "experiment", "delete", doomed], env=env, capture_output=True, text=True, timeout=60
    )
    assert deleted.returncode == 0, deleted.stderr
    assert f"experiment {doomed} deleted, with its 3 trial(s)" in deleted.stdout

    # Then nothing of it is left: not in the API, not on the bus, not after a restart
    assert asyncio.run(bus_holds(stack.nats.url, doomed, doomed_trials)) == {
        "EVENTS": 0,
        "METRICS": 0,
        "trials": 0,
        "experiments": 0,
    }
    assert stack.rest("GET", f"/experiments/{doomed}").status_code == 404
    assert stack.rest("GET", f"/trials/{doomed_trials[0]}").status_code == 404
    stack.restart("dispatcher")
    assert stack.rest("GET", f"/experiments/{doomed}").status_code == 404
    assert [e["id"] for e in stack.rest("GET", "/experiments").json()] == [kept]
    # and the other experiment is whole
    assert stack.rest("GET", f"/trials/{kept_trial}").json()["finalMetric"]["default"] == 9
    assert len(stack.rest("GET", f"/trials/{kept_trial}/metrics").json()) == 3
    missing = stack.rest("POST", "/experiments/nosuch/delete")
    assert missing.status_code == 404


async def stream_limits(url: str) -> dict[str, tuple[float | None, int | None]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        found = {}
        for name in ("EVENTS", "METRICS"):
            kept = (await js.stream_info(name)).config
            found[name] = (kept.max_age, kept.max_bytes)
        return found
    finally:
        await nc.close()


def test_the_streams_keep_what_the_dispatcher_is_told_and_other_services_leave_it(stack):
    # Given the default: 30 days, no size limit
    assert asyncio.run(stream_limits(stack.nats.url)) == {"EVENTS": (30 * 86400, -1), "METRICS": (30 * 86400, -1)}
    # When the dispatcher restarts with limits of its own
    stack.service_env["dispatcher"] = {
        "TRIALBUS_METRICS_MAX_AGE": "12h",
        "TRIALBUS_METRICS_MAX_BYTES": "64mb",
        "TRIALBUS_EVENTS_MAX_AGE": "0",
    }
    stack.restart("dispatcher")
    limits = {"EVENTS": (0, -1), "METRICS": (12 * 3600, 64 * 2**20)}  # (0: kept forever)
    wait_until(lambda: asyncio.run(stream_limits(stack.nats.url)) == limits, 10, "the new limits")
    # Then an adapter starting afterwards leaves them as they are
    stack.restart("adapter")
    assert asyncio.run(stream_limits(stack.nats.url)) == limits
    # and a limit that is not one stops the dispatcher with the variable's name
    stack.service_env["dispatcher"] = {"TRIALBUS_METRICS_MAX_BYTES": "lots"}
    with pytest.raises(RuntimeError, match="TRIALBUS_METRICS_MAX_BYTES: bad size 'lots'"):
        stack.restart("dispatcher")
    # and a limit the NATS server has no room for (the tests' servers have 1 TiB) says what to do
    stack.service_env["dispatcher"] = {"TRIALBUS_METRICS_MAX_BYTES": "2tb"}
    with pytest.raises(RuntimeError, match="JetStream has no room for METRICS.*lower TRIALBUS_METRICS_MAX_BYTES"):
        stack.restart("dispatcher")
