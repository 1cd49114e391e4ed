"""Per-trial credentials at the metrics gateway (docs/architecture.md, "Security").

A trial's token is an HMAC of ``<experiment>/<trial>`` under a secret the dispatcher and
the gateway share, so the gateway can check it without state and a trial can only
report for itself.
"""

from __future__ import annotations

import hashlib
import hmac


def trial_token(secret: str, experiment_id: str, trial_id: str) -> str:
    return hmac.new(secret.encode(), f"{experiment_id}/{trial_id}".encode(), hashlib.sha256).hexdigest()


def check_token(secret: str, experiment_id: str, trial_id: str, token: str) -> bool:
    return hmac.compare_digest(trial_token(secret, experiment_id, trial_id), token)
