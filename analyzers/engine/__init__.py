"""The analysis engine: the context every finder reads, the registry, finishing, the catalogue."""
