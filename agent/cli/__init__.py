"""The command line roof: `main(argv) -> int`, the parser and the command registry."""
