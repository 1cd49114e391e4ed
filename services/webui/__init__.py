"""The web UI: experiments, trials, curves and platforms in a browser, live from the bus.

A pure client of the bus, like any tuner: it watches the ``experiments`` and ``trials``
KV buckets into an in-memory :class:`~services.webui.model.Model`, reads trial curves
from the METRICS stream, platform status from the ``platforms`` bucket, and sends the
user's actions (cancel or retry a trial, stop an experiment, read a log) to the dispatcher over
``trialbus.api.*`` request/reply. Browsers get the page once and every change after it as
server-sent events, coalesced per experiment (:mod:`services.webui.hub`).
"""
