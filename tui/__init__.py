"""The terminal UI (Textual). Reads only gpudiag's own types."""
