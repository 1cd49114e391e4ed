"""The adapter contract against the local-gpu adapter: real keeper processes on this host,
plus what only this platform promises (process groups, code snapshots, GPU visibility)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import signal
import tarfile
import time
from pathlib import Path

import pytest

from contracts import TrialStatus
from services.adapters.errors import PermanentError, TransientError
from services.adapters.local_gpu import LocalGpuAdapter, LocalGpuSettings
from services.adapters.local_gpu import client as local_client
from services.adapters.local_gpu.adapter import outcome_of
from tests.contract.adapter_contract import NO_GATEWAY, AdapterContract
from tests.contract.harness import Harness


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in the group; init may reap orphans late."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


async def keeper_state(handle) -> dict:
    """The keeper's ``state.json`` once it holds the pids: the keeper starts the trial, then writes them,
    so a trial seen started may not have its state yet."""
    deadline = time.monotonic() + 10
    while not {"keeperPid", "pgid"} <= (state := local_client.read_state(handle.ref)).keys():
        assert time.monotonic() < deadline, f"no keeper state in {handle.ref}"
        await asyncio.sleep(0.02)
    return state


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class TestLocalGpuAdapter(AdapterContract):
    capacity = 2

    def make_adapter(self, workspace: Path) -> LocalGpuAdapter:
        settings = LocalGpuSettings(
            work_dir=workspace / "work",
            checkpoint_root=workspace / "checkpoints",
            replica="contract",
            max_trials=self.capacity,
            kill_grace=1,
            nni_shim="never",
            gateway_url=NO_GATEWAY,
        )
        return LocalGpuAdapter(settings)

    # ------------------------------------------------------------------ local-gpu only

    async def test_cancel_leaves_no_process_of_the_trials_group(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        request = platform.request(duration=60)
        request = request.model_copy(update={"trial_command": f"sleep 60 & sleep 60 & {request.trial_command}"})
        handle = await adapter.launch(request)
        await platform.until_started(handle)
        pgid = (await keeper_state(handle))["pgid"]

        await adapter.cancel(handle)
        outcome = await platform.outcome(handle, timeout=2)

        assert outcome.exit_code == -signal.SIGTERM
        assert not group_alive(pgid)

    async def test_a_killed_keeper_fails_the_trial_and_takes_its_group_along(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        handle = await adapter.launch(platform.request(duration=60))
        await platform.until_started(handle)
        state = await keeper_state(handle)

        os.kill(state["keeperPid"], signal.SIGKILL)
        outcome = await platform.outcome(handle)

        assert outcome.status is TrialStatus.FAILED
        # A keeper forked by the zygote is not the adapter's child, so its signal is unknown.
        assert "trial keeper exited unexpectedly" in outcome.message
        await asyncio.sleep(0.05)
        assert not group_alive(state["pgid"])

    async def test_a_launch_the_adapter_died_in_runs_once_when_its_request_comes_again(
        self, platform: Harness, workspace: Path
    ) -> None:
        # Given the directory an adapter made for a trial before it was SIGKILLed, ahead of the
        # keeper's start (so it never acked the request), 20 s ago
        request = platform.request()
        trial_dir = workspace / "work" / "trials" / request.experiment_id / f"{request.trial_id}-0"
        (trial_dir / ".trialbus").mkdir(parents=True)
        os.utime(trial_dir, (os.path.getmtime(trial_dir) - 20,) * 2)

        # When the restarted adapter starts, it does not take it for a trial of its own
        adapter = await platform.adapter()
        assert await adapter.adopt() == []

        # And when the request comes again, the trial runs, once, to its end
        handle = await adapter.launch(request)
        outcome = await platform.outcome(handle)
        assert outcome.status is TrialStatus.SUCCEEDED, outcome
        assert platform.starts(request) == 1

    async def test_a_launch_whose_keeper_may_still_be_starting_is_retried_not_doubled(
        self, platform: Harness, workspace: Path
    ) -> None:
        request = platform.request()
        trial_dir = workspace / "work" / "trials" / request.experiment_id / f"{request.trial_id}-0"
        (trial_dir / ".trialbus").mkdir(parents=True)  # made a moment ago: a keeper may be on its way
        adapter = await platform.adapter()
        with pytest.raises(TransientError, match="may still be starting its keeper") as raised:
            await adapter.launch(request)
        assert 0 < raised.value.delay <= 10
        assert trial_dir.exists() and platform.starts(request) == 0

    async def test_trials_run_in_their_code_snapshot(self, platform: Harness, workspace: Path) -> None:
        archive = tar_gz({"data.txt": b"from the snapshot\n", "pkg/inner.txt": b"inner\n"})
        digest = hashlib.sha256(archive).hexdigest()
        await (await platform.bus.code_store()).put(digest, archive)
        adapter = await platform.adapter()
        requests = [platform.request() for _ in range(2)]
        requests = [
            r.model_copy(update={"code_ref": f"sha256:{digest}", "trial_command": "cat data.txt pkg/inner.txt"})
            for r in requests
        ]

        handles = await asyncio.gather(*(adapter.launch(r) for r in requests))
        outcomes = [await platform.outcome(h) for h in handles]

        assert [o.status for o in outcomes] == [TrialStatus.SUCCEEDED] * 2
        assert (Path(handles[0].ref) / "stdout").read_text() == "from the snapshot\ninner\n"
        assert os.listdir(workspace / "work" / "code") == [digest]  # one download, no leftovers

    async def test_an_unsafe_snapshot_fails_the_trial_for_good(self, platform: Harness) -> None:
        archive = tar_gz({"../escape.txt": b"no\n"})
        digest = hashlib.sha256(archive).hexdigest()
        await (await platform.bus.code_store()).put(digest, archive)
        adapter = await platform.adapter()
        request = platform.request().model_copy(update={"code_ref": f"sha256:{digest}"})

        with pytest.raises(PermanentError, match="outside the code directory"):
            await adapter.launch(request)
        with pytest.raises(PermanentError, match="not in the object store"):
            await adapter.launch(request.model_copy(update={"code_ref": "sha256:" + "0" * 64}))

    @pytest.mark.parametrize(("gpus", "seen"), [(None, "unset"), (0, "")])
    async def test_gpu_visibility_follows_trial_gpu_number(self, platform: Harness, gpus, seen) -> None:
        adapter = await platform.adapter()
        request = platform.request().model_copy(
            update={"trial_gpu_number": gpus, "trial_command": 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"'}
        )

        handle = await adapter.launch(request)
        await platform.outcome(handle)

        assert (Path(handle.ref) / "stdout").read_text() == f"[{seen}]\n"

    async def test_the_log_tail_shows_stdout_and_stderr(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        request = platform.request().model_copy(update={"trial_command": "echo to-out; echo to-err >&2"})
        handle = await adapter.launch(request)
        await platform.outcome(handle)

        text = await adapter.log_tail(handle, 4096)

        assert "==> stdout <==\nto-out" in text and "==> stderr <==\nto-err" in text
        assert "secret" not in text

    async def test_the_trial_sees_nni_variables_and_not_the_adapters(self, platform: Harness, monkeypatch) -> None:
        monkeypatch.setenv("TRIALBUS_NATS_PASSWORD", "hunter2")
        adapter = await platform.adapter()
        request = platform.request().model_copy(update={"trial_command": "env; cat parameter.cfg"})
        handle = await adapter.launch(request)
        await platform.outcome(handle)

        out = (Path(handle.ref) / "stdout").read_text()

        assert f"NNI_TRIAL_JOB_ID={request.trial_id}" in out and "NNI_PLATFORM=local" in out
        assert "hunter2" not in out and "not-a-secret" not in out
        # of the keeper's settings, only those meant for the trial (docs/retries.md, docs/optuna.md):
        # its ask token, never the token its keeper reports with
        ours = sorted(line.split("=", 1)[0] for line in out.splitlines() if line.startswith("TRIALBUS_"))
        assert ours == [
            "TRIALBUS_ASK_OWNER",
            "TRIALBUS_ASK_TOKEN",
            "TRIALBUS_ATTEMPT",
            "TRIALBUS_CHECKPOINT_DIR",
            "TRIALBUS_GATEWAY_URL",
        ]
        assert request.token.get_secret_value() not in out
        checkpoints = f"{adapter.settings.checkpoint_root}/{request.experiment_id}/{request.trial_id}"
        assert f"TRIALBUS_CHECKPOINT_DIR={checkpoints}\n" in out
        assert out.endswith(request.parameter_record)

    async def test_a_keeper_that_cannot_start_is_a_permanent_failure(self, workspace: Path, bus) -> None:
        settings = LocalGpuSettings(
            work_dir=workspace / "work", replica="x", nni_shim="never", keeper_python=str(workspace / "no-python")
        )
        adapter = LocalGpuAdapter(settings)
        await adapter.start(bus)
        request = self.request(workspace)

        with pytest.raises(PermanentError, match="cannot start the trial keeper"):
            await adapter.launch(request)
        assert await adapter.adopt() == []  # nothing half-launched is left to adopt
        await adapter.stop()

    async def test_keepers_are_forked_from_the_zygote_not_started_as_interpreters(self, platform: Harness) -> None:
        # An interpreter start costs ~13 ms of CPU per trial; a fork of the zygote ~1 ms
        # (the figures are `make bench`'s to report; here: that the fork is what happens).
        adapter = await platform.adapter()
        handles = [await adapter.launch(platform.request(duration=30)) for _ in range(self.capacity)]
        for handle in handles:
            await platform.until_started(handle)
        zygote = adapter.keepers.zygote.pid

        parents = [parent_pid((await keeper_state(h))["keeperPid"]) for h in handles]

        for handle in handles:
            await adapter.cancel(handle)
            await platform.outcome(handle)
        assert parents == [zygote] * self.capacity


def parent_pid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


@pytest.mark.parametrize(
    ("state", "keeper_status", "status", "exit_code", "message"),
    [
        ({"done": True, "exitCode": 0}, 0, TrialStatus.SUCCEEDED, 0, None),
        ({"done": True, "exitCode": 3}, 3, TrialStatus.FAILED, 3, "trial command exited with code 3"),
        ({"done": True, "exitCode": -9}, 137, TrialStatus.FAILED, -9, "trial command killed by signal 9"),
        (
            {"done": True, "exitCode": 0, "error": "metrics gateway answered 401: bad token"},
            0,
            TrialStatus.FAILED,
            0,
            "metrics gateway answered 401: bad token",
        ),
        ({"exitCode": 0}, -9, TrialStatus.SUCCEEDED, 0, "metrics may be incomplete"),
        ({"exitCode": 2}, None, TrialStatus.FAILED, 2, "exited with code 2; the trial keeper was killed"),
        (
            {"keeperPid": 7, "pgid": 8},
            -9,
            TrialStatus.FAILED,
            None,
            "trial keeper exited unexpectedly (killed by signal 9)",
        ),
        (
            {},
            2,
            TrialStatus.FAILED,
            None,
            "trial keeper exited unexpectedly (exit status 2): trial_keeper: bad configuration",
        ),
        ({}, None, TrialStatus.FAILED, None, "trial keeper exited unexpectedly (no exit status recorded)"),
        ({"done": True, "canceled": True}, 1, TrialStatus.FAILED, None, "stopped before the trial command started"),
    ],
)
def test_how_a_keepers_state_becomes_an_outcome(state, keeper_status, status, exit_code, message) -> None:
    outcome = outcome_of(state, keeper_status, "Traceback…\ntrial_keeper: bad configuration\n")

    assert (outcome.status, outcome.exit_code) == (status, exit_code)
    assert (outcome.message is None) if message is None else (message in outcome.message)
