"""The analysis roof: `analyze()` with the registry of finders and finishing."""
