"""A user's NNI advisor, driven as NNI's manager drives one.

An advisor is a class deriving from NNI's ``MsgDispatcherBase`` (as NNI's own Hyperband and BOHB do), named in
``advisor`` or ``tuner`` (NNI tells them apart by the base class, so do we). It is a dispatcher of its own: it
takes the manager's commands as ``handle_*`` calls and answers with ``self.send(CommandType.…, data)`` whenever
it likes (Hyperband sends a trial when another ends). In NNI 3.0 ``send`` writes to ``self._channel``, a
websocket to the manager; here ``_channel`` is an in-process :class:`TunerCommandChannel` that never connects
(constructed through NNI's own "do not connect" URL), read after every call.

To the advisor, as NNI's manager sends them:

* ``handle_initialize(search_space)`` once, the search space as written;
* ``handle_request_trial_jobs(n)``: ``trialConcurrency`` at first, then one more per trial that ends (the count
  NNI's manager keeps: trials asked for and not yet sent are not asked for again); with ``multiThread``, ``n``
  requests of one, run together on the pool;
* ``handle_report_metric_data({parameter_id, trial_job_id, type, sequence, value})`` for each intermediate
  result, and for the final one when the trial ends, ``value`` being the metric as JSON text;
* ``handle_trial_end({trial_job_id, event, hyper_params})``, ``event`` the trial's status and ``hyper_params``
  the JSON text of ``{parameter_id, parameter_source, parameters, parameter_index}``;
* after a restart or a takeover (NNI's resume): ``handle_import_data([{parameter, value}, …])`` for the final
  results of trials from before, ``handle_add_customized_trial([…])`` for those still running.

From the advisor: ``NEW_TRIAL_JOB`` is a trial (its ``parameter_id`` is the trial's, strings included);
``NO_MORE_TRIAL_JOBS`` means none for now (the experiment ends once nothing runs and nothing came since);
``KILL_TRIAL_JOB`` stops a trial EARLY_STOPPED; ``ERROR`` stops the experiment with the advisor's text;
``SEND_TRIAL_JOB_PARAMETER`` (multi-phase, gone from NNI 3.0) stops it too, saying why.

Not passed: trials a person submits by hand (NNI's "customized" trials reach an advisor with a ``None``
parameter id, which NNI's own advisors cannot take). An ``assessor`` beside an advisor is ignored with a
warning, as NNI ignores it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from services.tuner.calls import Calls
from services.tuner.loading import ClassSpec, construct
from services.tuner.nni_classes import plain_parameters
from services.tuner.protocol import ClassFailed, Metric, ParameterId, Parameters, Proposal, TrialEnd

__all__ = ["NniAdvisor", "create", "is_advisor"]

log = logging.getLogger(__name__)

#: NNI's URL prefix for a dispatcher that must not connect (``msg_dispatcher_base``): constructing one is all.
_DETACHED = "ws://_unittest_trialbus"
_CONSTRUCTING = threading.Lock()  # NNI's settings are read from its module while one is constructed


def is_advisor(cls: type) -> bool:
    """Whether ``cls`` derives from NNI's ``MsgDispatcherBase`` (an advisor, not a tuner)."""
    return any(base.__name__ == "MsgDispatcherBase" and base.__module__.startswith("nni.") for base in cls.__mro__)


@contextlib.contextmanager
def _detached() -> Iterator[None]:
    from nni.runtime import msg_dispatcher_base

    with _CONSTRUCTING:
        settings = msg_dispatcher_base.dispatcher_env_vars
        msg_dispatcher_base.dispatcher_env_vars = settings._replace(NNI_TUNER_COMMAND_CHANNEL=_DETACHED)
        try:
            yield
        finally:
            msg_dispatcher_base.dispatcher_env_vars = settings


def _outbox() -> Any:
    """An NNI ``TunerCommandChannel`` that keeps what is sent, for :class:`NniAdvisor` to read."""
    from nni.runtime.tuner_command_channel import TunerCommandChannel

    class Outbox(TunerCommandChannel):
        def __init__(self) -> None:  # no websocket
            self._lock = threading.Lock()
            self._sent: list[tuple[str, Any]] = []

        def connect(self) -> None:
            pass

        def disconnect(self) -> None:
            pass

        def _send(self, command_type: Any, data: Any) -> None:
            with self._lock:
                self._sent.append((getattr(command_type, "value", command_type), data))

        def _receive(self) -> tuple[None, None]:
            return None, None  # commands arrive as handle_* calls

        def take(self) -> list[tuple[str, Any]]:
            with self._lock:
                sent, self._sent = self._sent, []
            return sent

    return Outbox()


def create(spec: ClassSpec, cls: type, search_space: Mapping[str, Any], calls: Calls) -> NniAdvisor:
    """The advisor ``cls(**classArgs)``, constructed without a channel, initialized with the search space."""
    with _detached():
        instance = construct(spec, cls)
    instance._channel = _outbox()
    return NniAdvisor(instance, search_space, calls)


class NniAdvisor:
    """A user's NNI advisor as a :class:`~services.tuner.protocol.TunerLike`."""

    judge = "advisor"
    #: Asked in turn with every other call, ``multiThread`` or not: an advisor sends trials when it likes (on a
    #: later call, as Hyperband does), and its ``n`` requests of one run together on its pool.
    proposers = 0

    def __init__(self, instance: Any, search_space: Mapping[str, Any], calls: Calls) -> None:
        self.instance = instance
        self.calls = calls
        self._lock = threading.Lock()
        self._asked = 0  # trials asked for, not yet sent
        self._params: dict[ParameterId, Parameters] = {}  # sent or adopted, not yet ended
        self._resumed: set[ParameterId] = set()
        self._customized: set[ParameterId] = set()
        self._running_before: list[dict[str, Any]] = []  # resumed trials still running: for add_customized_trial
        self._new: list[tuple[ParameterId, Parameters]] = []
        self._kills: list[str] = []
        self._no_more: str | None = None
        calls.one("handle_initialize", instance.handle_initialize, dict(search_space))
        self._read()

    def _read(self) -> None:
        """What the advisor sent since last time."""
        from nni import load

        for command, data in self.instance._channel.take():
            if command == "TR":
                packed = load(data) if isinstance(data, str) else data
                key = packed["parameter_id"]
                params = plain_parameters(self.calls, "handle_request_trial_jobs", packed.get("parameters"))
                with self._lock:
                    self._params[key] = params
                    self._asked = max(0, self._asked - 1)
                self._new.append((key, params))
                self._no_more = None
            elif command == "NO":
                self._no_more = f"{self.calls.owner} has no more trials for now"
            elif command == "KI":
                self._kills.append(str(load(data) if isinstance(data, str) else data))
            elif command == "ER":
                raise ClassFailed(f"{self.calls.owner} reported an error", str(data))
            elif command == "SP":
                raise ClassFailed(
                    f"{self.calls.owner} sent SEND_TRIAL_JOB_PARAMETER",
                    "multi-phase trials are gone from NNI 3.0, and Trialbus does not run them",
                )
            elif command != "ID":  # INITIALIZED needs no answer
                log.warning("%s sent %s, which an advisor does not send; ignored", self.calls.owner, command)

    def _call(self, method: str, data: Any) -> None:
        self.calls.one(method, getattr(self.instance, method), data)

    def propose(self, count: int) -> Proposal:
        if self._running_before:
            running, self._running_before = self._running_before, []
            self._call("handle_add_customized_trial", running)
        wanted = count - self._asked
        if wanted > 0:
            self._asked += wanted
            if self.calls.concurrent:
                handle = self.instance.handle_request_trial_jobs
                self.calls.many("handle_request_trial_jobs", [(handle, (1,), {}) for _ in range(wanted)])
            else:
                self._call("handle_request_trial_jobs", wanted)
        self._read()
        proposal = Proposal(self._new, self._no_more, for_now=True, kills=self._kills)
        self._new, self._kills = [], []
        return proposal

    def adopt(self, params: Parameters, parameter_id: ParameterId | None, *, resumed: bool) -> ParameterId:
        with self._lock:
            key: ParameterId = parameter_id if parameter_id is not None else f"adopted-{len(self._params)}"
            while key in self._params:
                key = f"{key}+"
            self._params[key] = params
            (self._resumed if resumed else self._customized).add(key)
        if resumed:
            self._running_before.append(
                {"parameter_id": key, "parameter_source": "resumed", "parameters": params, "parameter_index": 0}
            )
        return key

    def import_data(self, data: list[dict[str, Any]]) -> None:
        """``handle_import_data``, as NNI's manager sends IMPORT_DATA."""
        self._call("handle_import_data", data)
        self._read()

    def forget(self, parameter_id: ParameterId) -> None:
        with self._lock:
            self._params.pop(parameter_id, None)

    def update_search_space(self, search_space: Mapping[str, Any]) -> None:
        """The search space changed: NNI's ``handle_update_search_space``, as its manager sends it."""
        self.calls.one("handle_update_search_space", self.instance.handle_update_search_space, dict(search_space))
        self._read()

    def _metric(self, key: ParameterId, trial_id: str, kind: str, sequence: int, value: Any) -> dict[str, Any]:
        return {
            "parameter_id": key,
            "trial_job_id": trial_id,
            "type": kind,
            "sequence": sequence,
            "value": json.dumps(value),
        }

    def report(self, parameter_id: ParameterId, step: int, value: Metric, *, trial_id: str) -> None:
        if parameter_id in self._resumed or parameter_id in self._customized:
            return
        self._call("handle_report_metric_data", self._metric(parameter_id, trial_id, "PERIODICAL", step, value))
        self._read()

    def should_prune(self, parameter_id: ParameterId, *, trial_id: str) -> bool:
        if trial_id in self._kills:
            self._kills.remove(trial_id)
            return True
        return False

    def finish(self, ends: list[tuple[ParameterId, TrialEnd]]) -> None:
        imports, finals, told = [], [], []
        with self._lock:
            for key, end in ends:
                params = self._params.pop(key, None)
                if params is None or key in self._customized:
                    self._customized.discard(key)
                    continue
                if key in self._resumed:
                    self._resumed.discard(key)
                    self._running_before = [t for t in self._running_before if t["parameter_id"] != key]
                    if end.final is not None:
                        imports.append({"parameter": params, "value": end.final})
                    continue
                if end.final is not None:
                    finals.append(self._metric(key, end.trial_id, "FINAL", 0, end.final))
                hyper_params = {
                    "parameter_id": key,
                    "parameter_source": "algorithm",
                    "parameters": params,
                    "parameter_index": 0,
                }
                told.append(
                    {"trial_job_id": end.trial_id, "event": end.status.value, "hyper_params": json.dumps(hyper_params)}
                )
        if imports:
            self._call("handle_import_data", imports)
        for method, batch in (("handle_report_metric_data", finals), ("handle_trial_end", told)):
            if self.calls.concurrent:
                self.calls.many(method, [(getattr(self.instance, method), (data,), {}) for data in batch])
            else:
                for data in batch:
                    self._call(method, data)
        self._read()

    def close(self, *, ended: bool, failed: bool = False) -> None:
        if failed or ended:
            self.calls.hook(self.instance, "_on_error" if failed else "_on_exit")
        self.calls.close()
