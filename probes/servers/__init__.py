"""Probes of the servers a job runs its model in (their own metrics)."""
