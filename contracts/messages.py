"""Messages on the bus: dispatch requests, trial events, metric records, control requests."""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, SerializeAsAny, field_validator

from contracts.base import Contract, TrialToken
from contracts.experiment import TrainingService, parse_training_service
from contracts.retries import Failure
from contracts.state import TrialStatus


class TrialRequest(Contract):
    """``dispatch.<adapter>``: run one attempt of one trial. Dedupe id ``<trial>:<attempt>``."""

    kind: Literal["trial.request"] = "trial.request"
    v: Literal[1] = 1
    experiment_id: str
    trial_id: str
    sequence_id: int
    attempt: int = 0
    trial_command: str
    #: ``sha256:<hex>`` of the code snapshot in the ``code`` object store; None runs in the trial dir.
    code_ref: str | None = None
    #: The NNI parameter record, written verbatim to ``parameter.cfg``.
    parameter_record: str
    trial_gpu_number: int | None = None
    training_service: SerializeAsAny[TrainingService]
    #: HMAC of ``<experiment>/<trial>``: the trial's credential at the metrics gateway.
    #: Sealed on the dispatch subject of its platform (in clear there only from a dispatcher
    #: without ``TRIALBUS_SECRETS_KEY``), masked everywhere else.
    token: TrialToken
    #: Seconds the trial may run before it is stopped EARLY_STOPPED (enforced by the dispatcher).
    max_trial_duration: float | None = None
    #: Fork the trial from a warm template where its command allows (the experiment's ``warmStart``).
    warm_start: bool = True
    #: Modules the template imports ahead, beside those it learns (``warmStart.preload``).
    warm_preload: list[str] = Field(default_factory=list)
    #: Seconds between two signs of life from the trial's keeper at least (a third of the
    #: experiment's ``retry.heartbeatTimeout``); None: no heartbeats.
    heartbeat: float | None = Field(default=None, gt=0)
    #: Seconds between SIGTERM and SIGKILL when the trial is stopped (``trialGracePeriod``); None:
    #: the adapter's own default.
    grace_period: float | None = Field(default=None, ge=0)
    #: The experiment's team (``ExperimentState.team``; None for an experiment without one): on local,
    #: whose Unix user the trial runs as; on Kubernetes, the Kueue LocalQueue of a ``{team}`` template.
    team: str | None = None
    #: The experiment's owner (``ExperimentState.owner``; None without one): whom the trial's questions
    #: to its tuner go to (``asks.<owner>.…``, docs/optuna.md), bound into its ask token.
    owner: str | None = None

    _service = field_validator("training_service", mode="before")(parse_training_service)


class TrialEvent(Contract):
    """``events.<experiment>.<trial>.<source>``: a trial changed status, said by its adapter or the
    dispatcher (the source). Dedupe id ``<trial>:<status>:<attempt>``."""

    kind: Literal["trial.event"] = "trial.event"
    v: Literal[1] = 1
    experiment_id: str
    trial_id: str
    attempt: int = 0
    status: TrialStatus
    time: datetime
    #: The trial command's exit code; negative for a signal (``-9`` = SIGKILL).
    exit_code: int | None = None
    #: Why: the failure, the cancel, the wait. Never contains secrets.
    message: str | None = None
    #: The adapter (platform) and the replica that owns the trial.
    platform: str | None = None
    replica: str | None = None
    #: Why the attempt failed, for the retry policy (:data:`contracts.retries.Failure`).
    failure: Failure | None = None
    #: A FAILED attempt's last non-empty stderr line (e.g. ``ModuleNotFoundError: No module named
    #: 'sklearn'``), where its adapter can read it (the keeper's platforms: local, remote, openpai,
    #: frameworkcontroller); None elsewhere. One line, control characters replaced, at most
    #: :data:`ERROR_LINE_MAX` characters. The trial's own output, shown to its experiment's users.
    last_error: str | None = None

    _line = field_validator("last_error", mode="before")(lambda v: error_line(v))


#: The longest ``last_error`` kept, in characters (longer ones keep their end: the error is there).
ERROR_LINE_MAX = 200
#: A terminal's colour and cursor sequences (CSI), dropped from a ``last_error``.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def error_line(text: object) -> str | None:
    """``text`` as a ``last_error``: its last non-empty line, control characters (a terminal's
    escape sequences) replaced by spaces, stripped, at most :data:`ERROR_LINE_MAX` characters
    (the tail, with ``…`` before it); None for nothing or no string. Whoever writes it, a reader
    gets one bounded, printable line."""
    if not isinstance(text, str):
        return None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    line = "".join(c if c.isprintable() else " " for c in _ANSI.sub("", lines[-1])).strip()
    return line if len(line) <= ERROR_LINE_MAX else "…" + line[-(ERROR_LINE_MAX - 1) :]


class MetricType(StrEnum):
    PERIODICAL = "PERIODICAL"
    FINAL = "FINAL"


class MetricRecord(Contract):
    """``metrics.<experiment>.<trial>``: one reported metric. Dedupe id ``<trial>:<type>:<sequence>``."""

    kind: Literal["trial.metric"] = "trial.metric"
    v: Literal[1] = 1
    experiment_id: str
    trial_id: str
    #: The attempt that reported it (each attempt of a trial numbers its records from 0 again).
    attempt: int = Field(default=0, ge=0)
    parameter_id: int | str | None = None
    type: MetricType
    #: 0, 1, 2… for PERIODICAL; always 0 for FINAL (NNI's numbering).
    sequence: int = Field(ge=0)
    #: The value as the NNI SDK encoded it (json_tricks text): what NNI tuners receive.
    value: str
    #: When the gateway accepted it.
    timestamp: datetime

    def decoded(self) -> Any:
        """The value as plain JSON: a number, or a dict with ``default``."""
        return json.loads(self.value)


class CancelRequest(Contract):
    """``control.<adapter>.cancel`` request: stop a trial; the owner replies."""

    kind: Literal["trial.cancel"] = "trial.cancel"
    v: Literal[1] = 1
    experiment_id: str
    trial_id: str
    #: USER_CANCELED for a user's cancel, EARLY_STOPPED for an assessor or maxTrialDuration.
    status: TrialStatus = TrialStatus.USER_CANCELED
    message: str | None = None
    #: The stop is a preemption (a drain): the attempt ends SYS_CANCELED with failure ``preempted``,
    #: and the dispatcher runs the trial again.
    preempt: bool = False
    #: Only this attempt (None: every attempt of the trial the replica holds).
    attempt: int | None = None
    #: Only this replica acts (None: whichever owns the trial): a copy of an attempt that must not run.
    replica: str | None = None


class CancelReply(Contract):
    kind: Literal["trial.cancel.reply"] = "trial.cancel.reply"
    v: Literal[1] = 1
    trial_id: str
    replica: str
    #: True when this replica owns the trial and is stopping it.
    accepted: bool


class DrainRequest(Contract):
    """``control.<adapter>.drain`` request: the named replica stops taking trials and preempts
    the ones it runs (SIGTERM, their grace period, SIGKILL; each runs again as its next attempt),
    or, with ``drain`` false, takes trials again. Only that replica answers."""

    kind: Literal["platform.drain"] = "platform.drain"
    v: Literal[1] = 1
    replica: str = Field(min_length=1)
    drain: bool = True


class DrainReply(Contract):
    kind: Literal["platform.drain.reply"] = "platform.drain.reply"
    v: Literal[1] = 1
    replica: str
    draining: bool
    #: Trials it began to stop for this drain.
    preempted: int = 0


class LogRequest(Contract):
    """``control.<adapter>.log`` request: the tail of a trial's stdout and stderr."""

    kind: Literal["trial.log"] = "trial.log"
    v: Literal[1] = 1
    experiment_id: str
    trial_id: str
    max_bytes: int = Field(default=64 * 1024, gt=0, le=4 * 1024 * 1024)
    #: Which attempt's log; None: the newest one the replica holds.
    attempt: int | None = Field(default=None, ge=0)


class LogReply(Contract):
    kind: Literal["trial.log.reply"] = "trial.log.reply"
    v: Literal[1] = 1
    trial_id: str
    replica: str
    text: str
    #: The attempt the log is of.
    attempt: int | None = None


class CheckRequest(Contract):
    """``control.<adapter>.check`` request, sent when an experiment is created: can the
    platform run its trials (machines reachable, credentials accepted)? One replica answers."""

    kind: Literal["platform.check"] = "platform.check"
    v: Literal[1] = 1
    training_service: SerializeAsAny[TrainingService]

    _service = field_validator("training_service", mode="before")(parse_training_service)


class CheckReply(Contract):
    kind: Literal["platform.check.reply"] = "platform.check.reply"
    v: Literal[1] = 1
    replica: str
    #: What stops the platform from running the experiment's trials, one sentence each.
    problems: list[str] = []


class GpuStatus(Contract):
    """One GPU of an adapter's host, as its inventory (NVML or nvidia-smi) last read it."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    gpu_util: int | None = None
    memory_util: int | None = None
    #: Our trials placed on it (``<trial>:<attempt>``).
    trials: list[str] = []
    #: Processes on it that are not Trialbus trials (compute or graphics).
    foreign_processes: int = 0


class MachineStatus(Contract):
    """One SSH machine of the remote adapter: reachable or not (and why), its load, its GPUs."""

    #: ``user@host:port``.
    name: str
    up: bool
    #: Why it is unreachable (None while up).
    error: str | None = None
    cpus: int = 1
    #: Our trials running there.
    running: int = 0
    gpus: list[GpuStatus] = []
    #: The pools (``trainingService.pool``) of the running experiments that list it: teams'
    #: quotas on ``remote/<pool>`` share these machines' GPUs.
    pools: list[str] = []


class ClusterStatus(Contract):
    """One OpenPAI cluster and user of the openpai adapter: its jobs, environments, limits."""

    #: ``user@host``.
    name: str
    #: Trial jobs (one job per trial) being watched.
    jobs: int = 0
    #: Reuse mode: environment jobs kept, and how many of them hold a trial.
    environments: int = 0
    busy_environments: int = 0
    #: Seconds until submissions resume after OpenPAI answered 429 (None: not paused).
    paused_for: float | None = None
    #: Why the last read of the job states failed (None when it worked).
    error: str | None = None
    #: GPUs of each virtual cluster this user may use (``GET /api/v2/virtual-clusters``, its
    #: ``resourcesTotal``), read every minute: what teams' quotas on ``openpai/<vc>`` share.
    #: A virtual cluster whose GPUs the cluster does not say is left out.
    virtual_clusters: dict[str, float] = {}


class PlatformStatus(Contract):
    """KV ``platforms`` key ``<adapter>.<replica>``: one adapter replica's capacity, refreshed
    every few seconds; the entry expires when the replica stops refreshing it."""

    kind: Literal["platform.status"] = "platform.status"
    v: Literal[1] = 1
    adapter: str
    replica: str
    host: str
    time: datetime
    #: Trials this replica runs at once at most (None: the platform decides).
    max_trials: int | None = None
    running: int = 0
    #: Requests it holds that wait for capacity (GPUs), oldest first: ``<trial>:<attempt>``.
    waiting: list[str] = []
    #: Drained (``trialbus platform drain``): it takes no trials and has preempted its own.
    draining: bool = False
    #: Where the GPU inventory comes from: ``nvml``, ``nvidia-smi`` or ``none``.
    gpu_source: str | None = None
    #: Why there are no GPUs, or why the last inventory read failed.
    gpu_error: str | None = None
    gpus: list[GpuStatus] = []
    #: The remote adapter's SSH machines.
    machines: list[MachineStatus] = []
    #: The openpai adapter's clusters (one entry per cluster and user).
    clusters: list[ClusterStatus] = []
