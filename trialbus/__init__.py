"""Trialbus: run hyperparameter-tuning trials on real compute, streamed over NATS JetStream.

What tuners import: :class:`trialbus.client.AsyncClient` and :class:`trialbus.client.Client`; what people who
drive NNI from Python import: :class:`trialbus.Experiment` (NNI's ``nni.experiment.Experiment``).
"""

from typing import Any

__all__ = ["AsyncClient", "Client", "Experiment", "__version__"]


def __getattr__(name: str) -> Any:  # imported on first use: the CLI starts without Optuna, pydantic or NATS
    if name == "__version__":
        from contracts import VERSION

        return VERSION
    if name == "Experiment":
        from trialbus.experiment import Experiment

        return Experiment
    if name in ("AsyncClient", "Client"):
        from trialbus import client

        return getattr(client, name)
    raise AttributeError(f"module 'trialbus' has no attribute {name!r}")
