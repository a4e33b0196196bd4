"""`gpudiag try`: its arguments, and the command (fixes from --fix or a report's findings)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.options import FromArgs
from gpudiag.text.sink import emit

if TYPE_CHECKING:
    from gpudiag.agent.commands.run import RunOptions
    from gpudiag.agent.session.trial import TrialPlan

USAGE = "gpudiag try [--fix KIND:NAME=VALUE,... | --from REPORT] [options] -- CMD [ARGS...]"


def add_parser(sub: Any) -> None:
    """The `try` subcommand and its options."""
    p = sub.add_parser(
        "try",
        help="apply a finding's fix without a code change and measure the speed-up",
        description="Run CMD as it is and with a fix applied in-process, interleaved "
        "(A B B A ...), each arm a warm-up then --seconds of measured steps, --rounds times; "
        "print the measured speed-up with its 95%% interval against the prediction and the "
        "code change to make. Without --fix or --from it diagnoses the job first (as `run "
        "--until-sure` does, at most --diagnose-seconds of loop) and tries the fixes its "
        "findings carry. Progress goes to stderr.",
        usage=USAGE,
    )
    p.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KIND:KEY=VALUE,...",
        help="a fix to try, e.g. dataloader:num_workers=2,persistent_workers=true "
        "(kinds: dataloader, optimizer, cudnn_benchmark, tf32, compile, checkpoint, "
        "inference_mode, batch, anomaly_off, padding, load_once, recompute_off); any call "
        "site: "
        "thin:MODULE.FUNCTION:every=N (run it every N-th call), skip:MODULE.FUNCTION, "
        "cache:MODULE.FUNCTION (its result kept for arguments seen before; the hit rate said), "
        "swap:MODULE.FUNCTION:with=OTHER.FUNCTION (a rewrite of yours run in its place, "
        "checked equal on its first calls) "
        "(MODULE: a module or the script's stem, e.g. thin:train.compute_metrics:every=50); any "
        "module of the model by its dotted path: freeze:UNIT (requires_grad_(False) on it), "
        "reuse:UNIT (its last output for the same unchanged input), "
        "select:UNIT:dim=D,start=S,length=L (only the outputs the loss reads: L positions from S "
        "along its output's dim D, checked as it runs), "
        "batched:UNIT (its calls on slices of one batch, a loop over samples, computed once on "
        "the batch, checked as it runs)",
    )
    p.add_argument(
        "--from",
        dest="from_report",
        metavar="REPORT",
        help="try the fixes carried by this report's findings (top first)",
    )
    p.add_argument("--finding", metavar="ID", help="with --from: only this finding's fix")
    p.add_argument(
        "--diagnose-seconds",
        type=_secs,
        default=60.0,
        help="without --fix or --from: the diagnosis' longest look at the loop (default 60; "
        "it stops earlier once the verdict is sure)",
    )
    p.add_argument("--rounds", type=_count, default=3, help="interleaved rounds (default 3)")
    p.add_argument(
        "--seconds", type=_secs, default=10.0, help="measured seconds per arm (default 10)"
    )
    p.add_argument(
        "--warmup", type=_secs, default=5.0, help="seconds after the first step (default 5)"
    )
    p.add_argument(
        "--allow-numerics", action="store_true", help="allow fixes that change numerics (tf32)"
    )
    p.add_argument("--allow-compile", action="store_true", help="allow torch.compile of the model")
    p.add_argument("--out", metavar="FILE", help="write the report (with `trials`) here")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(diagnosis=None)  # (run --try hands its report in memory, never a flag)


@dataclass(frozen=True)
class TryOptions(FromArgs):
    """`gpudiag try`'s options (the defaults are the command line's)."""

    cmd: tuple[str, ...] = ()  # as given: a leading `--` is dropped
    fix: tuple[str, ...] = ()  # KIND:KEY=VALUE,... each
    from_report: str | None = None
    finding: str | None = None
    diagnose_seconds: float = 60.0
    rounds: int = 3
    seconds: float = 10.0
    warmup: float = 5.0
    allow_numerics: bool = False
    allow_compile: bool = False
    out: str | None = None
    diagnosis: dict | None = None  # `run --try`'s report, as computed (not from the command line)


def run_then_try(out: str, command: list[str], rc: int, report: dict | None) -> int:
    """After `run` wrote its report to `out`: try the fixes of its findings (`report`, as run
    computed it: the file is never read back) and add `trials` to it."""
    try:
        main(TryOptions(cmd=tuple(command), out=out, diagnosis=_plain(report or {})))
    except UsageError as exc:  # nothing to try is a result of the diagnosis, not an error
        emit(f"gpudiag: nothing tried: {exc}", file=sys.stderr)
    return rc


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 1 <= value <= 50:
        raise argparse.ArgumentTypeError(f"must be from 1 to 50, got {value}")
    return value


def _secs(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 3600, got {value}")
    return value


def parse_fix(text: str) -> dict:
    """KIND[:KEY=VALUE,...] into {"kind", "values"}; values parsed as JSON when they can be.
    A kind that names a call site takes it first: thin:MODULE.FUNCTION:every=N,
    skip:MODULE.FUNCTION ({"kind", "target", "values"})."""
    from gpudiag.agent.session.trial import TARGETED

    kind, _, rest = text.partition(":")
    target = None
    if kind.strip() in TARGETED:
        target, _, rest = rest.partition(":")
        if not target.strip():
            raise UsageError(
                f"--fix {text!r}: {kind.strip()} needs the function: "
                f"{kind.strip()}:MODULE.FUNCTION{':every=N' if kind.strip() == 'thin' else ''}"
            )
    values: dict = {}
    for part in filter(None, rest.split(",")):
        key, eq, raw = part.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--fix {text!r}: expected name=value, got {part!r}")
        try:
            values[key.strip()] = json.loads(
                raw.strip().lower() if raw.strip().lower() in ("true", "false") else raw.strip()
            )
        except ValueError:  # not JSON, or a number of more digits than Python converts
            values[key.strip()] = raw.strip()
    if target is not None:
        return {"kind": kind.strip(), "target": target.strip(), "values": values}
    return {"kind": kind.strip(), "values": values}


def main(args: TryOptions) -> int:
    """`gpudiag try`: try each fix; print the results and the code changes; write --out."""
    import time

    from gpudiag.agent.output.report import check_writable
    from gpudiag.agent.session.trial import TrialPlan, check_fix, try_fix
    from gpudiag.analyzers.model.thresholds import Thresholds

    since = time.time()  # the job's files older than this are its outputs: never written over
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError(f"try needs a command after --: {USAGE}")
    if args.out:
        check_writable(args.out)
    plans: list[TrialPlan] = []
    for text in args.fix:
        plans.append(TrialPlan(command, parse_fix(text)))
    found = _diagnosis(command, args)
    if found is not None:
        plans += _plans_of_report(found, command, args.finding)
    doc = found or {}
    if not plans:
        top = (doc.get("verdict") or {}).get("statement") or "no finding"
        raise UsageError(f"no finding in the report carries a fix that can be tried ({top})")
    for plan in plans:
        why = check_fix(plan.fix, args.allow_numerics, args.allow_compile)
        if why:
            raise UsageError(why)
        plan.rounds, plan.seconds, plan.warmup = args.rounds, args.seconds, args.warmup
        plan.since = since
    trials = [try_fix(plan, Thresholds()) for plan in plans]
    for t in trials:
        _print_trial(t)
    if args.out:
        _write_trials(args.out, doc, trials)
    return 0 if all(t["verdict"] not in ("failed", "refused") for t in trials) else 1


def _print_trial(t: dict) -> None:
    """A trial's line, what it was timed over (an inference job) and the change to make."""
    from gpudiag.text.trials import summary_line

    emit(summary_line(t))
    if t.get("timed_over"):
        emit(f"  timed over {t['timed_over']}")
    emit(f"  change: {t['change']}")


def _plans_of_report(doc: dict, command: list[str], finding: str | None) -> list[TrialPlan]:
    """A trial of each finding's fix in a report (only `finding`'s when given)."""
    from gpudiag.agent.session.trial import TrialPlan, progress

    plans: list[TrialPlan] = []
    for f in doc.get("findings") or []:
        if finding and f.get("id") != finding:
            continue
        if not f.get("fix"):
            progress(
                f"{f.get('id')}: no fix applicable from outside; change the code: "
                f"{'; '.join(f.get('recommendation', {}).get('actions', [])[:1])}"
            )
            continue
        unsure = f["fix"].get("candidate")
        if unsure:
            progress(f"{f.get('id')}: trying a candidate fix the model is unsure of: {unsure}")
        plans.append(
            TrialPlan(
                command,
                f["fix"],
                finding=f.get("id"),
                predicted=None if unsure else f.get("expected_speedup"),
                location=f.get("location"),
                # a bound is the most the fix gives: anything from none to it holds
                predicted_low=1.0 if f.get("speedup_kind") == "bound" else f.get("speedup_low"),
                floor=f.get("speedup_kind") == "floor",
            )
        )
    return plans


def _write_trials(out: str, doc: dict, trials: list[dict]) -> None:
    """--out: the report with its trials, or the trials alone when no report was read."""
    from gpudiag.agent.output.report import write_report

    if doc:
        doc["trials"] = trials
        measured_into(doc.get("findings") or [], trials)
        doc["verdict"] = verdict_measured(doc.get("verdict") or {}, trials)
        write_report(doc, out)
    else:
        from gpudiag.agent.base.safeio import dumps_json
        from gpudiag.agent.output.exports import write_text

        write_text(dumps_json({"trials": trials}, indent=2) + "\n", out, "try results")


def measured_into(findings: list[dict], trials: list[dict]) -> None:
    """A hypothesis (or a floor) `try` measured carries the measurement (`measured_speedup`,
    shown instead of 'unverified'); a trial that failed or measured nothing leaves it as it
    was."""
    for f in findings:
        if f.get("speedup_kind") not in ("hypothesis", "floor"):
            continue
        done = [
            t
            for t in trials
            if t.get("finding") == f.get("id")
            and t.get("measured") is not None
            and t.get("verdict") != "failed"
        ]
        if done:
            f["measured_speedup"] = done[-1]["measured"]


def verdict_measured(verdict: dict, trials: list[dict]) -> dict:
    """The verdict of a report whose top finding's hypothesis `try` measured: its statement
    says what was measured (it stays as sure as its samples made it)."""
    top = verdict.get("finding")
    done = [t for t in trials if t.get("finding") == top and t.get("measured") is not None]
    if not top or not done or "unverified" not in str(verdict.get("statement")):
        return verdict
    t = done[-1]
    lo, hi = t.get("interval") or (t["measured"], t["measured"])
    said = f"gpudiag try measured x{t['measured']:.2f} [{lo:.2f}, {hi:.2f}] ({t['verdict']})"
    return {**verdict, "statement": f"{verdict['statement']}; {said}"}


def _diagnosis(command: list[str], args: TryOptions) -> dict | None:
    """The report whose fixes are tried: `run --try`'s own, one made now when nothing is
    named (both kept in memory, never read back from a file), or --from's; None: --fix only."""
    from gpudiag.agent.output.report import load_report

    if args.diagnosis is not None:
        return args.diagnosis
    if not args.fix and not args.from_report:
        return diagnose_first(command, args)
    return dict(load_report(args.from_report)) if args.from_report else None


def diagnose_first(command: list[str], args: TryOptions) -> dict:
    """`try` with nothing named: profile the job as `run --until-sure` does, end it, and
    return the report as it was computed (its findings' fixes are then tried). The report
    written to --out is never read back: in a shared folder another user could have swapped
    it."""
    import tempfile

    from gpudiag.agent.commands import run
    from gpudiag.agent.session.trial import progress

    out = args.out or os.path.join(tempfile.mkdtemp(prefix="gpudiag-try-"), "diagnosis.json")
    progress(
        f"no --fix or --from: diagnosing the job first (until the verdict is sure, at most "
        f"{args.diagnose_seconds:.0f} s of its loop)"
    )
    diagnosis = run.RunOptions(  # as `run -q --until-sure --duration S --out F -- CMD` gives
        cmd=("--", *command), quiet=True, until_sure=True, duration=args.diagnose_seconds, out=out
    )
    launched: list[int] = []  # the job's PID, kept here: never read back from a file
    docs: list[dict] = []  # and the report, as computed
    try:
        run.main(diagnosis, on_launch=launched.append, on_report=docs.append)
    finally:
        for pid in launched:
            end_job(pid)
    if not docs:
        raise UsageError("the diagnosis made no report: nothing to try")
    doc = _plain(docs[0])
    progress(f"diagnosis: {(doc.get('verdict') or {}).get('statement') or 'none'}")
    return doc


def _plain(doc: dict) -> dict:
    """A report as computed, in the plain JSON values it was written with."""
    from gpudiag.agent.base.safeio import dumps_json, finite

    return json.loads(dumps_json(finite(doc)))


def end_job(pid: int) -> None:
    """End the job a `run --duration` left running (and its DataLoader workers): the
    process this gpudiag launched, by the PID it kept (a report file names any PID)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.ppid() != os.getpid():
            return  # no longer our child: it exited, and the PID may be someone else's now
        procs = [*proc.children(recursive=True), proc]
        for p in procs:
            p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=10)
        for p in alive:
            p.kill()
    except (OSError, psutil.Error):
        pass


def main_run_try(opts: RunOptions) -> int:
    """`gpudiag run --try`: the diagnosis as `run` makes it, then its findings' fixes tried."""
    from gpudiag.agent.commands import run

    command, settings = run.prepare(opts)
    out = opts.out or f"gpudiag-try-{os.getpid()}.json"
    docs: list[dict] = []  # the report as computed: the file is never read back
    rc = run.run_job(replace(opts, out=out), command, settings, on_report=docs.append)
    return run_then_try(out, command, rc, docs[0] if docs else None)
