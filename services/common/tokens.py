"""Per-trial credentials at the metrics gateway (docs/architecture.md, "Security").

A trial's token is an HMAC of ``<experiment>/<trial>`` under a secret the dispatcher and
the gateway share, so the gateway can check it without state and a trial can only
report for itself.

A trial's *ask token* (:func:`ask_token`) is an HMAC of ``ask/<owner>`` under its token: the
trial process gets it (``TRIALBUS_ASK_TOKEN``, with ``TRIALBUS_ASK_OWNER``) to ask its tuner
through the gateway (docs/optuna.md); it cannot derive the token its keeper reports metrics with
from it, nor name another owner for its experiment.
"""

from __future__ import annotations

import hashlib
import hmac


def trial_token(secret: str, experiment_id: str, trial_id: str) -> str:
    return hmac.new(secret.encode(), f"{experiment_id}/{trial_id}".encode(), hashlib.sha256).hexdigest()


def check_token(secret: str, experiment_id: str, trial_id: str, token: str) -> bool:
    return hmac.compare_digest(trial_token(secret, experiment_id, trial_id), token)


def ask_token(token: str, owner: str | None) -> str:
    """The credential a trial's own process asks its tuner with (module docstring)."""
    return hmac.new(token.encode(), f"ask/{owner or ''}".encode(), hashlib.sha256).hexdigest()


def check_ask_token(secret: str, experiment_id: str, trial_id: str, owner: str, token: str) -> bool:
    return hmac.compare_digest(ask_token(trial_token(secret, experiment_id, trial_id), owner), token)
