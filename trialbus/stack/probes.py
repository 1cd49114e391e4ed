"""Is a part ready? One probe, used by ``up`` (readiness, restarts) and by ``status``: a TCP
port that answers (nats-server), or a ``/healthz`` that answers 200 (every service)."""

from __future__ import annotations

import socket

import httpx


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def health(url: str, timeout: float = 1.0) -> str:
    """``ok``, ``unavailable (NATS disconnected)`` (the service's own word), or ``not answering``."""
    try:
        answer = httpx.get(url, timeout=timeout, trust_env=False)  # no proxy for localhost
    except httpx.HTTPError:
        return "not answering"
    if answer.status_code == 200:
        return "ok"
    try:
        nats = answer.json().get("nats", "")
    except ValueError:
        nats = ""
    return f"unavailable (NATS {nats})" if nats else f"unavailable ({answer.status_code})"
