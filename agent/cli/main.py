"""The `gpudiag` command line."""

from __future__ import annotations

import argparse
import os
import sys

from gpudiag.agent.cli.config import load_settings
from gpudiag.agent.cli.errors import UsageError
from gpudiag.agent.cli.parser import build_parser, parse_args
from gpudiag.agent.commands.attach import attach_job
from gpudiag.agent.commands.replay import replay_report
from gpudiag.agent.commands.run import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, run_job
from gpudiag.agent.output.render.text import render_markdown, render_text
from gpudiag.agent.output.report import (
    check_outputs,
    check_writable,
    load_report,
    schema_text,
    validate,
    write_report,
)
from gpudiag.agent.output.safeio import dumps_json, file_mode
from gpudiag.agent.session.targetwatch import running
from gpudiag.agent.session.wiring import print_summary
from gpudiag.analyzers.engine.thresholds import Thresholds
from gpudiag.text.sink import emit, outbound, say

__all__ = ["build_parser", "main"]


# ---- commands ---------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    """Launch the job, profile it, write the report; pass the job's exit code through."""
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("run needs a command after --, e.g. gpudiag run -- python train.py")
    settings = load_settings(args.config, args.overrides, price=args.price, prices_file=args.prices)
    check_outputs(
        {"--out": args.out, "--record": args.record, "--speedscope": args.speedscope}
        | {"--trace": args.trace}
    )
    if not args.try_fixes:
        return run_job(args, command, settings)
    from gpudiag.agent.commands.tryfix import run_then_try

    args.out = args.out or f"gpudiag-try-{os.getpid()}.json"
    return run_then_try(args, command, run_job(args, command, settings))


def parse_pid(text: str) -> int:
    """A pid from the command line, or UsageError."""
    try:
        pid = int(text)
    except ValueError:
        raise UsageError(f"PID must be a number, got {text!r}") from None
    if pid <= 0:
        raise UsageError(f"PID must be positive, got {pid}")
    if not os.path.exists(f"/proc/{pid}"):
        raise UsageError(f"no process with pid {pid}")
    if pid == os.getpid():
        raise UsageError("cannot attach to gpudiag itself")
    if not running(pid):
        raise UsageError(f"pid {pid} has already exited (a zombie its parent has not reaped)")
    return pid


def cmd_attach(args: argparse.Namespace) -> int:
    """Profile a running job; exit 2 when it cannot be read at all."""
    pid = parse_pid(args.pid)
    settings = load_settings(args.config, args.overrides, price=args.price, prices_file=args.prices)
    check_outputs(
        {"--out": args.out, "--record": args.record, "--speedscope": args.speedscope}
        | {"--trace": args.trace}
    )
    return attach_job(args, pid, settings)


def cmd_report(args: argparse.Namespace) -> int:
    """Render a saved report."""
    doc = load_report(args.file)
    if args.out:
        check_writable(args.out)
    if args.tui:
        return _browse(doc, f"report {args.file}")
    if args.format == "html":
        from gpudiag.agent.output.render.html import render_html

        text = render_html(doc)
    elif args.format == "json":
        text = dumps_json(doc, indent=2) + "\n"
    elif args.format == "markdown":
        text = render_markdown(doc)
    else:
        text = render_text(doc) + "\n"
    text = outbound(text, redact=args.format != "json")  # a file someone will `cat`, too
    if args.out:
        from gpudiag.agent.output.exports import write_text

        where = write_text(text, args.out, what=f"{args.format} report")
        emit(f"{args.format} written to {where}", file=sys.stderr)
    else:
        emit(text, end="", redact=args.format != "json")
    _exports(doc, args)
    return EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    """One job report from per-host reports; printed, and written with --out."""
    from gpudiag.agent.commands.merge import merge_reports

    settings = load_settings(args.config, args.overrides)
    if args.out:
        check_writable(args.out)
    doc = merge_reports(list(args.reports), settings.thresholds)
    print_summary(doc, args.format)
    if args.out:
        path = write_report(doc, args.out)
        note = sys.stdout if args.format == "text" else sys.stderr
        emit(f"Job report written to {path}", file=note)
    else:
        validate(doc)
    return EXIT_OK


def _exports(doc: dict, args: argparse.Namespace) -> None:
    """Write --speedscope / --trace when asked; say where on stderr."""
    if getattr(args, "speedscope", None) or getattr(args, "trace", None):
        from gpudiag.agent.output.exports import write_exports

        for path in (args.speedscope, args.trace):
            if path:
                check_writable(path)
        for line in write_exports(doc, args.speedscope, args.trace):
            emit(line, file=sys.stderr)


def cmd_replay(args: argparse.Namespace) -> int:
    """Analyse a recording and print (and optionally write) the report."""
    settings = load_settings(args.config, args.overrides, price=args.price, prices_file=args.prices)
    check_outputs({"--out": args.out, "--speedscope": args.speedscope, "--trace": args.trace})
    doc = replay_report(args.file, settings)  # validated there
    if args.tui:
        return _browse(doc, f"replay {args.file}")
    print_summary(doc, args.format)
    if args.out:
        path = write_report(doc, args.out)  # WriteError names the file; the summary stands
        emit(
            f"Report written to {path}",
            file=sys.stdout if args.format == "text" else sys.stderr,
        )
    _exports(doc, args)
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    """Compare runs (or saved reports) with a baseline; exit 0/1/3 (2 on errors)."""
    from gpudiag.agent.commands.gate import gate_command

    return gate_command(args)


def cmd_top(args: argparse.Namespace) -> int:
    """Box view; `a` on a Python process switches to its live diagnosis."""
    from gpudiag.probes.host.box import BoxSampler
    from gpudiag.tui.top import TopApp

    sampler = BoxSampler()
    try:
        pid = TopApp(sampler.snapshot).run()
    finally:
        sampler.close()
    if not pid:
        return EXIT_OK
    from gpudiag.agent.commands.attach import attach
    from gpudiag.agent.session.session import SessionOptions
    from gpudiag.agent.session.wiring import Outputs

    opts = SessionOptions(duration_s=args.duration, attached=True)
    return attach(parse_pid(str(pid)), load_settings(None), opts, Outputs(tui=True))


def _browse(doc: dict, title: str) -> int:
    from gpudiag.tui.app import DiagnosisApp
    from gpudiag.tui.feeds import static_feed

    DiagnosisApp(static_feed(doc, title)).run()
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    """Profile every job on the box and serve the findings until Ctrl-C/SIGTERM/--duration."""
    from gpudiag.agent.commands.watch import watch_command

    settings = load_settings(args.config, args.overrides, price=args.price, prices_file=args.prices)
    return watch_command(args, settings)


def cmd_thresholds(args: argparse.Namespace) -> int:
    """Print each threshold, its default, unit and range, and its meaning."""
    from gpudiag.analyzers.engine.thresholds import RANGES

    defaults = Thresholds().to_dict()
    for name, doc in Thresholds.names().items():
        unit = Thresholds.unit(name)
        emit(f"{name} = {defaults[name]}  ({RANGES[unit]})\n    {doc}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpudiag` console script."""
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        file_mode()  # a bad GPUDIAG_FILE_MODE is refused before profiling, not at the end
        if args.command == "schema":
            emit(schema_text(), end="", redact=False)
            return EXIT_OK
        if args.command == "try":
            from gpudiag.agent.commands.tryfix import cmd_try

            return cmd_try(args)
        if args.command == "demo":
            from gpudiag.agent.commands.demo import cmd_demo

            return cmd_demo(args)
        handler = {
            "run": cmd_run,
            "attach": cmd_attach,
            "report": cmd_report,
            "replay": cmd_replay,
            "merge": cmd_merge,
            "thresholds": cmd_thresholds,
            "top": cmd_top,
            "gate": cmd_gate,
            "watch": cmd_watch,
        }[args.command]
        return handler(args)
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
