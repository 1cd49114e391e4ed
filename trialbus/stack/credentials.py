"""The secrets of a local stack, generated once under its data dir, and the NATS users they open.

``trialbus up`` runs nats-server with the users and permissions of ``k8s/base/nats/auth.conf``
(the one definition compose and Kubernetes use too) and fills the same variables compose.yaml
fills from ``.env``. Guarantees:

- Each secret is made on first use (``secrets`` / a Fernet key) and kept in its own file of the
  data dir, mode 0600, created exclusively (two ``up`` never race to different values); a
  variable set in ``trialbus up``'s environment is used instead. Kept across runs, so trial
  tokens, sealed secrets and sessions stay valid after a restart.
- ``<data>/api-token``, the file ``trialbus up`` points people to for the web UI, holds the token
  in force: ``TRIALBUS_API_TOKEN``'s when that is set (written there, 0600), never an older one.
- :attr:`Credentials.variables` are compose's names (``TRIALBUS_API_TOKEN``,
  ``NATS_PASSWORD_DISPATCHER``…): each service gets exactly the ones compose.yaml gives it.
- The NATS auth callout's issuer (docs/security.md, "People") is an account nkey pair: its seed
  (``<data>/nats-callout.seed``, ``TRIALBUS_NATS_CALLOUT_SEED``) goes to the dispatcher alone,
  its public key (``NATS_CALLOUT_ISSUER``) to nats-server.
- Nothing here prints or logs a secret.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import nkeys

from trialbus import local
from trialbus.stack.errors import StackError

#: Secrets a local stack keeps, by compose variable, each in its own file (mode 0600).
FILES = {
    "TRIALBUS_API_TOKEN": "api-token",
    "TRIALBUS_TRIAL_SECRET": "trial-secret",
    "TRIALBUS_SECRETS_KEY": "secrets-key",
    "TRIALBUS_NATS_CALLOUT_SEED": "nats-callout.seed",
}
NATS_PASSWORDS = "nats-passwords.json"


def auth_conf() -> Path:
    """auth.conf: the copy an installed wheel carries, else the repository's."""
    packaged = Path(__file__).with_name("nats-auth.conf")
    return packaged if packaged.exists() else Path(__file__).resolve().parents[2] / "k8s/base/nats/auth.conf"


def nats_users(conf: Path | None = None) -> dict[str, str]:
    """The users of auth.conf and the variable each one's password comes from."""
    text = (conf or auth_conf()).read_text()
    found = dict(re.findall(r"^\s*user:\s*([\w-]+)\s*\n\s*password:\s*\$(\w+)", text, re.MULTILINE))
    if not found:
        raise StackError(f"{conf or auth_conf()} defines no NATS users")
    return found


@dataclass(frozen=True)
class Credentials:
    """What a local stack's services and clients authenticate with."""

    api_token: str | None
    trial_secret: str
    secrets_key: str
    #: NATS user → password, every user of auth.conf.
    nats: dict[str, str]
    #: NATS user → the variable its password is read from (``NATS_PASSWORD_<USER>``).
    nats_variables: dict[str, str]
    #: The auth callout issuer's seed (an account nkey, ``SA…``): the dispatcher's alone.
    callout_seed: str

    @property
    def callout_issuer(self) -> str:
        """The public key of :attr:`callout_seed`: what nats-server trusts the callout's answers by."""
        return nkeys.from_seed(self.callout_seed.encode()).public_key.decode()

    @property
    def variables(self) -> dict[str, str]:
        """compose.yaml's variables with their local values."""
        values = {"TRIALBUS_TRIAL_SECRET": self.trial_secret, "TRIALBUS_SECRETS_KEY": self.secrets_key}
        if self.api_token:
            values["TRIALBUS_API_TOKEN"] = self.api_token
        values.update({variable: self.nats[user] for user, variable in self.nats_variables.items()})
        values["TRIALBUS_NATS_CALLOUT_SEED"] = self.callout_seed
        values["NATS_CALLOUT_ISSUER"] = self.callout_issuer
        return values


def load(data_dir: Path, environ: dict[str, str] | None = None) -> Credentials:
    """The stack's credentials: from ``environ`` where set there, else from (or new in) ``data_dir``."""
    environ = dict(os.environ if environ is None else environ)
    no_token = environ.get("TRIALBUS_API_AUTH", "").lower() == "none" and not environ.get("TRIALBUS_API_TOKEN")
    users = nats_users()

    def value(variable: str, make) -> str:
        return environ.get(variable) or secret_file(data_dir / FILES[variable], make)

    if token := environ.get("TRIALBUS_API_TOKEN"):
        keep_secret(data_dir / FILES["TRIALBUS_API_TOKEN"], token)

    passwords = json.loads(
        secret_file(data_dir / NATS_PASSWORDS, lambda: json.dumps({user: nats_password() for user in users}))
    )
    missing = [user for user in users if user not in passwords]
    if missing:  # a newer auth.conf has a user this data dir does not know yet
        passwords.update({user: nats_password() for user in missing})
        local.write_private(data_dir / NATS_PASSWORDS, json.dumps(passwords) + "\n")
    return Credentials(
        api_token=None if no_token else value("TRIALBUS_API_TOKEN", lambda: secrets.token_urlsafe(32)),
        trial_secret=value("TRIALBUS_TRIAL_SECRET", lambda: secrets.token_hex(32)),
        secrets_key=value("TRIALBUS_SECRETS_KEY", lambda: base64.urlsafe_b64encode(os.urandom(32)).decode()),
        nats={user: passwords[user] for user in users},
        nats_variables=users,
        callout_seed=value("TRIALBUS_NATS_CALLOUT_SEED", callout_seed),
    )


def nats_password() -> str:
    """A password nats-server reads as a string from ``$NATS_PASSWORD_*``: it parses the value as a
    config token, so one starting with ``-`` or a digit may become a number; ours start with a letter."""
    return "p" + secrets.token_hex(24)


def callout_seed() -> str:
    """A new seed for the auth callout's issuer: an account nkey (nats-server refuses another kind)."""
    return nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_ACCOUNT).decode()


def secret_file(path: Path, make) -> str:
    """The secret in ``path``, created (mode 0600, exclusively) with ``make()`` on first use."""
    try:
        return _create(path, make())
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        secret = path.read_text().strip()
        if not secret:
            raise StackError(f"{path} is empty: delete it to have a new secret generated") from None
        return secret


def keep_secret(path: Path, secret: str) -> None:
    """``path`` holds ``secret`` (mode 0600), replaced atomically only when it held another."""
    try:
        if path.read_text().strip() == secret and not path.stat().st_mode & 0o077:
            return
    except OSError:
        path.parent.mkdir(parents=True, exist_ok=True)
    local.write_private(path, secret + "\n")


def _create(path: Path, secret: str) -> str:
    """Create ``path`` (mode 0600) holding ``secret``; FileExistsError if it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret
