"""An emulator of the OpenPAI rest-server v2 jobs API, run as its own process for tests.

``start_openpai`` launches ``python -m tests.emulators.openpai`` on a free port, waits until it
answers, and returns an ``OpenPai`` handle (a context manager; or call ``stop()``). The
emulator validates jobs with the rest-server's own schema and checks, runs every task as a real
local process, and reports status the way the rest-server does (see ``server.py``). With
``tls=(certfile, keyfile)`` it serves HTTPS, as a cluster with a self-signed certificate does
(``tests/fixtures/tls.py`` makes one); its own requests trust ``certfile`` (``OpenPai.verify``).

    pai = start_openpai(tmp_path, users={"alice": "alice-password"})
    token = pai.token("alice")  # an application token, as automation should use
    httpx.post(f"{pai.url}/rest-server/api/v2/jobs", content=job_yaml,
               headers={"Authorization": f"Bearer {token}", "Content-Type": "text/yaml"})
    pai.stop()                  # the server and every process group it started
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from tests.emulators.processes import free_port, stop_server

REPO_ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT = 20.0


class OpenPai:
    """A running emulator: its base URL, credentials, log, and ``stop``."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        url: str,
        state_dir: Path,
        users: Mapping[str, str],
        mounts: Mapping[str, str],
        trusted: Path | None = None,
    ) -> None:
        self.process = process
        self.url = url  # the adapter talks to f"{url}/rest-server/api/v2/..."
        self.state_dir = state_dir
        self.users = dict(users)
        self.mounts = dict(mounts)
        #: What httpx needs to trust this server: the certificates of ``trusted`` over HTTPS, else
        #: the system's (plain HTTP has nothing to verify). Never ``False``.
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=trusted) if trusted else True
        self._tokens: dict[str, str] = {}

    @property
    def api(self) -> str:
        """Base of the v2 API as NNI addresses it (behind nginx)."""
        return f"{self.url}/rest-server/api/v2"

    def login(self, user: str) -> dict[str, object]:
        """``POST /api/v2/authn/basic/login``: ``{user, token, admin, hasGitHubPAT}`` (a 7-day login token)."""
        r = httpx.post(
            f"{self.api}/authn/basic/login", data={"username": user, "password": self.users[user]}, verify=self.verify
        )
        r.raise_for_status()
        return r.json()

    def token(self, user: str) -> str:
        """An application token for ``user``, obtained through the API (cached per user)."""
        if user not in self._tokens:
            login = self.login(user)
            r = httpx.post(
                f"{self.api}/tokens/application",
                headers={"Authorization": f"Bearer {login['token']}"},
                verify=self.verify,
            )
            r.raise_for_status()
            self._tokens[user] = r.json()["token"]
        return self._tokens[user]

    def headers(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(user)}"}

    def job(self, user: str, name: str) -> dict[str, object]:
        """The JobDetail of ``user~name`` (``GET /api/v2/jobs/{user}~{name}``), read as ``user``."""
        r = httpx.get(f"{self.api}/jobs/{user}~{name}", headers=self.headers(user), verify=self.verify)
        r.raise_for_status()
        return r.json()

    def faults(self, job_list_errors: int = 0, unknown: tuple[str, ...] = ()) -> None:
        """Make the next ``job_list_errors`` job lists fail (500) and show the jobs ``unknown``
        (``user~name``) in state UNKNOWN; called again, replaces the faults (none: clears them)."""
        body = {"jobListErrors": job_list_errors, "unknownJobs": list(unknown)}
        httpx.post(f"{self.url}/emulator/faults", json=body, verify=self.verify).raise_for_status()

    def fail_task(self, framework: str, code: int, role: str = "taskrole", index: int = 0) -> None:
        """End a running task of job ``framework`` (``user~name``) as OpenPAI reports a failure of
        the platform, with exit code ``code``: −1001 PodNodeLost (its node is gone: every process
        dies at once), −1000 PodEvicted, −1003 PodPreemptedForCriticalPod or −101
        PodExternalDeleted (SIGTERM, SIGKILL after 2 s). All four are TRANSIENT: OpenPAI retries
        the job by itself, as its next attempt, whatever ``jobRetryCount`` says."""
        body = {"role": role, "index": index, "code": code}
        httpx.post(f"{self.url}/emulator/jobs/{framework}/fail", json=body, verify=self.verify).raise_for_status()

    def log(self) -> str:
        """The emulator's own stdout and stderr."""
        path = self.state_dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop the server, then kill every job process group it recorded (also after a crash). Idempotent."""
        stop_server(self.process, self.state_dir)
        for container, local in self.mounts.items():
            link = Path(container)
            if link.is_symlink() and link.resolve() == Path(local).resolve():
                link.unlink()

    def __enter__(self) -> OpenPai:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _command(
    port: int,
    state_dir: Path,
    users: Mapping[str, str],
    admin: str | None,
    vcs: Mapping[str, Sequence[str]] | None,
    storages: Sequence[str],
    submit_limit: int,
    mounts: Mapping[str, str],
    lag: float,
    submit_window: float = 3600.0,
    tls: tuple[Path, Path] | None = None,
    vc_gpus: Mapping[str, int] | None = None,
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "tests.emulators.openpai",
        "--port",
        str(port),
        "--state",
        str(state_dir),
        "--submit-limit",
        str(submit_limit),
        "--submit-window",
        str(submit_window),
        "--lag",
        str(lag),
    ]
    cmd += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])] if tls else []
    cmd += [arg for name, password in users.items() for arg in ("--user", f"{name}:{password}")]
    cmd += ["--admin", admin] if admin else []
    cmd += [arg for name, members in (vcs or {}).items() for arg in ("--vc", f"{name}:{','.join(members)}")]
    cmd += [arg for name, gpus in (vc_gpus or {}).items() for arg in ("--vc-gpus", f"{name}={gpus}")]
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
    tls: tuple[Path, Path] | None = None,
    vc_gpus: Mapping[str, int] | None = None,
) -> OpenPai:
    """Start an emulator on a free port and wait until it answers.

    ``users`` defaults to ``{"alice": "alice-password"}`` (passwords need 6+ characters to log in).
    ``vcs`` adds virtual clusters with their users; ``default`` stays open to everyone unless
    listed. ``vc_gpus`` gives virtual clusters their GPUs (``resourcesTotal``; 0 unless given; a
    name not in ``vcs`` adds that virtual cluster, open to everyone). ``mounts`` maps container
    paths to local directories (see ``--mount``).
    ``tls=(certfile, keyfile)`` serves HTTPS at ``https://127.0.0.1:<port>``; the handle's own
    requests trust the certificates in ``certfile``, so it should hold the chain up to a
    self-signed root (the server's certificate, then its CA's), as ``Certificates.server`` does.
    """
    users = dict(users or {"alice": "alice-password"})
    mounts = dict(mounts or {})
    state_dir.mkdir(parents=True, exist_ok=True)
    scheme = "https" if tls else "http"
    for _ in range(3):  # another process may take the free port before the server binds it
        port = free_port()
        with (state_dir / "server.log").open("ab") as log:
            process = subprocess.Popen(
                _command(
                    port, state_dir, users, admin, vcs, storages, submit_limit, mounts, lag, submit_window, tls, vc_gpus
                ),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        pai = OpenPai(process, f"{scheme}://127.0.0.1:{port}", state_dir, users, mounts, tls[0] if tls else None)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{pai.api}/info", timeout=1, verify=pai.verify).status_code == 200:
                    return pai
            except httpx.HTTPError as exc:  # not listening yet; but a certificate will not become valid
                if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                    pai.stop()
                    raise RuntimeError(f"tls: certfile must be valid for 127.0.0.1 and end in its CA: {exc}") from None
            time.sleep(0.05)
        pai.stop()
        if "address already in use" not in pai.log():
            break
    raise RuntimeError(f"the OpenPAI emulator did not start:\n{pai.log()}")
