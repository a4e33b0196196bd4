"""`gpudiag try`: run the job as it is (A) and with a fix (B), interleaved A B B A ..., each
arm for a warm-up then `seconds` of measured steps, and judge the speed-up.

The step rate of an arm comes from the in-process hooks' step times (gpudiag_fixes writes
one line per optimizer step). An inference job's (no optimizer step) is items/s of its
model's forwards, each arm timed over the same items: the first measured arm's window, from
its `k`th item to its `k + n`th, is the span every later arm times (a corpus sorted by
length gave a faster arm shorter texts in the same seconds, and a no-op fix read x1.14).
The job is stopped after its measured window; a job that exits non-zero on its own under
the fix is a result ("failed"), not an error.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from gpudiag.agent.base.safeio import create_stream
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.stats.trials import judge
from gpudiag.probes.files import read_regular, read_tail
from gpudiag.probes.inject.gpudiag_channel import FIX_ENV, STEPS_ENV
from gpudiag.probes.inject.gpudiag_fixes import KINDS
from gpudiag.probes.inject.gpudiag_guard import GUARD_ENV
from gpudiag.probes.inprocess.channel import injection_env
from gpudiag.probes.numbers import finite_number
from gpudiag.probes.spawn import start_process
from gpudiag.text.redact import printable, shown
from gpudiag.text.sink import say

NUMERICS = ("tf32",)  # kinds that change the job's numbers: only with --allow-numerics
TARGETED = (
    "thin",
    "skip",
    "cache",
    "freeze",
    "reuse",
    "select",
    "batched",
    "swap",
)  # kinds that name a call site or a module:
# KIND:MODULE.FUNCTION[:VALUES] (thin, skip); KIND:UNIT, the model's module by its dotted path
UNITS = ("freeze", "reuse", "select", "batched")
UNIT_RE = re.compile(r"[A-Za-z_]\w*(\.\w+)*")
# a call site: dotted names (a nested function's `<locals>` too), module then function
TARGET_RE = re.compile(r"[A-Za-z_]\w*(\.([A-Za-z_]\w*|<locals>))+")
REFUSED = "# refused:"  # an arm's step log: the job would have written over its outputs


@dataclass(frozen=True)
class Work:
    """The items an inference arm is timed over: from the one that ends the forward where
    the cumulative count first reaches `start` to `start + count`."""

    start: float
    count: float


@dataclass
class Arm:
    """One run of the job: its step rate over the measured window, or why there is none."""

    rate: float | None
    steps: int
    applied: str | None
    rc: int | None
    error: str | None = None
    work: Work | None = None  # the items it was timed over (an inference arm)
    refused: bool = False  # it would have written over the job's outputs: no arm runs again


@dataclass
class TrialPlan:
    """What to try and how long."""

    command: list[str]
    fix: dict
    rounds: int = 3
    seconds: float = 10.0
    warmup: float = 5.0
    finding: str | None = None
    predicted: float | None = None
    location: str | None = None
    predicted_low: float | None = None  # a hypothesis' low end (its range meets the interval)
    floor: bool = False  # the prediction is the least the fix gives: a measurement above holds
    log: list[str] = field(default_factory=list)
    work: Work | None = None  # an inference job's items, set by its first measured arm
    since: float | None = None  # the trial's start: the job's older files are never written


def progress(text: str) -> None:
    """One progress line on stderr."""
    say(text, prefix="gpudiag try: ")


MAX_STEPS_BYTES = 64 << 20  # an arm's step file: one line a step
TAIL_BYTES = 64 << 10  # the end of a failed arm's stderr


def read_steps(path: str) -> tuple[list[float], str | None, str | None]:
    """Step times, the applied-fix line and why the fix did not act (the later of the two
    lines wins) from an arm's step file (bounded; a time that is not a finite number ends the
    reading there)."""
    times, _, applied, why = read_clock(path)
    return times, applied, why


def read_clock(
    path: str,
) -> tuple[list[float], list[tuple[float, float]], str | None, str | None]:
    """(step times, forwards as (time, items), the applied-fix line, why the fix did not
    act) of an arm's step file."""
    times: list[float] = []
    forwards: list[tuple[float, float]] = []
    applied = why = None
    try:
        text = read_regular(path, MAX_STEPS_BYTES).decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("# applied:"):
                applied, why = printable(line[len("# applied:") :].strip())[:300], None
            elif line.startswith("# not applied:"):
                applied, why = None, printable(line[len("# not applied:") :].strip())[:300]
            elif line.startswith("f "):
                t, _, n = line[2:].partition(" ")
                forwards.append((finite_number(t), finite_number(n)))
            elif line.strip():
                times.append(finite_number(line))
    except (OSError, ValueError):
        pass
    return times, forwards, applied, why


def read_refused(path: str) -> str | None:
    """Why an arm was refused (its job would have written over its outputs), or None."""
    try:
        text = read_regular(path, MAX_STEPS_BYTES).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(REFUSED):
            return printable(line[len(REFUSED) :].strip())[:400]
    return None


def job_folders(command: list[str], cwd: str) -> list[str]:
    """The folders a job's outputs are in: its working folder and every folder its arguments
    name (an existing folder, a file's folder, `--out=DIR` too), the interpreter's left out."""
    out = [cwd]
    for arg in command[1:]:
        for text in (arg, arg.partition("=")[2]):
            if not text or text.startswith("-"):
                continue
            path = os.path.abspath(os.path.join(cwd, text))
            if os.path.isdir(path):
                out.append(path)
            elif os.path.isdir(os.path.dirname(path)) and os.path.dirname(path) != os.sep:
                out.append(os.path.dirname(path))
    return sorted(set(out))


def items_rate_after(
    forwards: list[tuple[float, float]], start: float, seconds: float
) -> tuple[float | None, int]:
    """Items per second over [start, start + seconds]: the items of the forwards after the
    first one inside it, over first to last (a batch inference loop's rate)."""
    inside = [(t, n) for t, n in forwards if start <= t <= start + seconds]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None, len(inside)
    return sum(n for _, n in inside[1:]) / (inside[-1][0] - inside[0][0]), len(inside)


def items_window(forwards: list[tuple[float, float]], start: float, seconds: float) -> Work | None:
    """The items `items_rate_after` timed: the cumulative count at the window's first
    forward, and the items after it."""
    done = 0.0
    inside: list[float] = []
    for t, n in forwards:
        done += n
        if start <= t <= start + seconds:
            inside.append(done)
    if len(inside) < 2 or inside[-1] <= inside[0]:
        return None
    return Work(inside[0], inside[-1] - inside[0])


def work_rate(forwards: list[tuple[float, float]], work: Work) -> tuple[float | None, int, bool]:
    """(items per second over `work`'s items, the forwards in it, whether the job got through
    them): from the forward whose cumulative count first reaches `work.start` to the one that
    reaches `work.start + work.count` (a batch of another size ends nearby: the items counted
    are the ones done)."""
    done = 0.0
    first: tuple[float, float] | None = None
    n = 0
    for t, k in forwards:
        done += k
        if first is None:
            if done >= work.start:
                first, n = (t, done), 1
            continue
        n += 1
        if done >= work.start + work.count:
            if t <= first[0]:
                return None, n, True
            return (done - first[1]) / (t - first[0]), n, True
    return None, n, False


def items_done(forwards: list[tuple[float, float]]) -> float:
    """All the items of an arm's forwards so far."""
    return sum(n for _, n in forwards)


def rate_after(times: list[float], start: float, seconds: float) -> tuple[float | None, int]:
    """Steps per second over [start, start + seconds] (first to last step inside it)."""
    inside = [t for t in times if start <= t <= start + seconds]
    if len(inside) < 2 or inside[-1] <= inside[0]:
        return None, len(inside)
    return (len(inside) - 1) / (inside[-1] - inside[0]), len(inside)


SLOW_CAP = 4.0  # an inference arm waits for the same items up to this x its window


def run_arm(command: list[str], fix: dict | None, plan: TrialPlan, folder: str) -> Arm:
    """Start the job, wait for its first step plus the warm-up, measure, stop it."""
    steps = tempfile.mktemp(prefix="steps-", dir=folder)
    env = injection_env(dict(os.environ), os.path.join(folder, "no-agent.sock"))
    env[STEPS_ENV] = steps
    env.pop(FIX_ENV, None)
    if fix is not None:
        env[FIX_ENV] = json.dumps(fix)
    env.pop(GUARD_ENV, None)
    if plan.since is not None:
        folders = job_folders(command, os.getcwd())
        env[GUARD_ENV] = json.dumps({"since": plan.since, "folders": folders})
    errpath = steps + ".err"
    with create_stream(errpath, "stderr of the job") as err:
        proc = start_process(
            command, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
    start = _wait_for_window(proc, steps, plan)
    rc = proc.poll()
    if rc is None:
        stop(proc)
    times, forwards, applied, why = read_clock(steps)
    tail = _tail(errpath)
    refused = read_refused(steps)
    if refused is not None:
        return Arm(None, len(times), applied, rc, f"refused: {refused}", refused=True)
    if why is not None and rc in (None, 0):
        return Arm(None, len(times), None, rc, f"the fix was not applied in the job: {why}")
    if rc not in (None, 0):
        return Arm(None, len(times), applied, rc, f"exit code {rc}: {tail}")
    if start is None:
        return Arm(None, 0, applied, rc, f"no optimizer step or model forward seen: {tail}")
    if times:
        rate, n = rate_after(times, start, plan.seconds)
        return _arm(rate, n, applied, rc)
    # no optimizer step: a batch inference loop, timed by its forwards' items
    if plan.work is not None:
        rate, n, whole = work_rate(forwards, plan.work)
        if whole:
            return _arm(rate, n, applied, rc, plan.work)
    rate, n = items_rate_after(forwards, start, plan.seconds)
    return _arm(rate, n, applied, rc, items_window(forwards, start, plan.seconds))


def _arm(rate: float | None, n: int, applied: Any, rc: Any, work: Work | None = None) -> Arm:
    if rate is None:
        return Arm(None, n, applied, rc, "too few steps after the warm-up")
    return Arm(rate, n, applied, rc, work=work)


def _wait_for_window(proc: subprocess.Popen, steps: str, plan: TrialPlan) -> float | None:
    """Wait while the job runs its warm-up and measured window; the window's start (None: no
    step or forward came). An inference arm given the items to time runs until it has done
    them (at most SLOW_CAP x the window's seconds after its first forward)."""
    limit = time.time() + plan.warmup + plan.seconds + 120  # start-up allowance
    start, by_steps = None, False
    while proc.poll() is None and time.time() < limit:
        time.sleep(0.2)
        if read_refused(steps) is not None:
            break
        if by_steps:
            continue
        # a training job's clock starts at its first optimizer step
        times, forwards, _, _ = read_clock(steps)
        first = times[0] if times else (forwards[0][0] if forwards else None)
        if first is not None and (start is None or times):
            start, by_steps = first + plan.warmup, bool(times)
            limit = start + plan.seconds + 1.0
            if not by_steps and plan.work is not None:
                limit = start + SLOW_CAP * plan.seconds + 1.0
        if not by_steps and plan.work is not None and forwards:
            if items_done(forwards) >= plan.work.start + plan.work.count:
                break
    return start


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the job's process group, then SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: str) -> str:
    """The last two lines of a failed arm's stderr, secrets hidden, controls removed."""
    try:
        text = read_tail(path, TAIL_BYTES).decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("gpudiag")]
    return shown(" | ".join(lines[-2:])[-4096:])[-300:]  # the tail, cut before matching


def change_line(fix: dict, location: str | None) -> str:
    """The code change to make, at the finding's location when it has one."""
    values = ", ".join(f"{k}={v!r}" for k, v in (fix.get("values") or {}).items())
    text = {
        "dataloader": f"DataLoader(..., {values})",
        "optimizer": f"torch.optim.<Optimizer>(..., {values})",
        "cudnn_benchmark": "torch.backends.cudnn.benchmark = True",
        "tf32": "torch.set_float32_matmul_precision('high')",
        "compile": "model = torch.compile(model)",
        "checkpoint": "save every {}th time (keep the last save)".format(
            (fix.get("values") or {}).get("every", 2)
        ),
        "inference_mode": "with torch.inference_mode(): model(...)",
        "anomaly_off": "torch.autograd.set_detect_anomaly(False)",
        "padding": "tokenizer(..., padding=True) (or DataCollatorWithPadding), not "
        'padding="max_length"',
        "load_once": "load the model once, before the loop, and reuse it (or "
        "functools.lru_cache on the function that loads it)",
        "batch": "DataLoader(..., batch_size=<{0}x the current>) (a Hugging Face pipeline: "
        "pipe(..., batch_size=<{0}x>))".format((fix.get("values") or {}).get("factor", 2)),
        "thin": "run {} every {}th time, not every time (or compute it incrementally, "
        "vectorised, or once)".format(fix.get("target"), (fix.get("values") or {}).get("every")),
        "settings": "; ".join(
            {
                "anomaly": "torch.autograd.set_detect_anomaly({})",
                "deterministic": "torch.use_deterministic_algorithms({})",
                "cudnn_deterministic": "torch.backends.cudnn.deterministic = {}",
                "cudnn_benchmark": "torch.backends.cudnn.benchmark = {}",
            }[k].format(bool(v))
            for k, v in (fix.get("values") or {}).items()
            if k in ("anomaly", "deterministic", "cudnn_deterministic", "cudnn_benchmark")
        ),
        "cache": f"compute {fix.get('target')} once for each set of arguments it is called "
        "with (before the loop, or functools.lru_cache / a dict keyed on them; a tensor "
        "argument by its values, not its identity)",
        "skip": f"take {fix.get('target')} off the loop's path (remove it, or run it in the "
        "background)",
        "freeze": f"{fix.get('target')}.requires_grad_(False) (what is meant to stay fixed "
        "computes no gradient and takes no update)",
        "recompute_off": "gradient checkpointing off where the activations fit: "
        "gradient_checkpointing=False (Hugging Face TrainingArguments, TRL's SFTConfig), "
        "or the block called directly in place of torch.utils.checkpoint.checkpoint",
        "select": _select_change(fix),
        "swap": "replace {} with {} in the code (the rewrite this trial timed)".format(
            fix.get("target"), (fix.get("values") or {}).get("with")
        ),
        "batched": f"call {fix.get('target')} once on the whole batch, not once per sample "
        "(one batched call in place of the loop; torch.vmap where it takes one sample)",
        "reuse": f"compute {fix.get('target')}'s output once and reuse it (once a step for a "
        "second call on the same batch; once before the loop for a constant input)",
    }.get(fix.get("kind", ""), values)
    if location:
        file, _, rest = location.partition(":")
        line = rest.partition(":")[0]
        return f"{file}:{line}: {text}"
    return text


def _select_change(fix: dict) -> str:
    """The code change a select trial stands for: a selection before the module, or (along its
    last dim, a layer's features) a narrower layer."""
    target, values = fix.get("target"), fix.get("values") or {}
    if values.get("dim") == -1:
        return (
            f"make {target} a layer of the {values.get('length')} output features read (its "
            f"weight's rows from {values.get('start')}), not a wider one sliced after it"
        )
    return (
        f"compute {target} over only what is read: select before it (e.g. {target}(x[:, -1]) in "
        f"place of {target}(x)[:, -1]), or narrow it to the outputs read"
    )


@dataclass
class Rounds:
    """What the interleaved arms gave: the rates of each arm, its failures, the fixed arm's
    applied line, and why the trial was refused (None: it was not)."""

    base: list[float] = field(default_factory=list)
    fixed: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    applied: str | None = None
    refused: str | None = None

    def add(self, arm: str, res: Arm, plan: TrialPlan) -> None:
        """One arm's result."""
        if res.refused:
            self.refused = res.error or "refused"
            progress(self.refused)
            return
        if arm == "B":
            self.applied = self.applied or res.applied
            if res.applied is None and res.error is None:
                res.error = "the fix was not applied in the job"
        if res.error:
            self.failures.append(f"{'fixed' if arm == 'B' else 'as is'}: {res.error}")
            progress(self.failures[-1])
        elif res.rate is not None:
            (self.fixed if arm == "B" else self.base).append(res.rate)
            plan.work = plan.work or res.work
            progress(f"  {res.rate:.2f}/s ({res.steps} steps or forwards)")


def run_rounds(plan: TrialPlan) -> Rounds:
    """The arms A B B A ..., until the rounds are done or an arm is refused."""
    got = Rounds()
    with tempfile.TemporaryDirectory(prefix="gpudiag-try-") as folder:
        os.chmod(folder, 0o700)
        for r in range(plan.rounds):
            for arm in ("A", "B") if r % 2 == 0 else ("B", "A"):
                if got.refused:
                    return got
                progress(f"round {r + 1}/{plan.rounds}: {'fixed' if arm == 'B' else 'as is'}")
                got.add(
                    arm, run_arm(plan.command, plan.fix if arm == "B" else None, plan, folder), plan
                )
    return got


def try_fix(plan: TrialPlan, th: Thresholds) -> dict:
    """Run the interleaved rounds for one fix and return its `trials` entry."""
    got = run_rounds(plan)
    base, fixed, failures, applied, refused = (
        got.base,
        got.fixed,
        got.failures,
        got.applied,
        got.refused,
    )
    result = judge(base, fixed, plan.predicted, th, plan.predicted_low, plan.floor)
    verdict, reason = result.verdict, result.reason
    if refused:
        verdict, reason = "refused", refused[:500]
        result = judge([], [], plan.predicted, th, plan.predicted_low, plan.floor)
    elif any(f.startswith("fixed") for f in failures) and not fixed:
        verdict, reason = "failed", "; ".join(failures)[:500]
    elif failures:
        reason += f" ({len(failures)} arm(s) failed: {failures[0][:200]})"
    if plan.fix.get("candidate") and result.measured is not None:
        reason += f"; a candidate the model was unsure of ({plan.fix['candidate']}): measured"
    return {
        "finding": plan.finding,
        "fix": plan.fix,
        "predicted": plan.predicted,
        "predicted_low": plan.predicted_low,
        "measured": None if result.measured is None else round(result.measured, 4),
        "interval": None if result.interval is None else [round(v, 4) for v in result.interval],
        "rounds": min(len(base), len(fixed)),
        "verdict": verdict,
        "reason": reason,
        "applied": applied,
        "change": change_line(plan.fix, plan.location),
        "timed_over": _timed_over(plan.work),
        "baseline_steps_per_s": [round(v, 4) for v in base],
        "fixed_steps_per_s": [round(v, 4) for v in fixed],
    }


def _timed_over(work: Work | None) -> str | None:
    """What each inference arm was timed over, in words (None: a training job's steps in each
    arm's measured seconds)."""
    if work is None:
        return None
    a, b = work.start, work.start + work.count
    return f"the same items in every arm: items {a:,.0f} to {b:,.0f} of those the model was given"


# each kind's values: a whole number in a range, a flag (true/false) or a function's dotted
# name (NAME)
NAME = "name"
VALUES: dict[str, dict[str, tuple[int, int] | str | None]] = {
    "dataloader": {
        "num_workers": (0, 1024),
        "prefetch_factor": (1, 1024),
        "pin_memory": None,
        "persistent_workers": None,
    },
    "optimizer": {"foreach": None, "fused": None},
    "checkpoint": {"every": (1, 1_000_000)},
    "batch": {"factor": (2, 1024)},
    "thin": {"every": (2, 1_000_000)},
    "swap": {"with": NAME},
    "select": {"dim": (-8, 7), "start": (-1_000_000, 1_000_000), "length": (1, 1_000_000)},
    "settings": {
        "anomaly": None,
        "deterministic": None,
        "cudnn_deterministic": None,
        "cudnn_benchmark": None,
    },
}


def check_values(kind: str, values: object) -> str | None:
    """Why a fix's values cannot be tried (an unknown name, a value of the wrong type or
    out of range), or None: checked here, before the job sees them."""
    if not isinstance(values, dict):
        return f"fix {kind}: values must be a table of name = value"
    allowed = VALUES.get(kind, {})
    for name, value in values.items():
        if name not in allowed:
            known = ", ".join(allowed) or "none"
            return f"fix {kind}: unknown value {str(name)[:40]!r} (known: {known})"
        limits = allowed[name]
        if limits == NAME:
            if not isinstance(value, str) or not TARGET_RE.fullmatch(value):
                return (
                    f"fix {kind}: {name} must be a function's dotted name (MODULE.FUNCTION), "
                    f"got {str(value)[:60]!r}"
                )
            continue
        if limits is None and not isinstance(value, bool):
            return f"fix {kind}: {name} must be true or false, got {str(value)[:40]!r}"
        if isinstance(limits, tuple) and (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not limits[0] <= value <= limits[1]
        ):
            return (
                f"fix {kind}: {name} must be a whole number from {limits[0]} to {limits[1]}, "
                f"got {str(value)[:40]!r}"
            )
    return None


def check_target(fix: dict) -> str | None:
    """Why a call-site fix's target or values cannot be tried (None: they can)."""
    kind, target = fix.get("kind"), fix.get("target")
    if kind not in TARGETED:
        return f"fix {kind}: takes no function" if target is not None else None
    if kind in UNITS:
        if not isinstance(target, str) or not UNIT_RE.fullmatch(target):
            return (
                f"fix {kind}: expected {kind}:MODULE (the model's module by its dotted path, "
                f"e.g. {kind}:encoder or {kind}:layers.0), got {str(target)[:60]!r}"
            )
        return None
    usage = f"{kind}:MODULE.FUNCTION" + (":every=N" if kind == "thin" else "")
    if not isinstance(target, str) or not TARGET_RE.fullmatch(target):
        return (
            f"fix {kind}: expected {usage} (MODULE a module or the script's stem, FUNCTION a "
            f"name in it), got {str(target)[:60]!r}"
        )
    if kind == "thin" and "every" not in (fix.get("values") or {}):
        return f"fix thin: needs every=N (from 2): {usage}"
    if kind == "swap" and "with" not in (fix.get("values") or {}):
        return (
            f"fix swap: needs with=MODULE.FUNCTION (the replacement): "
            f"swap:MODULE.FUNCTION:with=OTHER.FUNCTION, got {str(target)[:60]!r}"
        )
    return None


def check_fix(fix: dict, allow_numerics: bool, allow_compile: bool = False) -> str | None:
    """Why a fix cannot be tried (unknown kind, bad values, numerics or compile not
    allowed), or None."""
    kind = fix.get("kind")
    if kind not in KINDS:
        return f"unknown fix kind {kind!r} (one of: {', '.join(KINDS)})"
    bad = check_values(str(kind), fix.get("values") or {}) or check_target(fix)
    if bad:
        return bad
    if kind in NUMERICS and not allow_numerics:
        return f"{kind} changes the job's numerics: add --allow-numerics to try it"
    if kind == "compile" and not allow_compile:
        return "torch.compile is opt-in: add --allow-compile to try it"
    return None
