"""The frameworkcontroller adapter: each trial a Kubernetes ``Framework`` (NNI's ``platform: frameworkcontroller``)."""

from services.adapters.frameworkcontroller.adapter import FrameworkcontrollerAdapter
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings

__all__ = ["FrameworkcontrollerAdapter", "FrameworkcontrollerSettings"]
