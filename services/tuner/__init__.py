"""The tuner service: NNI tuners and assessors over the bus (for now, the search space library :mod:`.space`)."""
