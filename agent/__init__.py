"""The agent: command line, sessions, reports."""
