"""Settings of the remote adapter: environment ``TRIALBUS_<NAME>``, e.g. ``TRIALBUS_SSH_KNOWN_HOSTS``.

The machines themselves come with each experiment (``trainingService.machineList``); these
are the adapter's own: how it trusts hosts, how long it waits, where it works on a machine.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from contracts.units import parse_seconds_setting
from services.adapters.gpu.settings import GpuSettings


class RemoteSettings(GpuSettings):
    #: known_hosts file that host keys are checked against (OpenSSH format).
    ssh_known_hosts: Path = Path("~/.ssh/known_hosts")
    #: Trust a host whose key is not in ``ssh_known_hosts`` yet, and add it there (trust on
    #: first use). A key that differs from the recorded one is refused all the same.
    ssh_trust_new_hosts: bool = False
    #: Seconds to open an SSH connection before the machine counts as unreachable.
    ssh_connect_timeout: float = Field(default=10.0, gt=0)
    #: Seconds between SSH keep-alives; three unanswered ones drop the connection.
    ssh_keepalive: float = Field(default=5.0, gt=0)
    #: Seconds a machine may stay unreachable before its trials end FAILED (their real end
    #: unknown) and new trials stop waiting for it; NNI unit strings like ``10m`` work.
    unreachable_timeout: float = Field(default=600.0, gt=0)
    #: Trialbus's folder on each machine, relative to the user's home unless absolute.
    remote_root: str = ".trialbus"
    #: Base URL of the metrics gateway as trials on the machines reach it (default:
    #: ``gateway_url``). When they cannot, the adapter relays their metrics over SSH.
    trial_gateway_url: str | None = None
    #: Base URL of the metrics gateway as this adapter reaches it (for the SSH relay).
    gateway_url: str = "http://127.0.0.1:8081"
    #: Seconds a keeper's undelivered batch waits on the machine before the adapter relays it.
    relay_after: float = Field(default=3.0, ge=0)
    #: Seconds between two status reads of a machine's trials (their ends arrive at once anyway).
    status_poll: float = Field(default=1.0, gt=0)
    #: Seconds one request to a machine may take before the connection counts as broken.
    call_timeout: float = Field(default=30.0, gt=0)
    #: Seconds between SIGTERM and SIGKILL when a trial is canceled (default 5).
    kill_grace: float = Field(default=5.0, ge=0)
    #: Seconds a keeper keeps retrying unsent metrics after its trial ended (default 600).
    flush_timeout: float = Field(default=600.0, ge=0)
    #: Put the stdlib ``nni`` shim first on trials' PYTHONPATH: ``auto`` (default) and ``always`` do
    #: (it serves NNI's trial API and hands the rest to an installed ``nni``), ``never`` does not.
    nni_shim: str = Field(default="auto", pattern="^(auto|always|never)$")
    #: Seconds a finished trial's directory stays on its machine after its end was reported.
    trial_retention: float = Field(default=7 * 86400.0, ge=0)

    #: Seconds between two looks at a running trial's checkpoint directory, for experiments whose
    #: ``checkpointSync`` names no ``interval``: changed, it is copied to the object store (docs/retries.md).
    checkpoint_sync_interval: float = Field(default=60.0, gt=0)
    #: Checkpoint copies in flight at once (each holds one archive in ``data_dir`` while it travels).
    checkpoint_transfers: int = Field(default=4, gt=0)

    _durations = field_validator("unreachable_timeout", "trial_retention", "checkpoint_sync_interval", mode="before")(
        parse_seconds_setting
    )

    @property
    def known_hosts_path(self) -> Path:
        return self.ssh_known_hosts.expanduser()

    @property
    def trials_gateway(self) -> str:
        return self.trial_gateway_url or self.gateway_url
