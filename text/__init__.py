"""The report documents' words: number formatting, redaction and the fix trials' lines.

Pure functions over report documents (dicts); shared by the agent's summaries and the TUI,
so the TUI depends on these and its feed interface only, never on the agent.
"""
