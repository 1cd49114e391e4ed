"""The openpai adapter through the OpenPAI emulator: trials per second, each trial one job.

The emulator (``tests/emulators/openpai``) runs each job's task as a real process here;
the share is a local folder that the "containers" see under another path.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.emulators.openpai import start_openpai


@contextmanager
def openpai_service(root: Path) -> Iterator[dict]:
    """A ``trainingService`` for an emulated OpenPAI cluster, for as long as the block runs."""
    local, container = root / "pai-share", Path(f"/tmp/tb-pai-bench-{secrets.token_hex(4)}")
    local.mkdir(parents=True, exist_ok=True)
    emulator = start_openpai(root / "pai", mounts={str(container): str(local)}, submit_limit=100_000)
    try:
        yield {
            "platform": "openpai",
            "host": emulator.url,
            "username": "alice",
            "token": emulator.token("alice"),
            "trialCpuNumber": 1,
            "trialMemorySize": "1gb",
            "storageConfigName": "confignfs",
            "localStorageMountPoint": str(local),
            "containerStorageMountPoint": str(container),
        }
    finally:
        emulator.stop()
