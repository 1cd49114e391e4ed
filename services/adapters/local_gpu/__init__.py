"""The local-gpu adapter: trials as process groups on the adapter's own host."""

from services.adapters.local_gpu.adapter import LocalGpuAdapter
from services.adapters.local_gpu.settings import LocalGpuSettings

__all__ = ["LocalGpuAdapter", "LocalGpuSettings"]
