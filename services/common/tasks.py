"""The first failure among a service's background tasks: what its ``failed()`` reports."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


def first_failure(tasks: Iterable[asyncio.Future[Any]]) -> BaseException | None:
    """The exception of the first task that ended by one; None while all run, ended well or were cancelled."""
    for task in tasks:
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            return exc
    return None
