"""The frameworkcontroller adapter through the Kubernetes emulator: trials per second, each
trial one Framework whose task runs as a real process here.

The emulator must run before the stack starts: the adapter reads its kubeconfig and the
storage's mount from the environment it inherits (``TRIALBUS_KUBECONFIG``,
``TRIALBUS_SHARE_MOUNTS``).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.emulators.kubernetes import start_kubernetes

NFS = "nfs://bench.nfs/export"


@contextmanager
def kubernetes_cluster(root: Path, command: str) -> Iterator[dict]:
    """A ``trainingService`` for an emulated cluster (one role running ``command``), for as long as the block runs."""
    share = root / "fc-share"
    share.mkdir(parents=True, exist_ok=True)
    emulator = start_kubernetes(root / "k8s", token=secrets.token_hex(8), volumes={NFS: str(share)})
    os.environ.update(
        TRIALBUS_KUBECONFIG=str(emulator.kubeconfig(root / "kubeconfig")),
        TRIALBUS_SHARE_MOUNTS=json.dumps({NFS: str(share)}),
    )
    try:
        role = {"name": "worker", "taskNumber": 1, "command": command, "cpuNumber": 1, "memorySize": "512mb"}
        yield {
            "platform": "frameworkcontroller",
            "storage": {"storageType": "nfs", "server": "bench.nfs", "path": "/export"},
            "containerMountPath": f"/tmp/tb-fc-bench-{secrets.token_hex(4)}",
            "taskRoles": [role],
        }
    finally:
        emulator.stop()
