"""The adapter contract, run against the in-memory reference adapter."""

from __future__ import annotations

from pathlib import Path

from services.adapters.fake import FakeAdapter, FakePlatform
from tests.contract.adapter_contract import AdapterContract


class TestFakeAdapter(AdapterContract):
    capacity = 2

    def make_adapter(self, workspace: Path) -> FakeAdapter:
        # The fake platform outlives its adapters, as a real cluster would: one per workspace.
        platforms: dict[Path, FakePlatform] = self.__dict__.setdefault("platforms", {})
        return FakeAdapter(platforms.setdefault(workspace, FakePlatform(capacity=self.capacity)))

    def starts(self, workspace: Path, trial_id: str) -> int:
        return sum(p.starts.get(trial_id, 0) for p in self.__dict__.get("platforms", {}).values())
