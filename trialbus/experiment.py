"""``trialbus.Experiment``: NNI's ``nni.experiment.Experiment`` for people who drive NNI from Python.

The same script shape works::

    from trialbus import Experiment

    experiment = Experiment("local")                    # or Experiment("config.yml"), or a dict
    experiment.config.trial_command = "python3 mnist.py"
    experiment.config.trial_code_directory = "."
    experiment.config.search_space = search_space
    experiment.config.tuner.name = "TPE"
    experiment.config.tuner.class_args["optimize_mode"] = "maximize"
    experiment.config.max_trial_number = 10
    experiment.config.trial_concurrency = 2
    experiment.run()                                    # True once DONE

``run`` creates the experiment, waits until it is DONE (or STOPPED) and, as NNI's does, stops it on
Ctrl-C. The tuner runs in the stack's tuner service, not in this process: ``start`` returns at once
and the experiment goes on without this script (``Experiment.connect(id)`` finds it again).
``port`` and ``debug`` are accepted for NNI's signatures; the stack's web UI is already running.
It connects to ``nats_url`` (else ``TRIALBUS_NATS_URL``, else the NATS of ``data_dir``'s stack), with
the credentials of this user's ``trialbus up`` there, found from any directory (:mod:`trialbus.local`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from contracts import ExperimentConfig, ExperimentStatus, TrialState, TrialStatus
from contracts.state import default_metric
from services.tuner import checks
from trialbus.client import Client, ExperimentView, TrialMetric, as_config

__all__ = ["Experiment", "best_trial", "check_tuner"]

#: Seconds between two looks at the experiment's status while waiting for it (one small answer, O(1) at the
#: dispatcher): how late ``wait`` returns after its end at most.
LOOK = 0.1
#: Seconds between two listings of its trials for ``wait``'s ``progress`` (a listing costs O(trials)).
POLL = 0.5


def check_tuner(config: ExperimentConfig) -> None:
    """Refuse, before anything is created, a config the tuner service could not run (ValueError, with why).

    Built-in names (and their search space) are checked here exactly as the service builds them; a
    ``className`` is checked for shape and loaded only where the tuner service runs (its code directory and
    the nni package live there), and gets the search space as written, in whatever format it reads.
    """
    if not (config.tuner or config.advisor):
        raise ValueError(
            "the config has no tuner: add one, e.g. `tuner: {name: TPE, classArgs: {optimize_mode: "
            "maximize}}` (or submit trials yourself with trialbus.Client)"
        )
    checks.check(config)


def best_trial(trials: list[TrialState], config: ExperimentConfig) -> TrialState | None:
    """The succeeded trial with the best default metric for the tuner's ``optimize_mode``; None if none has one."""
    scored = [
        (m, t)
        for t in trials
        if t.status == TrialStatus.SUCCEEDED and (m := default_metric(t.final_metric)) is not None
    ]
    if not scored:
        return None
    pick = min if config.optimize_mode == "minimize" else max
    return pick(scored, key=lambda pair: pair[0])[1]


class _Section:
    """An NNI config section filled in attribute by attribute (``config.tuner.name = "TPE"``)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def to_dict(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in self.__dict__.items() if v is not None and not (k == "class_args" and not v)}


def _plain(value: Any) -> Any:
    if isinstance(value, _Section):
        return value.to_dict()
    return [_plain(v) for v in value] if isinstance(value, list) else value


def _draft(platform: str | list[str]) -> _Section:
    """NNI's ``Experiment("local")``, or ``Experiment(["local", "remote"])`` for hybrid mode."""
    service = [_Section(platform=p) for p in platform] if isinstance(platform, list) else _Section(platform=platform)
    return _Section(
        trial_concurrency=1,
        trial_code_directory=".",
        training_service=service,
        tuner=_Section(name=None, class_args={}),
        assessor=None,
    )


class Experiment:
    """One experiment on a Trialbus stack; see the module's docs."""

    def __init__(
        self,
        config: ExperimentConfig | Mapping[str, Any] | str | Path | list[str],
        *,
        nats_url: str | None = None,
        user: str | None = None,
        password: str | None = None,
        request_timeout: float = 10.0,
        data_dir: str | Path | None = None,
    ) -> None:
        if isinstance(config, str) and not config.endswith((".yml", ".yaml", ".json")) and not Path(config).exists():
            self.config: Any = _draft(config)  # a platform name, as Experiment("local") in NNI
        elif isinstance(config, list) and all(isinstance(p, str) for p in config):
            self.config = _draft(config)  # NNI's hybrid mode: Experiment(["local", "remote"])
        else:
            # a list that is not all platform names: as_config takes it as dict() does, and refuses it
            self.config = as_config(cast(Mapping[str, Any], config) if isinstance(config, list) else config)
        self.id: str | None = None
        self._client = Client(
            nats_url or os.environ.get("TRIALBUS_NATS_URL"),
            user=user,
            password=password,
            request_timeout=request_timeout,
            data_dir=data_dir,
        )
        self._connected = False

    @classmethod
    def connect(cls, experiment_id: str, **options: Any) -> Experiment:
        """An experiment already on the stack (NNI's ``Experiment.connect``), by id."""
        client = Client(options.pop("nats_url", None) or os.environ.get("TRIALBUS_NATS_URL"), **options)
        client.connect()
        view = client.get_experiment(experiment_id)
        experiment = cls.__new__(cls)
        experiment.config, experiment.id = view.config, view.id
        experiment._client, experiment._connected = client, True
        return experiment

    @classmethod
    def resume(
        cls,
        experiment_id: str,
        port: int | None = None,
        *,
        wait_completion: bool = True,
        debug: bool = False,
        **options: Any,
    ) -> Experiment:
        """Run a STOPPED experiment again (NNI's ``Experiment.resume``); with ``wait_completion``,
        block until it is DONE or STOPPED (Ctrl-C stops it). ``port`` and ``debug`` are NNI's, unused."""
        experiment = cls.connect(experiment_id, **options)
        experiment._client.resume_experiment(experiment_id)
        if wait_completion:
            try:
                experiment.wait()
            except KeyboardInterrupt:
                experiment.stop()
                raise
        return experiment

    # ----------------------------------------------------------------- lifecycle

    def _api(self) -> Client:
        if not self._connected:
            self._client.connect()
            self._connected = True
        return self._client

    def validated_config(self) -> ExperimentConfig:
        """The config as it will be created: a draft filled in by attribute is validated here."""
        if isinstance(self.config, _Section):
            self.config = as_config(self.config.to_dict())
        check_tuner(self.config)
        return self.config

    def start(self, port: int | None = None, debug: bool = False) -> str:
        """Create the experiment (its code packed and uploaded); the tuner service drives it from now on."""
        config = self.validated_config()
        self.id = self._api().create_experiment(config)
        return self.id

    def run(self, port: int | None = None, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """Start and, with ``wait_completion``, wait: True when DONE, False when STOPPED. Ctrl-C stops it."""
        self.start(port, debug)
        if not wait_completion:
            return None
        try:
            return self.wait() == ExperimentStatus.DONE
        except KeyboardInterrupt:
            self.stop()
            raise

    def wait(
        self,
        progress: Callable[[ExperimentView, list[TrialState]], None] | None = None,
        poll: float = POLL,
        look: float = LOOK,
    ) -> ExperimentStatus:
        """Block until the experiment is DONE or STOPPED, at most ``look`` seconds after it ended; ``progress``
        sees it and its trials every ``poll`` seconds, and once more at the end."""
        listed = None
        while True:
            view = self.get_experiment_profile()
            over = view.status != ExperimentStatus.RUNNING
            now = time.monotonic()
            if progress is not None and (over or listed is None or now - listed >= poll):
                progress(view, self.list_trial_jobs())
                listed = now
            if over:
                return view.status
            time.sleep(min(look, poll))

    def stop(self) -> None:
        """Stop it: no new trials, running ones canceled."""
        self._api().stop_experiment(self._id())

    def close(self) -> None:
        """Close the connection (the experiment goes on)."""
        self._client.close()

    def __enter__(self) -> Experiment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------- reading

    def _id(self) -> str:
        if self.id is None:
            raise RuntimeError("the experiment is not started yet: call start() or run() first")
        return self.id

    def get_status(self) -> str:
        """RUNNING, DONE or STOPPED."""
        return self.get_experiment_profile().status.value

    def get_experiment_profile(self) -> ExperimentView:
        return self._api().get_experiment(self._id())

    def list_trial_jobs(self, status: str | None = None) -> list[TrialState]:
        return self._api().list_trials(self._id(), status=status)

    def get_trial_job(self, trial_id: str) -> TrialState:
        return self._api().get_trial(trial_id)

    def get_job_statistics(self) -> list[dict[str, Any]]:
        """NNI's shape: ``[{"trialJobStatus": "SUCCEEDED", "trialJobNumber": 8}, …]``."""
        counts = self.get_experiment_profile().trial_counts
        return [{"trialJobStatus": s, "trialJobNumber": n} for s, n in counts.items() if n]

    def get_job_metrics(self, trial_id: str) -> list[TrialMetric]:
        return self._api().trial_metrics(trial_id)

    def export_data(self) -> list[dict[str, Any]]:
        """NNI's ``export_data``: each succeeded trial's parameters and final value."""
        return [
            {"trial_id": t.id, "parameter": t.parameters, "value": t.final_metric}
            for t in self.list_trial_jobs(TrialStatus.SUCCEEDED.value)
        ]

    def best_trial(self) -> TrialState | None:
        """The succeeded trial with the best default metric in the tuner's ``optimize_mode``."""
        return best_trial(self.list_trial_jobs(), self.config)  # started: the config is validated
