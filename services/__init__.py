"""Trialbus services: one package per service, each started with ``python -m services.<name>``."""
