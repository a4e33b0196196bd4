"""Probes: sample the world (procfs, PSI, py-spy stacks) without judging it."""
