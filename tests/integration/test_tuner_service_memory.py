"""The tuner service's memory (services/tuner/service.py, driver.py, trials.py) with a real nats-server, dispatcher
and the fake adapter (no process per trial): the service keeps nothing of an experiment it does not drive, and the
driver of a tuned experiment holds only the trials running, whatever the number that ended."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.common.bus import connect
from services.tuner.service import TunerService
from services.tuner.settings import TunerSettings
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from trialbus.client import AsyncClient

CONCURRENCY = 8
TRIALS = 300


async def test_the_service_holds_only_the_running_trials_of_the_experiments_it_drives(
    tmp_path: Path,
    nats_server: NatsServer,
) -> None:
    stack = Stack(root=tmp_path, nats=nats_server, service_env={"fake": {"TRIALBUS_FAKE_CAPACITY": "50"}})
    stack.start("dispatcher", "fake")
    settings = TunerSettings(nats_url=nats_server.url, replica="t1", stop_timeout=3, tuner_lease_refresh=1)
    bus = await connect(settings, "tuner")
    service = TunerService(settings)
    try:
        await service.start(bus)
        async with AsyncClient(nats_server.url) as client:
            # Given an experiment its own client drives (no tuner), with trials that end at once
            untuned = await client.create_experiment(
                {
                    "trialCommand": "true",
                    "trialCodeDirectory": str(tmp_path),
                    "trialConcurrency": 50,
                    "trainingService": {"platform": "local"},
                }
            )
            for i in range(100):
                await client.submit_trial(untuned, {"x": i})
            # and one the tuner service drives: TRIALS trials, CONCURRENCY at once
            tuned = await client.create_experiment(
                {
                    "trialCommand": "true",
                    "trialCodeDirectory": str(tmp_path),
                    "trialConcurrency": CONCURRENCY,
                    "maxTrialNumber": TRIALS,
                    "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
                    "tuner": {"name": "Random"},
                    "trainingService": {"platform": "local"},
                }
            )

            # When the tuned experiment runs to its end
            most_held, ended = 0, 0
            async with asyncio.timeout(60):
                while (await client.get_experiment(tuned)).status.value == "RUNNING":
                    if (driver := service.drivers.get(tuned)) is not None:
                        most_held = max(most_held, len(driver.trials))
                        ended = driver.ended.count
                        assert untuned not in service.drivers and untuned not in service.experiments
                    await asyncio.sleep(0.02)

        # Then the driver never held more than the trials in flight, though most had ended
        assert ended > TRIALS // 2
        assert 0 < most_held <= CONCURRENCY
        # and once it is over, the service holds nothing of either experiment
        assert service.drivers == {} and service.experiments == {}
        # and, driving nothing, it reads no trial change at all: it left no consumer on the trials bucket
        async with asyncio.timeout(10):
            while (await bus.js.stream_info("KV_trials")).state.consumer_count:
                await asyncio.sleep(0.05)
    finally:
        await service.stop()
        await bus.close()
        stack.stop()
