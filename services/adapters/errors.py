"""The exceptions that decide what happens to a trial after something went wrong.

An adapter never decides retries itself: it raises one of these and the shared consume
loop (:class:`services.adapters.base.AdapterService`) acts on it, the same way for
every platform. Each adapter maps its platform's errors to them in one function.

- :class:`TransientError` — try again later (the platform is busy, a connection
  dropped, a quota is exhausted for now). The dispatch message is nak'ed with the
  error's ``delay`` and redelivered, possibly to another replica.
- :class:`Waiting` — this replica has no room for the trial now but may have soon (its
  GPUs are taken). The service holds the request, publishes WAITING with the reason, and
  offers it to ``launch`` again whenever capacity may have freed; after ``wait_hold``
  seconds it goes back to the queue, where any replica may take it.
- :class:`PermanentError` — retrying the same request cannot help (bad credentials,
  a code snapshot that does not exist, a command the platform refuses). The attempt
  ends FAILED with the error's message, and the dispatch message is acked.

- :class:`Stale` (from ``poll``) — a transient error for a running trial: polled again
  after ``delay``, and its message is shown on the trial (RUNNING) until a poll succeeds.

Anything else is a bug: it is logged with its traceback and handled like a transient
error with back-off, so a bad release never loses a trial.
"""

from __future__ import annotations


class AdapterError(Exception):
    """Base of the errors an adapter raises on purpose. The message reaches users: no secrets."""


class TransientError(AdapterError):
    """Retry later: after ``delay`` seconds the request is redelivered."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = max(0.0, float(delay))


class PermanentError(AdapterError):
    """Retrying cannot help: the attempt ends FAILED with this message."""


class Waiting(AdapterError):
    """No room now, maybe soon: the message says what the trial waits for (users see it)."""


class Stale(TransientError):
    """The platform cannot be asked about a running trial now (its machine is unreachable):
    the trial stays RUNNING and users see this message on it until the platform answers."""
