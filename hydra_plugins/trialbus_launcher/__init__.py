"""Hydra's ``hydra/launcher=trialbus``: each job of a multirun sweep runs as one Trialbus trial (docs/hydra.md).

Hydra finds this package in its ``hydra_plugins`` namespace and imports every module of it at each start, so
nothing here imports Trialbus's client (NATS, pydantic) before a sweep is launched.
"""
