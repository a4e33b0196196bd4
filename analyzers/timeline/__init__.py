"""The timeline data model: bounded rollups of every series, its codec, the run over time."""
