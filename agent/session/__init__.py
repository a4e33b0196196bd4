"""A profiling session: probes, the sampling loop, launch, attach, budget, end, trials."""
