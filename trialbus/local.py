"""How a client on the same machine finds a running ``trialbus up``: ``<data>/client.json``.

``trialbus up`` writes it (mode 0600: only its user reads it, as Jupyter's runtime files) with
the NATS URL (every server of a cluster, comma-separated, so a client reaches the cluster
through any of them) and the ``client`` user's password, the API and web UI URLs and the API
token. The CLI, :class:`~trialbus.client.AsyncClient` and ``trialbus.Experiment`` use it when
they are given no NATS credentials, and only for a NATS URL whose servers are all the stack's,
so a password of this machine's stack is never sent to another server. The data dir is
``TRIALBUS_DATA_DIR``, else ``.trialbus`` (``trialbus up``'s default) in the working directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CLIENT_FILE = "client.json"


@dataclass(frozen=True)
class LocalStack:
    #: Every nats-server of the stack, comma-separated.
    nats_url: str
    nats_user: str
    nats_password: str
    api_url: str
    webui_url: str
    api_token: str | None = None

    @property
    def login_url(self) -> str:
        """The web UI's address that logs this browser in (as Jupyter's ``?token=`` link)."""
        return f"{self.webui_url}/login?token={self.api_token}" if self.api_token else self.webui_url


def data_dir() -> Path:
    return Path(os.environ.get("TRIALBUS_DATA_DIR") or ".trialbus")


def find(directory: Path | None = None) -> LocalStack | None:
    """The local stack's ``client.json``, or None when there is none (or it cannot be read)."""
    path = (directory or data_dir()) / CLIENT_FILE
    try:
        return LocalStack(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def stack_for(url: str) -> LocalStack | None:
    """The local stack when ``url`` names its servers (all, or some of a cluster's: the client
    learns the others from them), else None."""
    found, asked = find(), set(_servers(url))
    if found is None or not asked or not asked <= set(_servers(found.nats_url)):
        return None
    return found


def credentials_for(url: str) -> tuple[str, str] | None:
    """The local stack's NATS user and password when ``url`` names its servers."""
    found = stack_for(url)
    return (found.nats_user, found.nats_password) if found else None


def write(directory: Path, stack: LocalStack) -> Path:
    """Write ``client.json`` (mode 0600) atomically."""
    path = directory / CLIENT_FILE
    write_private(path, json.dumps(asdict(stack)))
    return path


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, readable by this user only (mode 0600 from
    the start: never a moment when another user could read it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def _servers(url: str) -> list[str]:
    return sorted(s.strip().rstrip("/").replace("localhost", "127.0.0.1") for s in url.split(",") if s.strip())
