"""The remote adapter over loopback SSH: submit→RUNNING once the connection is warm, and
trials per second over two machines.

Two real ``sshd`` (the test suite's fixture: a throwaway host key and user key; as root a
dedicated unprivileged user, else the current one) stand in for two machines. A first
experiment warms up: it opens the connections, installs Trialbus's files and uploads the
code; the measured ones reuse all of it (same code hash: nothing is uploaded again).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.fixtures.sshd import SshServer, default_key, known_hosts_file, ssh_user, sshd_backend, sshd_servers


@contextmanager
def ssh_machines(root: Path, count: int = 2) -> Iterator[list[dict] | None]:
    """``machineList`` entries for ``count`` loopback sshd machines (None without sshd);
    sets the environment the stack about to start needs (known_hosts, a private root)."""
    if sshd_backend() is None:  # OpenSSH, else (not under CI) the test suite's asyncssh server
        yield None
        return
    key = default_key()
    remote_root = f".trialbus-bench-{secrets.token_hex(4)}"
    with sshd_servers(count, key) as servers:
        known = known_hosts_file(root / "known_hosts", *servers)
        os.environ.update(TRIALBUS_SSH_KNOWN_HOSTS=str(known), TRIALBUS_REMOTE_ROOT=remote_root)
        try:
            yield [machine(server, str(key.private)) for server in servers]
        finally:
            shutil.rmtree(ssh_user().home / remote_root, ignore_errors=True)


def machine(server: SshServer, key_file: str) -> dict:
    return {"host": server.host, "port": server.port, "user": ssh_user().name, "sshKeyFile": key_file}
