"""Trialbus: run hyperparameter-tuning trials on real compute, streamed over NATS JetStream.

What tuners import: :class:`trialbus.client.AsyncClient` and :class:`trialbus.client.Client`.
"""

from contracts import VERSION as __version__

__all__ = ["__version__"]
