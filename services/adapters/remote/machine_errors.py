"""What goes wrong with an SSH machine, and how it is told: the errors that
:class:`~services.adapters.remote.client.Machine` raises, and a sentence for people about each
failed connection.

A call to an unreachable machine raises :class:`MachineDown`, one the agent could not do
:class:`AgentError` (both transient). A connection that fails for a reason of the config —
an unknown or changed host key, a key that cannot be loaded, refused credentials, no ``python3``
— is permanent (:func:`is_permanent`): retrying cannot help until someone fixes it. The
sentences name the machine by ``user@host:port`` and never tell a credential.
"""

from __future__ import annotations

import asyncio

import asyncssh

from contracts.experiment import RemoteMachineConfig
from services.adapters.errors import TransientError
from services.adapters.remote.settings import RemoteSettings


class MachineDown(TransientError):
    """The machine cannot be reached now (the message says since when and why)."""


class AgentError(TransientError):
    """The agent could not do what was asked (its message says why)."""


class UnknownHost(Exception):
    """The machine's host key is not known and trust on first use is off."""


class KeyProblem(Exception):
    """The private key cannot be loaded (missing file, wrong passphrase)."""


class AgentProblem(Exception):
    """The agent cannot run on the machine (no python3)."""


def is_permanent(exc: BaseException) -> bool:
    return isinstance(
        exc, UnknownHost | KeyProblem | AgentProblem | asyncssh.PermissionDenied | asyncssh.HostKeyNotVerifiable
    )


def key_problem(exc: BaseException, config: RemoteMachineConfig) -> str:
    where = config.ssh_key_file or "sshKey"
    if isinstance(exc, FileNotFoundError):
        return f"sshKeyFile {where} for {config.address} does not exist on the adapter's host"
    if isinstance(exc, OSError):
        return f"cannot read sshKeyFile {where} for {config.address}: {exc.strerror}"
    text = str(exc)
    if "passphrase" in text.lower() or "decrypt" in text.lower():
        hint = "wrong sshPassphrase" if config.ssh_passphrase else "the key is encrypted: set sshPassphrase"
        return f"cannot load the private key {where} for {config.address}: {hint}"
    return f"cannot load the private key {where} for {config.address}: {text}"


def describe_error(exc: BaseException, config: RemoteMachineConfig, settings: RemoteSettings) -> str:
    """A sentence for people about a failed connection to the machine ``config`` names; never a secret."""
    name, path = config.address, settings.known_hosts_path
    if isinstance(exc, UnknownHost | KeyProblem | AgentProblem):
        return str(exc)
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        target = config.host if config.port == 22 else f"[{config.host}]:{config.port}"
        return (
            f"the host key of {name} does not match the one in {path}: refusing to connect (if the machine "
            f"was reinstalled, remove the old key with ssh-keygen -R '{target}' -f {path})"
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        how = "password" if config.password is not None else "key"
        return f"authentication failed for {name}: the server refused the {how}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {config.host}:{config.port} (is sshd running on that port?)"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        wait = settings.ssh_connect_timeout
        return f"no answer from {config.host}:{config.port} within {wait:g}s"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect to {config.host}:{config.port}: {exc.strerror}"
    if isinstance(exc, asyncssh.Error):
        return f"SSH error with {name}: {exc.reason}"
    return f"cannot use {name}: {type(exc).__name__}: {exc}"
