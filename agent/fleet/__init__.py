"""Fleet outputs: Prometheus metrics, the /metrics endpoint, the job's cluster identity."""
