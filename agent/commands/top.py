"""`gpudiag top`: GPUs, host and processes at a glance; `a` attaches to one."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.commands.options import FromArgs, positive


@dataclass(frozen=True)
class TopOptions(FromArgs):
    """`gpudiag top`'s options."""

    duration: float | None = None  # after attaching with `a`


def main(args: TopOptions) -> int:
    """`gpudiag top`: the box view; `a` on a Python process switches to its live diagnosis."""
    from gpudiag.probes.box import BoxSampler
    from gpudiag.tui.top import TopApp

    sampler = BoxSampler()
    try:
        chosen = TopApp(sampler.snapshot).run()
    finally:
        sampler.close()
    if not chosen:
        return 0
    pid, hooks = chosen
    from gpudiag.agent.commands.attach import attach, parse_pid
    from gpudiag.agent.session.session import SessionOptions
    from gpudiag.agent.session.wiring import Outputs

    opts = SessionOptions(duration_s=args.duration, attached=True, load_hooks=hooks)
    return attach(parse_pid(str(pid)), load_settings(None), opts, Outputs(tui=True))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `top` subcommand."""
    p = sub.add_parser(
        "top",
        help="the box at a glance: GPUs, host, processes to attach to",
        description="Live GPU and host panels and a table of GPU and Python "
        "processes; select one and press `a` to diagnose it.",
    )
    p.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="after attaching with `a`, profile this long",
    )
