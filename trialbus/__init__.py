"""Trialbus: run hyperparameter-tuning trials on real compute, streamed over NATS JetStream.

What tuners import: :class:`trialbus.client.AsyncClient` and :class:`trialbus.client.Client`; what people who
drive NNI from Python import: :class:`trialbus.Experiment` (NNI's ``nni.experiment.Experiment``).
"""

import sys
from typing import Any

__all__ = ["AsyncClient", "Client", "Experiment", "__version__"]


class _NatsWithoutWebSockets:
    """An import finder that answers nats-py's optional ``import aiohttp`` with ImportError, and no other import.

    nats-py imports aiohttp when it is installed (the Kubernetes client brings it), for a WebSocket transport
    (``ws://``) that Trialbus never uses: ~170 ms of every command's start on a small host, for nothing. Only the
    import made while ``nats.aio.transport`` runs is refused, so nats-py sets its transport aside as it does where
    aiohttp is not installed; any other import of aiohttp, before or after, is as usual. A ``ws://`` URL is
    refused by the client with a message (:meth:`trialbus.client.AsyncClient.connect`).
    """

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "aiohttp":
            transport = sys.modules.get("nats.aio.transport")
            if transport is not None and getattr(transport.__spec__, "_initializing", False):
                raise ModuleNotFoundError("aiohttp is not used for NATS by Trialbus", name=name)
        return None


if "nats.aio.transport" not in sys.modules:
    sys.meta_path.insert(0, _NatsWithoutWebSockets())


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
