"""The client tuners use: experiments, trials and metrics over the dispatcher's NATS API.

:class:`AsyncClient` speaks request/reply to ``trialbus.api.<op>`` (docs/internals.md §3)
and reads the EVENTS and METRICS streams; :class:`Client` is the same API for plain,
synchronous Python, running an event loop in a background thread.

Guarantees:

- An API error raises :class:`TrialbusError` with the dispatcher's HTTP-like status and
  message; no dispatcher answering is a 503, no answer in ``request_timeout`` a 504.
- ``events()`` and ``metrics()`` read from the start of their stream with ordered
  consumers and yield each record once, even when it was published twice.
- ``wait_final()`` costs no request per trial and no polling: each experiment has one
  :class:`~trialbus.watcher.ExperimentWatcher` whose two subscriptions resolve the futures
  of every trial awaited in it.
"""

from __future__ import annotations

from services.common.code import CodeUpload
from trialbus.api import DEFAULT_NATS_URL, ExperimentView, SubmittedTrial, TrialbusError, TrialMetric
from trialbus.async_client import AsyncClient
from trialbus.configs import as_config
from trialbus.sync import Client
from trialbus.watcher import TrialOutcome

__all__ = [
    "DEFAULT_NATS_URL",
    "AsyncClient",
    "Client",
    "CodeUpload",
    "ExperimentView",
    "SubmittedTrial",
    "TrialMetric",
    "TrialOutcome",
    "TrialbusError",
    "as_config",
]
