"""The in-memory reference adapter: the worked example of :class:`PlatformAdapter`."""

from services.adapters.fake.adapter import FakeAdapter, FakePlatform

__all__ = ["FakeAdapter", "FakePlatform"]
