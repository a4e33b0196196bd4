"""Statistics of commands that compare runs: the CI gate's decisions, try's verdict."""
