"""The words every analyzer speaks: results, the catalogue, thresholds."""
