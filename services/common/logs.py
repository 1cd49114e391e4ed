"""Structured logs that carry the experiment and trial a line is about.

``bind(experiment=…, trial=…)`` sets context variables that every log line in the
same task picks up, so a handler never has to repeat ids in its messages.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("trialbus_log_context")


@contextmanager
def bind(**ids: str | None) -> Iterator[None]:
    """Attach ids (experiment, trial, …) to every log line in this block."""
    token = _context.set({**_context.get({}), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def bound() -> dict[str, str]:
    """The ids :func:`bind` attached where this is called (empty outside any)."""
    return _context.get({})


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.ctx = _context.get({})
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "ctx", {}),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ctx = " ".join(f"{k}={v}" for k, v in getattr(record, "ctx", {}).items())
        text = super().format(record)
        return f"{text} [{ctx}]" if ctx else text


def setup(service: str, level: str = "INFO", as_json: bool = False) -> None:
    """Configure the root logger once, at service start."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(
        JsonFormatter() if as_json else TextFormatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The NATS client logs every reconnect attempt at ERROR; our callbacks say it once.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
