"""Metrics gateway settings (environment, prefix ``TRIALBUS_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from services.common.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    #: Address the gateway listens on (default 127.0.0.1; 0.0.0.0 when trials run on other hosts).
    gateway_host: str = "127.0.0.1"
    #: TCP port the gateway listens on (default 8081; 0 = any free port).
    gateway_port: int = Field(default=8081, ge=0, le=65535)
    #: Secret shared with the dispatcher (its TRIALBUS_TRIAL_SECRET); trial tokens are HMACs under it. Required.
    trial_secret: SecretStr = Field(min_length=1)
    #: Largest request body, in bytes (default 4 MiB = 4194304); larger requests get 413.
    gateway_max_body: int = Field(default=4 * 1024 * 1024, gt=0)
    #: Most records in one request (default 5000); more get 413 and the keeper splits the batch.
    gateway_max_records: int = Field(default=5000, gt=0)
    #: Seconds to wait for JetStream to ack a batch before answering 503 (default 5.0).
    gateway_publish_timeout: float = Field(default=5.0, gt=0)
    #: Largest ask body (a trial's question to its tuner, docs/optuna.md), in bytes (default 65536).
    gateway_max_ask_body: int = Field(default=64 * 1024, gt=0)
    #: Seconds to wait for the tuner to answer an ask before answering 504 (default 30.0).
    gateway_ask_timeout: float = Field(default=30.0, gt=0)
