"""The stack probe: py-spy run, parsed, rated and dumped."""
