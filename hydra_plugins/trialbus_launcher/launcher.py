"""The Trialbus launcher: each batch of a Hydra sweep is an experiment, each job one of its trials.

Hydra's sweeper hands :meth:`TrialbusLauncher.launch` a batch of jobs (the whole sweep for the basic sweeper, a
batch at a time for batched sweepers such as Optuna's) and expects their ``JobReturn``\\ s in order. Here:

1. each job's config is composed in this process, as Hydra's submitit launcher does (the trial's host needs no
   config files), and written with the task function, the Hydra context and Hydra's global state to
   ``<sweep dir>/.trialbus/batch-<first job num>/job-<num>.pkl`` (:mod:`trialbus.hydra_job`);
2. one experiment is created for the batch, with that directory as its code (so the files travel to any
   platform), ``python trialbus_hydra_job.py <that directory>`` as its command (the runner, a copy of
   :mod:`trialbus.hydra_job`, travels with them: the trial's host needs hydra-core and cloudpickle, not
   Trialbus), the launcher's settings (``training_service``, ``concurrency``, ``experiment``) and
   ``maxTrialNumber`` the batch's size, so it is DONE once the last job ends;
3. each job is submitted as a trial whose parameters are its overrides (``{"lr": 0.1}``: the columns of the web
   UI) and, under ``_hydra``, its number, overrides and config;
4. each trial is awaited; its ``JobReturn`` is the one the trial pickled beside its job file when this host
   sees it (the local platform, a shared filesystem), else one made from the trial's end: the final result as
   the return value, or a failure naming the trial's status and message.

Ctrl-C stops the experiment (its running trials are cancelled) and is raised on.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from trialbus import hydra_job  # the standard library only at import, as Hydra imports this module at each start

log = logging.getLogger(__name__)
#: :mod:`trialbus.hydra_job` as the batch directory ships it, run by the trial's command.
RUNNER = "trialbus_hydra_job.py"


class Job(NamedTuple):
    """One job of a batch, as the launcher keeps it while its trial runs."""

    #: Hydra's job number (``hydra.job.num``), counted across the sweep's batches.
    num: int
    overrides: list[str]
    #: The job's composed config, ``hydra`` node included.
    config: DictConfig


class TrialFailed(RuntimeError):
    """A job whose trial ended without a JobReturn of its own (cancelled, killed, failed on a remote host)."""


class TrialbusLauncher(Launcher):
    """Hydra builds it from ``hydra.launcher`` (:class:`~hydra_plugins.trialbus_launcher.config.TrialbusLauncherConf`,
    whose fields these are), then calls ``setup`` once and ``launch`` per batch."""

    def __init__(
        self,
        *,
        training_service: Any = None,
        concurrency: int = 4,
        experiment: Any = None,
        python: str | None = None,
        nats_url: str | None = None,
        data_dir: str | None = None,
        token: str | None = None,
        request_timeout: float = 10.0,
    ) -> None:
        self.training_service = _plain(training_service) or {"platform": "local"}
        self.concurrency = concurrency
        self.experiment = _plain(experiment) or {}
        self.python = python or sys.executable
        self.nats_url = nats_url or os.environ.get("TRIALBUS_NATS_URL")  # as trialbus.Experiment
        self.data_dir = data_dir
        self.token = token
        self.request_timeout = request_timeout
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        #: The experiments this launcher created, one per batch.
        self.experiments: list[str] = []

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        batch = sweep_dir / ".trialbus" / f"batch-{initial_job_idx}"
        batch.mkdir(parents=True, exist_ok=True)
        log.info(f"Trialbus launcher is launching {len(job_overrides)} jobs, sweep output dir: {sweep_dir}")
        jobs = [self._write_job(batch, initial_job_idx + i, list(o)) for i, o in enumerate(job_overrides)]
        # The runner travels with the jobs: the trial's host needs hydra-core and cloudpickle, not Trialbus.
        shutil.copyfile(hydra_job.__file__, batch / RUNNER)
        from trialbus.client import Client  # here: Hydra imports this module at every start

        client = Client(self.nats_url, data_dir=self.data_dir, token=self.token, request_timeout=self.request_timeout)
        try:
            client.connect()
            experiment = client.create_experiment(self._experiment_config(batch, len(jobs)))
            self.experiments.append(experiment)
            log.info(f"Trialbus experiment {experiment}")
            try:
                trials = []
                for job in jobs:
                    trial = client.submit_trial(experiment, _parameters(job))
                    log.info(f"\t#{job.num} : {' '.join(filter_overrides(job.overrides))} → trial {trial.id}")
                    trials.append(trial.id)
                return [self._outcome(client, experiment, batch, job, t) for job, t in zip(jobs, trials, strict=True)]
            except KeyboardInterrupt:
                client.stop_experiment(experiment, "the Hydra sweep was interrupted")
                raise
        finally:
            client.close()

    # ----------------------------------------------------------------------------------------- the jobs

    def _write_job(self, batch: Path, num: int, overrides: list[str]) -> Job:
        """Compose the job's config, as Hydra's launchers do, and write its file (``trialbus.hydra_job``)."""
        import cloudpickle
        from hydra.core.singleton import Singleton

        assert self.config is not None and self.hydra_context is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = f"{config.hydra.job.name}_{num}"
            config.hydra.job.num = num
        payload = {
            "task_function": self.task_function,
            "hydra_context": self.hydra_context,
            "config": config,
            "singleton_state": Singleton.get_state(),
            "sys_path": [p for p in sys.path[:1] if p] + [str(config.hydra.runtime.cwd)],
        }
        (batch / hydra_job.job_file(num)).write_bytes(cloudpickle.dumps(payload))
        return Job(num, overrides, config)

    def _experiment_config(self, batch: Path, size: int) -> dict[str, Any]:
        assert self.config is not None
        return {
            "experimentName": f"hydra {self.config.hydra.job.name}: {self.config.hydra.sweep.dir}, {batch.name}",
            **self.experiment,
            "trialCommand": f"{shlex.quote(self.python)} {RUNNER} {shlex.quote(str(batch))}",
            "trialCodeDirectory": str(batch),
            "trialConcurrency": self.concurrency,
            "maxTrialNumber": size,
            "trainingService": self.training_service,
        }

    def _outcome(self, client: Any, experiment: str, batch: Path, job: Job, trial: str) -> JobReturn:
        """The job's JobReturn once its trial ended: the trial's own, else one made from how the trial ended."""
        import cloudpickle

        outcome = client.wait_trial(trial, experiment_id=experiment)
        saved = batch / hydra_job.return_file(job.num)
        if saved.exists():
            job_return: JobReturn = cloudpickle.loads(saved.read_bytes())
            return job_return
        config = job.config
        job_return = JobReturn(
            overrides=job.overrides,
            cfg=_without_hydra(config),
            hydra_cfg=config,
            working_dir=str(Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)),
            task_name=str(config.hydra.job.name),
        )
        if outcome.status.value == "SUCCEEDED":
            job_return.status, job_return.return_value = JobStatus.COMPLETED, hydra_job.from_final(outcome.final)
        else:
            job_return.status = JobStatus.FAILED
            why = f": {outcome.message}" if outcome.message else ""
            job_return.return_value = TrialFailed(f"trial {trial} ended {outcome.status.value}{why}")
        return job_return


def _parameters(job: Job) -> dict[str, Any]:
    """The trial's parameters: each override's value by its key, and Hydra's part under ``_hydra``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parameters: dict[str, Any] = {}
    for override in OverridesParser.create().parse_overrides(job.overrides):
        if not override.is_hydra_override():
            parameters[override.get_key_element()] = _plain(override.value())
    config = OmegaConf.to_container(_without_hydra(job.config), resolve=False)
    parameters[hydra_job.PARAMETER] = {"job": job.num, "overrides": job.overrides, "config": _plain(config)}
    return parameters


def _without_hydra(config: DictConfig) -> DictConfig:
    """The job's config as its task sees it: without the ``hydra`` node (as ``run_job`` passes it)."""
    task = config.copy()
    with open_dict(task):
        del task["hydra"]
    return task


def _plain(value: Any) -> Any:
    """Settings and values as JSON data (OmegaConf containers converted)."""
    return hydra_job.plain(value)
