"""The openpai adapter: each trial an OpenPAI job (NNI's ``platform: openpai``)."""

from services.adapters.openpai.adapter import OpenpaiAdapter
from services.adapters.openpai.settings import OpenpaiSettings

__all__ = ["OpenpaiAdapter", "OpenpaiSettings"]
