"""The dispatcher: REST and NATS API, and the trial state machine.

It is the only writer of the ``experiments`` and ``trials`` KV buckets. It holds every
experiment to ``trialConcurrency`` dispatched trials, publishes requests on
``dispatch.<adapter>``, and derives trial state from the EVENTS and METRICS streams.
"""
