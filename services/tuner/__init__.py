"""The tuner service: NNI tuners and assessors drive experiments as clients of the bus (:mod:`.service`)."""
