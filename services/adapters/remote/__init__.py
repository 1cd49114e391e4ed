"""The remote adapter: trials on a pool of SSH machines (NNI's ``platform: remote``)."""

from services.adapters.remote.adapter import RemoteAdapter
from services.adapters.remote.settings import RemoteSettings

__all__ = ["RemoteAdapter", "RemoteSettings"]
