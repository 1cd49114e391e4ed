"""An emulator of the OpenPAI rest-server v2 jobs API, run as its own process for tests.

``start_openpai`` launches ``python -m tests.emulators.openpai`` on a free port, waits until it
answers, and returns an ``OpenPai`` handle; the ``openpai`` fixture does the same per test. The
emulator validates jobs with the rest-server's own schema and checks, runs every task as a real
local process, and reports status the way the rest-server does (see ``server.py``).

    pai = start_openpai(tmp_path, users={"alice": "alice-password"})
    token = pai.token("alice")  # an application token, as automation should use
    httpx.post(f"{pai.url}/rest-server/api/v2/jobs", content=job_yaml,
               headers={"Authorization": f"Bearer {token}", "Content-Type": "text/yaml"})
    pai.stop()                  # the server and every process group it started
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest

from tests.fixtures.nats import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT = 20.0


class OpenPai:
    """A running emulator: its base URL, credentials, log, and ``stop``."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, state_dir: Path, users: Mapping[str, str],
                 mounts: Mapping[str, str]) -> None:
        self.process = process
        self.url = url  # the adapter talks to f"{url}/rest-server/api/v2/..."
        self.state_dir = state_dir
        self.users = dict(users)
        self.mounts = dict(mounts)
        self._tokens: dict[str, str] = {}

    @property
    def api(self) -> str:
        """Base of the v2 API as NNI addresses it (behind nginx)."""
        return f"{self.url}/rest-server/api/v2"

    def login(self, user: str) -> dict[str, object]:
        """``POST /api/v2/authn/basic/login``: ``{user, token, admin, hasGitHubPAT}`` (a 7-day login token)."""
        r = httpx.post(f"{self.api}/authn/basic/login", data={"username": user, "password": self.users[user]})
        r.raise_for_status()
        return r.json()

    def token(self, user: str) -> str:
        """An application token for ``user``, obtained through the API (cached per user)."""
        if user not in self._tokens:
            login = self.login(user)
            r = httpx.post(f"{self.api}/tokens/application", headers={"Authorization": f"Bearer {login['token']}"})
            r.raise_for_status()
            self._tokens[user] = r.json()["token"]
        return self._tokens[user]

    def headers(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(user)}"}

    def job(self, user: str, name: str) -> dict[str, object]:
        """The JobDetail of ``user~name`` (``GET /api/v2/jobs/{user}~{name}``), read as ``user``."""
        r = httpx.get(f"{self.api}/jobs/{user}~{name}", headers=self.headers(user))
        r.raise_for_status()
        return r.json()

    def log(self) -> str:
        """The emulator's own stdout and stderr."""
        path = self.state_dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop the server, then kill every job process group it recorded (also after a crash). Idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for record in (self.state_dir / "pgids").glob("*"):
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.killpg(int(record.name), signal.SIGKILL)
            record.unlink(missing_ok=True)
        for container, local in self.mounts.items():
            link = Path(container)
            if link.is_symlink() and link.resolve() == Path(local).resolve():
                link.unlink()

    def __enter__(self) -> OpenPai:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _command(port: int, state_dir: Path, users: Mapping[str, str], admin: str | None,
             vcs: Mapping[str, Sequence[str]] | None, storages: Sequence[str], submit_limit: int,
             mounts: Mapping[str, str], lag: float, submit_window: float = 3600.0) -> list[str]:
    cmd = [sys.executable, "-m", "tests.emulators.openpai", "--port", str(port), "--state", str(state_dir),
           "--submit-limit", str(submit_limit), "--submit-window", str(submit_window), "--lag", str(lag)]
    cmd += [arg for name, password in users.items() for arg in ("--user", f"{name}:{password}")]
    cmd += ["--admin", admin] if admin else []
    cmd += [arg for name, members in (vcs or {}).items() for arg in ("--vc", f"{name}:{','.join(members)}")]
    cmd += [arg for name in storages for arg in ("--storage", name)]
    cmd += [arg for c, local in mounts.items() for arg in ("--mount", f"{c}={local}")]
    return cmd


def start_openpai(
    state_dir: Path,
    users: Mapping[str, str] | None = None,
    admin: str | None = None,
    vcs: Mapping[str, Sequence[str]] | None = None,
    storages: Sequence[str] = ("confignfs",),
    submit_limit: int = 60,
    mounts: Mapping[str, str] | None = None,
    lag: float = 0.0,
    submit_window: float = 3600.0,
) -> OpenPai:
    """Start an emulator on a free port and wait until it answers.

    ``users`` defaults to ``{"alice": "alice-password"}`` (passwords need 6+ characters to log in).
    ``vcs`` adds virtual clusters with their users; ``default`` stays open to everyone unless
    listed. ``mounts`` maps container paths to local directories (see ``--mount``).
    """
    users = dict(users or {"alice": "alice-password"})
    mounts = dict(mounts or {})
    state_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # another process may take the free port before the server binds it
        port = free_port()
        with (state_dir / "server.log").open("ab") as log:
            process = subprocess.Popen(
                _command(port, state_dir, users, admin, vcs, storages, submit_limit, mounts, lag, submit_window),
                cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        pai = OpenPai(process, f"http://127.0.0.1:{port}", state_dir, users, mounts)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{pai.api}/info", timeout=1).status_code == 200:
                    return pai
            time.sleep(0.05)
        pai.stop()
        if "address already in use" not in pai.log():
            break
    raise RuntimeError(f"the OpenPAI emulator did not start:\n{pai.log()}")


@pytest.fixture
def openpai(tmp_path: Path) -> Iterator[OpenPai]:
    """A fresh emulator per test, user ``alice`` (password ``alice-password``)."""
    pai = start_openpai(tmp_path / "openpai")
    try:
        yield pai
    finally:
        pai.stop()
