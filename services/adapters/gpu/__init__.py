"""GPU placement shared by the adapters that hand out GPUs by index (local-gpu, remote):
the inventory of a host (:mod:`.inventory`), NNI's placement rules as pure functions
(:mod:`.placement`) and the per-host bookkeeping (:mod:`.scheduler`)."""
