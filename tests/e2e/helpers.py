"""Small waiting helpers for end-to-end tests (bounded, never sleeps blindly)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float = 30, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


async def await_until(check: Callable[[], T], timeout: float = 30, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


# -- the REST API, as the remote and openpai end-to-end tests drive it -------------------------


def create(stack, config: dict) -> str:
    """Create an experiment through ``POST /experiments``; its id."""
    reply = stack.rest("POST", "/experiments", json=config)
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def submit(stack, experiment: str, parameters: dict) -> str:
    reply = stack.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": parameters})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def trial(stack, trial_id: str) -> dict:
    return stack.rest("GET", f"/trials/{trial_id}").json()


def ended(stack, trial_id: str, timeout: float = 60) -> dict:
    """The trial once it has ended."""
    return wait_until(
        lambda: (t := trial(stack, trial_id))["status"] not in ("WAITING", "RUNNING") and t,
        timeout,
        f"trial {trial_id} to end",
    )
