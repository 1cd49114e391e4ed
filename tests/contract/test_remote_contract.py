"""The adapter contract against the remote adapter: trials on a real OpenSSH ``sshd`` "machine"
on loopback (``tests/fixtures/sshd.py``), launched over SSH by the machine's agent.

The machine comes with each trial's ``trainingService`` and with the experiment on the bus
(where a restarted adapter finds it again), as the dispatcher puts it there. As root the
trials run as the fixture's unprivileged user, so the workspace they write their start
markers to, and their remote root, are folders that user can write.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from contracts.experiment import RemoteConfig
from services.adapters.errors import Waiting
from services.adapters.remote import RemoteAdapter, RemoteSettings
from services.common.bus import Bus
from tests.contract.adapter_contract import NO_GATEWAY, AdapterContract
from tests.contract.harness import Harness
from tests.fixtures.gpus import FAKE_NVIDIA_SMI, set_fake_gpus
from tests.fixtures.sshd import KeyPair, SshServer, known_hosts_file, ssh_user


class TestRemoteAdapter(AdapterContract):
    capacity = 2
    #: SIGTERM's end reaches the adapter with the agent's next status read.
    cancel_within = 3.0
    #: The adapter also calls ``notify()`` with no handle whenever a machine's connection comes up
    #: (a reconnect may have missed ends), which the first launch does; and it names an ended
    #: trial once when its keeper exits and again when the trial's last checkpoint copy is done,
    #: which ``poll`` waits for.
    notifies_while_running = True

    @pytest.fixture
    def workspace(self) -> Iterator[Path]:
        """Not pytest's tmp_path: the machine's user must traverse it and write the start markers."""
        folder = Path(tempfile.mkdtemp(prefix="tb-contract-remote-"))
        folder.chmod(0o755)
        (folder / "starts").mkdir()
        (folder / "starts").chmod(0o777)
        yield folder
        shutil.rmtree(folder, ignore_errors=True)

    @pytest.fixture(autouse=True)
    async def machine(self, sshd: SshServer, ssh_key: KeyPair, workspace: Path, bus: Bus) -> AsyncIterator[None]:
        """The sshd machine, trusted, in a fresh Trialbus folder; its experiment on the bus."""
        known_hosts_file(workspace / "known_hosts", sshd)
        self.remote_root = f".trialbus-contract-{secrets.token_hex(4)}"
        self.nvidia_smi = fake_nvidia_smi(workspace / "gpus", count=self.capacity)
        machine = {"host": sshd.host, "port": sshd.port, "user": ssh_user().name, "sshKeyFile": str(ssh_key.private)}
        self.service = RemoteConfig.model_validate({"platform": "remote", "machineList": [machine]})
        await self.put_experiment(bus)
        yield
        root = ssh_user().home / self.remote_root
        kill_processes_under(root)  # a trial the test's cleanup could not end must not outlive the test
        shutil.rmtree(root, ignore_errors=True)

    def make_adapter(self, workspace: Path) -> RemoteAdapter:
        settings = RemoteSettings(
            replica="contract",
            ssh_known_hosts=workspace / "known_hosts",
            remote_root=self.remote_root,
            kill_grace=1,
            status_poll=0.2,
            ssh_keepalive=1,
            nni_shim="never",
            nvidia_smi=str(self.nvidia_smi),
            gateway_url=NO_GATEWAY,
            relay_after=1,  # no gateway: trials here report no metrics
        )
        return RemoteAdapter(settings)

    # ------------------------------------------------------------------ where the platform differs

    async def test_no_capacity_is_none_until_a_trial_ends(self, platform: Harness) -> None:
        """A remote machine takes any number of CPU trials (placement only spreads them), so its
        capacity is its GPUs; a GPU trial with none free raises ``Waiting`` (which tells users
        why) instead of returning None, and is placed once a trial's GPU is free again."""
        adapter = await platform.adapter()
        gpu = {"trial_gpu_number": 1}
        running = [
            await adapter.launch(platform.request(duration=60).model_copy(update=gpu)) for _ in range(self.capacity)
        ]
        assert all(running)

        with pytest.raises(Waiting, match="GPU"):
            await adapter.launch(platform.request().model_copy(update=gpu))

        await platform.until_started(running[0])  # before that, cancel is a TransientError (retried)
        await adapter.cancel(running[0])
        await platform.outcome(running[0], timeout=self.cancel_within)
        assert await adapter.launch(platform.request().model_copy(update=gpu)) is not None


def fake_nvidia_smi(folder: Path, count: int) -> Path:
    """An ``nvidia-smi`` the machine's user can run, showing ``count`` idle fake GPUs."""
    folder.mkdir(mode=0o755)
    shutil.copy(FAKE_NVIDIA_SMI, folder / "fake_nvidia_smi.py")
    gpu = {"name": "Fake GPU", "memoryTotalMib": 16384, "memoryUsedMib": 0, "gpuUtil": 0, "memoryUtil": 0}
    set_fake_gpus(folder / "state.json", [gpu] * count)
    (folder / "state.json").chmod(0o644)
    script = folder / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\nFAKE_NVIDIA_SMI_STATE={folder}/state.json exec python3 {folder}/fake_nvidia_smi.py "$@"\n'
    )
    script.chmod(0o755)
    return script


def kill_processes_under(folder: Path) -> None:
    """SIGKILL every process whose working directory is in ``folder`` (this test's trials and keepers)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
