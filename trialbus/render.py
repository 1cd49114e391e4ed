"""``trialbus render``: the OpenPAI job the openpai adapter would submit for a trial (or the
Kubernetes ``Framework`` the frameworkcontroller adapter would create), offline.

The job is built by the adapter's own code (:mod:`services.adapters.openpai.jobs`), with the
paths and the keeper bundle ``OpenpaiAdapter.launch`` uses, so what is printed is what the
cluster would receive, except for three things: the ids are placeholders (the dispatcher
assigns the real ones when the experiment and the trial are created), the values of the job's
``secrets`` and its registry passwords are masked as OpenPAI itself shows them (``******``; the
job keeps its shape and passes the server's schema), and nothing is contacted: neither the
cluster nor the share.
"""

from __future__ import annotations

from typing import Any

import yaml

from contracts.experiment import ExperimentConfig, OpenpaiConfig
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.adapters.frameworkcontroller import adapter as fc_adapter
from services.adapters.frameworkcontroller import frameworks
from services.adapters.openpai import OpenpaiSettings, jobs
from services.adapters.openpai.adapter import bundle

#: Placeholder ids: valid in a job name, and plainly not real ones.
EXPERIMENT_ID, TRIAL_ID, ENVIRONMENT_ID, REPLICA = "EXPERIMENT", "TRIAL", "ENV", "REPLICA"
#: A secret's value as OpenPAI itself shows it.
MASK = "******"
#: How the platforms that run no job run their trials, for the refusal.
RUNS_AS = {"local": "runs trials as processes", "remote": "runs trials as processes on SSH machines"}


class NoJob(ValueError):
    """The experiment's platform submits no job to render."""


def masked(service: OpenpaiConfig, job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with its secrets masked by the config's own serializer (the one API answers use),
    in the protocol's shape: ``secrets`` keeps its keys, each value masked (``{apikey: "******"}``),
    so that the job printed still passes the rest-server's schema, which wants an object there."""
    shown = service.model_copy(update={"openpai_config": job}).model_dump(mode="json", include={"openpai_config"})
    shown = shown["openpai_config"]
    if isinstance(job.get("secrets"), dict):
        shown["secrets"] = {key: MASK for key in job["secrets"]}
    return shown


def render(config: ExperimentConfig) -> str:
    """The YAML of the job for the first attempt of a trial of ``config``, secrets masked."""
    services = config.training_services
    service = next((s for s in services if isinstance(s, OpenpaiConfig | FrameworkcontrollerConfig)), services[0])
    if isinstance(service, FrameworkcontrollerConfig):
        return framework(service)
    if not isinstance(service, OpenpaiConfig):
        how = RUNS_AS.get(service.platform, "submits no job")
        raise NoJob(
            f"trialbus render shows the job of platforms that submit jobs (openpai, frameworkcontroller); "
            f"platform {service.platform!r} {how}"
        )
    gpus = config.gpus_for(service) or 0
    if service.reuse_mode:
        defaults = OpenpaiSettings.model_construct()  # the adapter's defaults; this shell's TRIALBUS_* unread
        _, _, job = jobs.environment_job(
            service,
            EXPERIMENT_ID,
            ENVIRONMENT_ID,
            config.command_for(service),
            gpus,
            bundle().hash,
            defaults.reuse_poll,
            defaults.reuse_orphan_timeout,
        )
        header = (
            f"# reuseMode: the OpenPAI job of environment {ENVIRONMENT_ID} of experiment {EXPERIMENT_ID}, which\n"
            f"# runs trials one after another; the ids stand for the ones assigned at run time.\n"
        )
    else:
        command = config.command_for(service)
        _, _, job = jobs.trial_job(service, EXPERIMENT_ID, TRIAL_ID, 0, command, gpus, bundle().hash)
        header = (
            f"# The OpenPAI job of trial {TRIAL_ID} of experiment {EXPERIMENT_ID}, attempt 0; {TRIAL_ID} and\n"
            f"# {EXPERIMENT_ID} stand for the ids the dispatcher assigns. Secrets show as ******.\n"
        )
    return header + yaml.safe_dump(masked(service, job), sort_keys=False)


def framework(service: FrameworkcontrollerConfig) -> str:
    """The YAML of the Framework of the first attempt of a trial (no secret is part of it: an
    Azure storage key goes into a Secret the Framework names)."""
    trial_dir = f"{service.container_mount_path}/trialbus/trials/{EXPERIMENT_ID}/{TRIAL_ID}-0"
    keeper = f"{service.container_mount_path}/trialbus/bin/{fc_adapter.bundle().hash}/trial_keeper.py"
    queue = service.kueue.local_queue if service.kueue is not None else None  # the adapter's default: not known here
    body = frameworks.render(service, EXPERIMENT_ID, TRIAL_ID, 0, REPLICA, trial_dir, keeper, queue)
    header = (
        f"# The Framework of trial {TRIAL_ID} of experiment {EXPERIMENT_ID}, attempt 0, made by adapter replica\n"
        f"# {REPLICA}; the ids stand for the ones assigned at run time.\n"
    )
    return header + yaml.safe_dump(body, sort_keys=False)
