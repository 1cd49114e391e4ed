"""Platform adapters: the plug-in point (:mod:`.base`), the service every adapter runs under
(:mod:`.service`, a facade over its parts: :mod:`.intake` takes work in, :mod:`.trials` watches
and reports it), and one package per platform with the same files (``adapter.py``,
``client.py``, ``settings.py``, ``__main__.py``). ``fake`` is the in-memory reference adapter."""

from services.adapters.base import AdapterSettings, PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.adapters.service import AdapterService

__all__ = [
    "AdapterService",
    "AdapterSettings",
    "PermanentError",
    "PlatformAdapter",
    "TransientError",
    "TrialHandle",
    "TrialOutcome",
]
