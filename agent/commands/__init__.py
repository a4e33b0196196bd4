"""One module per command: its work, with typed options; the Namespace ends at its edge."""
