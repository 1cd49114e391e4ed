"""Subject builders and dedupe ids (DESIGN.md, "Subjects, streams, buckets").

Every subject and ``Nats-Msg-Id`` in Trialbus is built here and nowhere else.
"""

from __future__ import annotations

import hashlib

API_PREFIX = "trialbus.api"


def dispatch(adapter: str) -> str:
    """Work queue of one adapter service, shared by its replicas."""
    return f"dispatch.{adapter}"


def events(experiment: str = "*", trial: str = "*") -> str:
    return f"events.{experiment}.{trial}"


def metrics(experiment: str = "*", trial: str = "*") -> str:
    return f"metrics.{experiment}.{trial}"


def control(adapter: str, verb: str) -> str:
    """Request/reply to every replica of an adapter; the one that owns the trial answers."""
    return f"control.{adapter}.{verb}"


def api(operation: str) -> str:
    """``trialbus.api.<operation>``: the REST operations as NATS request/reply."""
    return f"{API_PREFIX}.{operation}"


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


def metric_id(trial: str, metric_type: str, sequence: int) -> str:
    return f"{trial}:{metric_type}:{sequence}"


def trial_from_subject(subject: str) -> tuple[str, str]:
    """``events.<exp>.<trial>`` / ``metrics.<exp>.<trial>`` → (experiment, trial)."""
    _, experiment, trial = subject.split(".", 2)
    return experiment, trial
