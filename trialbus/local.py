"""How a client on the same machine finds a running ``trialbus up``: ``<data>/client.json``, and
the entry each running stack keeps in this user's runtime dir (:mod:`trialbus.runtime`).

``trialbus up`` writes both (mode 0600: only its user reads them, as Jupyter's runtime files)
with the NATS URL (every server of a cluster, comma-separated, so a client reaches the cluster
through any of them) and the ``client`` user's password, the API and web UI URLs and the API
token. The CLI, :class:`~trialbus.client.AsyncClient` and ``trialbus.Experiment`` use them when
they are given no NATS credentials, and only for a NATS URL whose servers are all the stack's,
so a password of this machine's stack is never sent to another server.

Which stack, from any directory: the one whose data dir is named (``--data-dir``,
``TRIALBUS_DATA_DIR``); else the running stack whose servers the NATS URL names (``--nats-url``,
``TRIALBUS_NATS_URL``, else the default ports' ``nats://127.0.0.1:4222``), or failing that the
``.trialbus`` (``trialbus up``'s default) of the working directory. A client NATS refused says
where it looked and what to set (:func:`refused`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from trialbus import runtime

CLIENT_FILE = "client.json"
#: The NATS of ``trialbus up`` on its default ports.
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
#: ``trialbus up``'s data dir when none is named, relative to where it runs.
DEFAULT_DATA_DIR = ".trialbus"


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
    return named_dir() or Path(DEFAULT_DATA_DIR)


def named_dir(directory: str | Path | None = None) -> Path | None:
    """``directory``, else ``TRIALBUS_DATA_DIR``; None when neither names a data dir."""
    found = directory or os.environ.get("TRIALBUS_DATA_DIR")
    return Path(found).expanduser() if found else None


def find(directory: Path | None = None) -> LocalStack | None:
    """The local stack's ``client.json``, or None when there is none (or it cannot be read)."""
    path = (directory or data_dir()) / CLIENT_FILE
    try:
        return LocalStack(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def stack_for(url: str, directory: str | Path | None = None) -> LocalStack | None:
    """The stack of this user whose servers ``url`` names (all, or some of a cluster's: the client
    learns the others from them), else None. Only the named data dir's (``directory``, else
    ``TRIALBUS_DATA_DIR``) when one is named; else the running stacks', then ``./.trialbus``'s."""
    return next((found for found in _candidates(directory) if found is not None and _serves(found, url)), None)


def credentials_for(url: str, directory: str | Path | None = None) -> tuple[str, str] | None:
    """The NATS user and password of this user's stack at ``url`` (:func:`stack_for`)."""
    found = stack_for(url, directory)
    return (found.nats_user, found.nats_password) if found else None


def nats_url(given: str | None = None, directory: str | Path | None = None) -> str:
    """The NATS URL to use: ``given``, else that of the stack of the named data dir
    (``directory``, else ``TRIALBUS_DATA_DIR``), else the default ports'."""
    if given:
        return given
    named = named_dir(directory)
    found = find(named) if named is not None else None
    return found.nats_url if found is not None else DEFAULT_NATS_URL


def where_looked(directory: str | Path | None = None) -> str:
    """Where :func:`stack_for` looks, in words, for an error that says what to set."""
    named = named_dir(directory)
    if named is not None:
        return f"{named.resolve() / CLIENT_FILE} (the data dir named)"
    try:
        registry = f"the running stacks of this user ({runtime.runtime_dir()})"
    except runtime.RuntimeDirError as exc:
        registry = f"no running stack ({exc})"
    return f"{registry} and {Path(DEFAULT_DATA_DIR).resolve() / CLIENT_FILE}"


def refused(url: str, reason: str, credentials: str | None, directory: str | Path | None = None) -> str:
    """What a client says when no NATS server at ``url`` took it, for ``reason``, with credentials
    ``"given"``, ``"found"`` here, a person's token (``"person"``), or none (None). Refused for its
    credentials: where they were looked for and what to set, never that the stack is down; else
    the stacks of this user that run elsewhere, if any."""
    said = f"cannot connect to NATS at {url} ({reason})"
    if denied(reason):
        where = where_looked(directory)
        if credentials == "person":
            return (
                f"{said}: it refused your user's token (TRIALBUS_API_TOKEN): a wrong, replaced or removed "
                "token (an admin gives a new one: `trialbus user rotate`), or the stack's dispatcher, which "
                "decides who people are, is not running"
            )
        if credentials == "given":
            return f"{said}: it refused the credentials given (TRIALBUS_NATS_USER, TRIALBUS_NATS_PASSWORD)"
        if credentials == "found":
            return (
                f"{said}: it refused the client user found in {where}: another stack than that one may run "
                f"there now; name its data dir (--data-dir or TRIALBUS_DATA_DIR)"
            )
        return (
            f"{said}: it needs credentials; none were given, and none of this user's `trialbus up` with NATS "
            f"at {url} were found in {where}. Name its data dir (--data-dir or TRIALBUS_DATA_DIR), or set "
            f"TRIALBUS_NATS_USER and TRIALBUS_NATS_PASSWORD"
        )
    others = [f"{r.stack.nats_url} (data dir {r.data_dir})" for r in running() if r.stack.nats_url != url]
    if others:
        return f"{said}; this user's `trialbus up` runs with NATS at {', '.join(others)}: name it with --nats-url"
    return f"{said}; is the stack running (`trialbus up`)?"


def denied(reason: str) -> bool:
    """Whether a NATS server refused a client's credentials (or their absence), as its error says."""
    return any(word in reason.lower() for word in ("authorization", "authentication"))


@dataclass(frozen=True)
class Running:
    """A running ``trialbus up`` of this user, as its runtime entry says."""

    pid: int
    data_dir: str
    #: ISO 8601, UTC.
    started_at: str
    stack: LocalStack


def running() -> list[Running]:
    """Every running ``trialbus up`` of this user, oldest first (:mod:`trialbus.runtime`)."""
    found = []
    for entry in runtime.running():
        with contextlib.suppress(TypeError):
            found.append(Running(entry.pid, entry.data_dir, entry.started_at, LocalStack(**entry.client)))
    return found


def running_at(url: str) -> Running | None:
    """The running ``trialbus up`` of this user whose servers ``url`` names, else None."""
    return next((each for each in running() if _serves(each.stack, url)), None)


def _serves(stack: LocalStack, url: str) -> bool:
    asked = set(_servers(url))
    return bool(asked) and asked <= set(_servers(stack.nats_url))


def _candidates(directory: str | Path | None) -> Iterator[LocalStack | None]:
    named = named_dir(directory)
    if named is not None:
        yield find(named)
        return
    for each in running():
        yield each.stack
    yield find(Path(DEFAULT_DATA_DIR))


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
