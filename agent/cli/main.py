"""The `gpudiag` command line: one parse edge, then the command's own `main` (agent/cli/
commands.py lists them); every error of input is one line and exit 2."""

from __future__ import annotations

import os
import sys

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import file_mode
from gpudiag.agent.cli.commands import BY_NAME
from gpudiag.agent.cli.parser import build_parser, parse_args
from gpudiag.agent.commands.run import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from gpudiag.text.sink import say

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpudiag` console script."""
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        file_mode()  # a bad GPUDIAG_FILE_MODE is refused before profiling, not at the end
        return BY_NAME[args.command](args)  # its options typed, then its work
    except UsageError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # a bug of gpudiag's: one line, exit 2 (GPUDIAG_DEBUG=1: traceback)
        if os.environ.get("GPUDIAG_DEBUG"):
            raise
        say(
            f"internal error: {type(exc).__name__}: {str(exc)[:300]} "
            "(please report it; GPUDIAG_DEBUG=1 shows the traceback)"
        )
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
