"""The launcher's settings, ``hydra.launcher.*``, registered as ``hydra/launcher=trialbus``."""

# No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules, where dataclasses cannot
# read string annotations.
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class TrialbusLauncherConf:
    """Where and how the jobs of a sweep run; each field is documented in docs/hydra.md."""

    _target_: str = "hydra_plugins.trialbus_launcher.launcher.TrialbusLauncher"
    #: The platform section of an NNI config (``{platform: remote, machineList: …}``, or a list for hybrid
    #: mode), camelCase keys as in an NNI config file; None: ``{platform: local}``. (None rather than a dict by
    #: default: Hydra merges a dict override into a dict, and the launcher's config refuses keys it lacks.)
    training_service: Any = None
    #: Jobs of a batch that run at once (the experiment's ``trialConcurrency``).
    concurrency: int = 4
    #: More fields of the experiment's config, camelCase as in an NNI config (``maxTrialDuration``,
    #: ``trialGpuNumber``, ``retry``…); the launcher sets the command, code, concurrency and trial count.
    experiment: Any = None
    #: The Python that runs a job on the trial's host; None: the one running the sweep (``sys.executable``).
    python: str | None = None
    #: The stack's NATS; None: ``TRIALBUS_NATS_URL``, else the NATS of this user's ``trialbus up``.
    nats_url: str | None = None
    #: The data directory of the ``trialbus up`` to use; None: ``TRIALBUS_DATA_DIR``, else the default.
    data_dir: str | None = None
    #: A person's API token; None: ``TRIALBUS_API_TOKEN``, else the stack's own credential.
    token: str | None = None
    #: Seconds an API call may take.
    request_timeout: float = 10.0


ConfigStore.instance().store(group="hydra/launcher", name="trialbus", node=TrialbusLauncherConf, provider="trialbus")
