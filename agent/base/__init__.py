"""The agent's ground floor: usage errors and exit codes, settings, safe file I/O."""
