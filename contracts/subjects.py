"""Subject builders and dedupe ids (docs/architecture.md, "Subjects, streams, buckets").

Every subject and ``Nats-Msg-Id`` in Trialbus is built here and nowhere else.

A trial event's subject names who published it: ``events.<experiment>.<trial>.<source>``,
``<source>`` the adapter's name (``local-gpu``, ``remote``…) or ``dispatcher``. The NATS
permissions (``k8s/base/nats/auth.conf``) let each user publish only on its own source, so
the source is who the broker let speak, and the dispatcher applies an adapter's event only
for the trials it dispatched to that adapter (:mod:`services.dispatcher.ownership`).
"""

from __future__ import annotations

import hashlib

API_PREFIX = "trialbus.api"
#: The API as one person: only their NATS connection may publish under ``trialbus.as.<name>``.
API_AS_PREFIX = "trialbus.as"


def dispatch(adapter: str) -> str:
    """Work queue of one adapter service, shared by its replicas."""
    return f"dispatch.{adapter}"


#: The source of the events the dispatcher decides itself (WAITING, the ends it imposes).
DISPATCHER = "dispatcher"


def events(experiment: str = "*", trial: str = "*", source: str = "*") -> str:
    """``events.<experiment>.<trial>.<source>``: a trial's status changes as ``source`` (an
    adapter's name, or :data:`DISPATCHER`) reports them."""
    return f"events.{experiment}.{trial}.{source}"


def experiment_events(experiment: str) -> str:
    """Every event of one experiment, whatever its trial and source: ``events.<experiment>.>``
    (which also matches the source-less ``events.<experiment>.<trial>`` of older versions)."""
    return f"events.{experiment}.>"


def trial_events(experiment: str, trial: str) -> list[str]:
    """The filters that read one trial's events: every source's, and the source-less
    ``events.<experiment>.<trial>`` an older version wrote (a JetStream consumer takes both
    as ``filter_subjects``)."""
    return [events(experiment, trial), f"events.{experiment}.{trial}"]


def metrics(experiment: str = "*", trial: str = "*") -> str:
    return f"metrics.{experiment}.{trial}"


def heartbeats(experiment: str = "*", trial: str = "*") -> str:
    """``heartbeats.<experiment>.<trial>`` (core NATS, no stream): the gateway says a trial's
    keeper is alive though it has no metric to report (:mod:`services.dispatcher.liveness`)."""
    return f"heartbeats.{experiment}.{trial}"


#: The owner part of :func:`asks` for an experiment without one (a person's name starts with a letter).
NO_OWNER = "_"


def asks(owner: str | None = "*", experiment: str = "*", trial: str = "*") -> str:
    """``asks.<owner>.<experiment>.<trial>``: a trial's questions to its tuner (request/reply, core
    NATS: :mod:`contracts.asks`); a person may answer only their own experiments' (the callout)."""
    return f"asks.{owner or NO_OWNER}.{experiment}.{trial}"


def logs(experiment: str = "*", service: str = "*") -> str:
    """``logs.<experiment>.<service>``: a service's log lines about one experiment (the LOGS stream)."""
    return f"logs.{experiment}.{service}"


def control(adapter: str, verb: str) -> str:
    """Request/reply to every replica of an adapter; the one that owns the trial answers."""
    return f"control.{adapter}.{verb}"


def api(operation: str) -> str:
    """``trialbus.api.<operation>``: the REST operations as NATS request/reply."""
    return f"{API_PREFIX}.{operation}"


def api_as(person: str, key: str, operation: str) -> str:
    """``trialbus.as.<person>.<key>.<operation>``: an API call by a person connected to NATS with
    their token, ``key`` its :func:`~contracts.people.token_key`; the broker lets only a connection
    let in with that token publish here (the dispatcher's auth callout grants it), so the subject
    says who asks, and whether with the token they hold now."""
    return f"{API_AS_PREFIX}.{person}.{key}.{operation}"


def person_inbox(person: str) -> str:
    """``_INBOX_as.<person>``: the replies to a person's connection, which only it may subscribe
    to. A token of its own (``_INBOX_as``), so no person's name can reach a service's inbox
    (``_INBOX_<service user>``: a person called ``remote`` must not read the remote adapter's replies)."""
    return f"_INBOX_as.{person}"


def audit(team: str = "*", action: str = ">") -> str:
    """``audit.<team>.<action>``: one change asked of the dispatcher (who, what, the answer),
    under the team whose work it changed (``_`` when none: users, work made before teams)."""
    return f"audit.{team}.{action}"


def platform_key(adapter: str, replica: str) -> str:
    """Key of a replica's status in the ``platforms`` bucket; characters a key cannot hold
    become ``_`` (KV keys: letters, digits, ``-/_=.``)."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_=") else "_" for c in replica)
    return f"{adapter}.{safe}"


def waiting_event_id(trial: str, attempt: int, reason: str) -> str:
    """An adapter's WAITING event: one per reason (the dispatcher's own WAITING has ``event_id``)."""
    return f"{trial}:WAITING:{attempt}:{hashlib.sha1(reason.encode()).hexdigest()[:12]}"


def note_event_id(trial: str, attempt: int, note: str) -> str:
    """An adapter's RUNNING event with a note (status stale, or current again): one per note."""
    return f"{trial}:RUNNING:{attempt}:{hashlib.sha1(note.encode()).hexdigest()[:12]}"


def dispatch_id(trial: str, attempt: int) -> str:
    return f"{trial}:{attempt}"


def event_id(trial: str, status: str, attempt: int) -> str:
    return f"{trial}:{status}:{attempt}"


def running_event_id(trial: str, attempt: int, replica: str) -> str:
    """An adapter's RUNNING event: one per replica that runs the attempt (its restarts repeat it), so a
    second copy on another replica reaches the dispatcher, which stops it."""
    return f"{trial}:RUNNING:{attempt}:{hashlib.sha1(replica.encode()).hexdigest()[:12]}"


def metric_id(trial: str, metric_type: str, sequence: int, attempt: int = 0) -> str:
    """Each attempt numbers its records from 0 again: a retry's are its own (the first attempt's
    ids are those of versions before attempts)."""
    return f"{trial}:{metric_type}:{sequence}" + (f":{attempt}" if attempt else "")


def trial_from_subject(subject: str) -> tuple[str, str]:
    """``events.<exp>.<trial>[.<source>]`` / ``metrics.<exp>.<trial>`` / ``heartbeats.<exp>.<trial>``
    → (experiment, trial)."""
    _, experiment, trial, *_ = subject.split(".", 3)
    return experiment, trial


def source_from_subject(subject: str) -> str | None:
    """``events.<exp>.<trial>.<source>`` → the source (an adapter's name or ``dispatcher``).

    None for a three-token ``events.<exp>.<trial>``: an event written by a version older than
    sources, before an upgrade. Such an event predates the permission that now refuses that
    subject to every user, so a reader takes it as it always did (the dispatcher applies it
    to its trial); nobody can publish one any more where the broker has users.
    """
    parts = subject.split(".", 3)
    return parts[3] if len(parts) == 4 else None
