"""Hydra's own launcher test suites (``hydra.test_utils.launcher_common_tests``) run with ``hydra/launcher=trialbus``.

One stack (nats-server, dispatcher, gateway, local adapter) serves the whole module: each sweep is an experiment
of its own, so the tests share nothing but the services. The sweeps in this process and the Hydra apps the
integration suite starts as subprocesses find the stack through ``TRIALBUS_NATS_URL`` and ``TRIALBUS_API_TOKEN``.
"""

from __future__ import annotations

import sys

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)

from hydra_plugins.trialbus_launcher.launcher import TrialbusLauncher
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack


@pytest.fixture(scope="module", autouse=True)
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    root = tmp_path_factory.mktemp("hydra-stack")
    nats = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=nats)
    try:
        stack.start()
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TRIALBUS_NATS_URL", nats.url)
            env.setenv("TRIALBUS_API_TOKEN", stack.token)
            yield stack
    finally:
        stack.stop()
        nats.stop()
        if request.session.testsfailed:
            print(stack.logs(), file=sys.stderr)


def test_discovery() -> None:
    """Hydra finds the launcher in its plugin namespace."""
    assert TrialbusLauncher.__name__ in [x.__name__ for x in Plugins.instance().discover(Launcher)]


@pytest.mark.parametrize("launcher_name, overrides", [("trialbus", [])])
class TestTrialbusLauncher(LauncherTestSuite):
    """Hydra's launcher suite: sweeps composed, launched and returned in order, output directories made."""


@pytest.mark.parametrize("launcher_name, overrides", [("trialbus", ["hydra.sweeper.max_batch_size=2"])])
class TestTrialbusLauncherBatched(BatchedSweeperTestSuite):
    """A sweep in batches: each batch is an experiment of its own, the job numbers go on across them."""


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [
        (
            {
                "defaults": [
                    {"override hydra/launcher": "trialbus"},
                    {"override hydra/hydra_logging": "hydra_debug"},
                    {"override hydra/job_logging": "disabled"},
                ]
            },
            ["-m"],
        )
    ],
)
class TestTrialbusLauncherIntegration(IntegrationTestSuite):
    """Hydra apps run as a user runs them, each in its own process, their jobs as trials."""
