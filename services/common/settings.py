"""Settings every service shares; each service extends :class:`ServiceSettings`.

All settings come from the environment with the prefix ``TRIALBUS_`` (for example
``TRIALBUS_NATS_URL``). Each class is built in the service's ``__main__``, never at import.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.streams import StreamLimits


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRIALBUS_", extra="ignore")

    #: NATS server URL(s), comma-separated.
    nats_url: str = "nats://127.0.0.1:4222"
    #: NATS user and password, when the server requires them.
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    #: A NATS ``.creds`` file (JWT + nkey), instead of user and password.
    nats_creds: Path | None = None
    #: Log level: DEBUG, INFO, WARNING, ERROR.
    log_level: str = "INFO"
    #: JSON log lines (for collectors) instead of plain text.
    log_json: bool = False
    #: Seconds a service may take to stop after SIGTERM before it exits anyway.
    stop_timeout: float = Field(default=10.0, gt=0)
    #: Where services keep local files (trial directories, spools).
    data_dir: Path = Path(".trialbus")
    #: Copies JetStream keeps of every stream, bucket and the code store (3 on a NATS cluster
    #: of 3, so one server's restart pauses nothing); applied by whoever creates them.
    stream_replicas: int = Field(default=1, ge=1, le=5)

    def stream_limits(self) -> StreamLimits | None:
        """What the streams keep, for the one service that owns them (the dispatcher); None for
        the others, which leave the streams as they find them."""
        return None


S = TypeVar("S", bound=ServiceSettings)


def load_settings(cls: type[S], service: str) -> S:
    """``cls()`` from the environment, or exit with one line per problem that names its variable."""
    from pydantic import ValidationError

    try:
        return cls()
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            where = "_".join(map(str, error["loc"])).upper()
            problems.append(f"TRIALBUS_{where}: {message}" if where else message)
        raise SystemExit(f"{service}: invalid settings: {'; '.join(problems)}") from None
