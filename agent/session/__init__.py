"""A profiling session: its probes, the sampling loop, launch and attach, the budget, the end."""
