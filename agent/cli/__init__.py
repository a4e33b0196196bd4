"""The command line: one parse edge (the parser, its option types), settings, usage errors."""
