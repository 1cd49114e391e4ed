"""The real-sshd fixture: key, passphrase and password auth, host-key checking, dropped connections."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import asyncssh
import pytest

from tests.fixtures.sshd import (
    KeyPair,
    SshServer,
    known_hosts_file,
    make_key,
    require_password_user,
    require_sshd,
    ssh_user,
)

pytestmark = pytest.mark.timeout(60)


def connect(server: SshServer, known_hosts: Path, **kwargs) -> asyncssh.SSHClientConnection:
    return asyncssh.connect(
        server.host,
        server.port,
        username=ssh_user().name,
        known_hosts=str(known_hosts),
        config=None,
        agent_path=None,
        connect_timeout=10,
        **kwargs,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def test_key_auth_and_sftp(sshd: SshServer, ssh_key: KeyPair, tmp_path: Path) -> None:
    require_sshd()
    user = ssh_user()
    hosts = known_hosts_file(tmp_path / "known_hosts", sshd)
    async with connect(sshd, hosts, client_keys=[str(ssh_key.private)]) as conn:
        result = await conn.run("id -un", check=True)
        assert result.stdout.strip() == user.name
        target = f"{user.home}/tb-sftp-{os.getpid()}.txt"
        async with conn.start_sftp_client() as sftp:
            async with sftp.open(target, "w") as f:
                await f.write("hello over sftp\n")
            async with sftp.open(target, "r") as f:
                assert await f.read() == "hello over sftp\n"
            assert Path(target).stat().st_uid == user.uid
            await sftp.remove(target)


@pytest.mark.parametrize("kind, fmt", [("ed25519", None), ("ecdsa", "PKCS8")])
async def test_passphrase_key(sshd: SshServer, tmp_path: Path, kind: str, fmt: str | None) -> None:
    require_sshd()
    key = make_key(tmp_path / "keys", "id_pass", passphrase="s3cret phrase", kind=kind, fmt=fmt)
    sshd.authorize(key)
    hosts = known_hosts_file(tmp_path / "known_hosts", sshd)
    client_key = asyncssh.read_private_key(str(key.private), key.passphrase)
    async with connect(sshd, hosts, client_keys=[client_key]) as conn:
        assert (await conn.run("id -un", check=True)).stdout.strip() == ssh_user().name


async def test_password_auth(sshd: SshServer, tmp_path: Path) -> None:
    require_sshd()
    user = require_password_user()
    hosts = known_hosts_file(tmp_path / "known_hosts", sshd)
    async with connect(sshd, hosts, client_keys=[], password=user.password, preferred_auth="password") as conn:
        assert (await conn.run("id -un", check=True)).stdout.strip() == user.name
    with pytest.raises(asyncssh.PermissionDenied):
        await connect(sshd, hosts, client_keys=[], password="wrong", preferred_auth="password")


async def test_wrong_host_key_is_refused(sshd: SshServer, ssh_key: KeyPair, tmp_path: Path) -> None:
    require_sshd()
    other = make_key(tmp_path / "keys", "not_the_host_key")
    hosts = tmp_path / "known_hosts"
    hosts.write_text(f"[{sshd.host}]:{sshd.port} {' '.join(other.public.split()[:2])}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await connect(sshd, hosts, client_keys=[str(ssh_key.private)])


async def test_drop_connections_and_restart(sshd: SshServer, ssh_key: KeyPair, tmp_path: Path) -> None:
    require_sshd()
    hosts = known_hosts_file(tmp_path / "known_hosts", sshd)
    keys = [str(ssh_key.private)]
    pid = 0
    try:
        conn = await connect(sshd, hosts, client_keys=keys)
        result = await conn.run("setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!", check=True)
        pid = int(result.stdout.strip())
        assert alive(pid)

        sshd.drop_connections()
        await asyncio.wait_for(conn.wait_closed(), 10)
        with pytest.raises((asyncssh.Error, OSError)):
            await conn.run("true")
        assert sshd.running
        assert alive(pid), "a program started in the session must survive the dropped connection"

        async with connect(sshd, hosts, client_keys=keys) as conn:
            assert (await conn.run("echo again", check=True)).stdout == "again\n"
            sshd.stop()
            await asyncio.wait_for(conn.wait_closed(), 10)
        assert not sshd.running
        assert alive(pid)
        with pytest.raises(OSError):
            await connect(sshd, hosts, client_keys=keys)

        port = sshd.port
        sshd.start()
        assert sshd.port == port
        async with connect(sshd, hosts, client_keys=keys) as conn:
            assert (await conn.run("echo back", check=True)).stdout == "back\n"
    finally:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_sshd_pair(sshd_pair: tuple[SshServer, SshServer], ssh_key: KeyPair) -> None:
    require_sshd()
    a, b = sshd_pair
    assert a.port != b.port and a.host_key_line != b.host_key_line
    assert ssh_key.public in (a.dir / "authorized_keys").read_text()
    assert ssh_key.public in (b.dir / "authorized_keys").read_text()
    assert a.known_hosts_line().startswith(f"[127.0.0.1]:{a.port} ssh-ed25519 ")
    assert oct(a.dir.stat().st_mode & 0o777) == "0o755"
    assert oct(ssh_key.private.stat().st_mode & 0o777) == "0o600"
