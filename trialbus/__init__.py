"""Trialbus: run hyperparameter-tuning trials on real compute, streamed over NATS JetStream.

What tuners import: :class:`trialbus.client.AsyncClient` and :class:`trialbus.client.Client`.
"""

__version__ = "0.1.0"
