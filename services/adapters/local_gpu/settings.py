"""Settings of the local-gpu adapter: environment ``TRIALBUS_<NAME>``, e.g. ``TRIALBUS_MAX_TRIALS=8``.

The service-wide ones (``TRIALBUS_NATS_URL``, ``TRIALBUS_REPLICA``, ``TRIALBUS_POLL_INTERVAL``…)
are in :class:`~services.adapters.service.AdapterSettings`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from contracts.units import parse_seconds_setting
from services.adapters.gpu.settings import GpuSettings


class LocalGpuSettings(GpuSettings):
    #: Directory of code snapshots (``code/``) and trial directories
    #: (``trials/<experiment>/<trial>-<attempt>/``). Default: ``<data_dir>/local-gpu/<replica>``.
    work_dir: Path | None = None
    #: Trials' checkpoint directories (``<experiment>/<trial>/``, kept across a trial's attempts:
    #: docs/retries.md). Default ``<data_dir>/checkpoints``, shared by the replicas of one host;
    #: for replicas on several hosts, a shared file system mounted at the same path on each.
    checkpoint_root: Path | None = None
    #: Base URL of the metrics gateway, as trials on this host reach it.
    gateway_url: str = "http://127.0.0.1:8081"
    #: Trials this host runs at once (trials, default 64); more wait in the dispatch queue.
    max_trials: int = Field(default=64, gt=0)
    #: Seconds between SIGTERM and SIGKILL when a trial is canceled (default 5).
    kill_grace: float = Field(default=5.0, ge=0)
    #: Seconds a keeper keeps retrying unsent metrics after its trial ended (default 600).
    flush_timeout: float = Field(default=600.0, ge=0)
    #: Put the stdlib ``nni`` shim first on trials' PYTHONPATH: ``auto`` (default) and ``always``
    #: do (it serves NNI's trial API and hands everything else to an installed ``nni``), ``never``
    #: leaves ``import nni`` to the trial's interpreter.
    nni_shim: Literal["auto", "always", "never"] = "auto"
    #: The Unix user trials run as (docs/security.md): ``auto`` (default) is the system user
    #: ``trialbus-trial`` (created at start if missing) when the adapter runs as root, else the
    #: adapter's own user (trials NOT isolated from the stack's files: logged at start); a name
    #: uses that user (the start fails if it does not exist or the adapter cannot switch to it).
    trial_user: str = Field(default="auto", min_length=1)
    #: The Python that runs the trial keeper (default: the adapter's own interpreter).
    keeper_python: str = sys.executable
    #: Fork each trial's keeper from one pre-started keeper (saves ~12 ms of CPU per trial);
    #: false starts a new interpreter per trial.
    keeper_zygote: bool = True
    #: Fork Python trials from warm templates that have imported their modules (docs/warm-start.md);
    #: false starts every trial as a new interpreter. Experiments may turn it off (``warmStart: false``).
    warm_start: bool = True
    #: Seconds a trial waits at most for its template to finish starting before it starts cold
    #: (default 120): it waits as long as the template imports, which a cold start would repeat.
    warm_wait: float = Field(default=120.0, ge=0)
    #: Seconds a starting template may use no CPU (an import that hangs) before the trials waiting
    #: for it start cold (default 5).
    warm_stall: float = Field(default=5.0, gt=0)
    #: Templates kept at once (default 8, one per code, interpreter and environment); the least
    #: recently used goes first.
    warm_templates: int = Field(default=8, gt=0)
    #: Seconds an unused template is kept (default 900).
    warm_idle: float = Field(default=900.0, gt=0)
    #: Where the GPU inventory comes from: ``auto`` (NVML, else ``nvidia-smi -q -x``, else no
    #: GPUs), ``nvml``, ``nvidia-smi`` or ``none``.
    gpu_source: Literal["auto", "nvml", "nvidia-smi", "none"] = "auto"
    #: Seconds a finished trial's directory (logs, outputs) is kept after its end was
    #: reported, and a checkpoint directory after it last changed; NNI unit strings like ``7d``
    #: work. Default 7 days; 0 keeps them forever.
    trial_retention: float = Field(default=7 * 86400.0, ge=0)

    _durations = field_validator("trial_retention", mode="before")(parse_seconds_setting)

    @model_validator(mode="after")
    def _default_work_dir(self) -> LocalGpuSettings:
        if self.work_dir is None:
            self.work_dir = self.data_dir / "local-gpu" / self.replica
        self.work_dir = self.work_dir.expanduser().absolute()
        self.checkpoint_root = (self.checkpoint_root or self.data_dir / "checkpoints").expanduser().absolute()
        return self
