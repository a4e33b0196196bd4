"""EVAL001: evaluation passes inside a training loop take a large share of its wall time.

An evaluation pass is the loop thread's time under a function named like evaluation
(evaluate, validate, eval_step...; a trainer's evaluation loop): its forwards land in
"forward" and its batches in "data_wait", so without this finding a job that evaluates most of
the time reads as healthy. How often it runs and how long it takes come from the hooks' step
timing (the long steps), else from the stack samples' evaluation episodes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.measures.rules import Classifier, parse_frame
from gpudiag.analyzers.measures.steps import long_steps
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_step,
)
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Aggregate
from gpudiag.probes.stacks.pyspy_output import eval_frame_index, is_library_frame

EVAL001 = register(
    Spec(
        "EVAL001",
        "Evaluation inside the training loop",
        "run",
        False,
        claims=("loop_time", "eval_pass", "loop_host_time"),
        doc=Doc(
            means=(
                "evaluation inside a training loop: the loop thread's samples under a function "
                "named like evaluation (`evaluate`, `validate`, `eval_step`, `run_validation`, "
                "`val_epoch`...; not `train_and_evaluate`, nor one that runs backward; Hugging "
                "Face's `Trainer.evaluate`, Lightning's evaluation loop) are >= `eval_share_warn`"
                " of the loop, in a job that trains (backward and optimizer >= `eval_train_min`, "
                "or optimizer steps timed). How often and how long: the hooks' long steps, else "
                "the stack samples' evaluation episodes"
            ),
            fix=(
                'the interval that holds evaluation at or under `eval_share_target` ("every 200 '
                'steps instead of every 10 (evaluation 64% -> 8%)"), a held-out subset between '
                "full evaluations, `inference_mode` with a larger batch, or evaluation in another"
                " process"
            ),
        ),
    )
)


TRAINING = ("backward", "optimizer")
TRAINS_SHARE = 0.2  # of a function's samples in backward/optimizer: it trains
NICE = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8)


@dataclass(frozen=True)
class EvalTime:
    """The loop thread's samples under evaluation and where evaluation is called from."""

    samples: float
    share: float  # of the loop's samples (start-up left out)
    function: str  # the evaluation function, e.g. "evaluate"
    location: Location | None  # the call site in the loop
    file: str = ""  # the file that defines the evaluation function


@dataclass(frozen=True)
class Cadence:
    """How often evaluation runs and how long one pass takes."""

    every: float  # steps (hooks) or seconds (stacks) between passes
    unit: str  # "steps" or "s"
    pass_s: float  # seconds one pass takes
    seen: float  # passes seen
    source: str
    timed_share: float | None = None  # of the timed steps' wall time in the long steps


def _entry(frame: str) -> str:
    """A frame without its line: the same function whichever line it runs."""
    fr = parse_frame(frame)
    return f"{fr.function} ({fr.file})"


def _caller(frames: tuple[str, ...], i: int) -> str:
    """The job's own frame that calls the evaluation at frames[i]: the nearest caller outside
    libraries (torch's no_grad decorator wraps nanoGPT's estimate_loss in a library frame)."""
    for j in range(i - 1, -1, -1):
        if not is_library_frame(frames[j]):
            return frames[j]
    return frames[i - 1]


def eval_time(tl: Aggregate, profile: LoopProfile, clf: Classifier) -> EvalTime | None:
    """The loop thread's samples under an evaluation function. A function named like
    evaluation that runs backward or the optimizer trains: it is left out."""
    if profile.thread is None or profile.samples <= 0:
        return None
    rows = []
    trains: dict[str, float] = {}
    under: dict[str, float] = {}
    for (stack, code), n in tl.stacks.get(profile.thread, {}).items():
        frames = tuple(stack.split(";"))
        i = eval_frame_index(frames)
        if i is None:
            continue
        cat = clf.category(stack, code)
        if cat == "startup":
            continue
        rows.append((frames, i, n))
        key = _entry(frames[i])
        under[key] = under.get(key, 0.0) + n
        if cat in TRAINING:
            trains[key] = trains.get(key, 0.0) + n
    # a function that trains runs backward or the optimizer for a real part of its time; a
    # stray sample (a stack py-spy read while the thread moved on) does not make it train
    training = {k for k, v in trains.items() if v >= TRAINS_SHARE * under[k]}
    per: dict[str, float] = {}
    sites: dict[tuple[str, str], float] = {}
    for frames, i, n in rows:
        key = _entry(frames[i])
        if key in training:
            continue
        per[key] = per.get(key, 0.0) + n
        sites[(key, _caller(frames, i))] = sites.get((key, _caller(frames, i)), 0.0) + n
    total = sum(per.values())
    if total <= 0:
        return None
    (_, caller), _n = max(sites.items(), key=lambda kv: kv[1])
    fr = parse_frame(caller)
    loc = Location(fr.file, fr.line, fr.function) if fr.line > 0 else None
    top = max(per, key=lambda k: per[k])
    fn = parse_frame(top)
    return EvalTime(total, total / profile.samples, fn.function, loc, fn.file)


# a library's file: its module's dotted name follows the packages folder
_PACKAGES = re.compile(r".*/(site-packages|dist-packages)/")


def trial_fix(et: EvalTime, factor: float) -> dict | None:
    """The `gpudiag try` trial of evaluating `factor` times less often: the evaluation
    function run every N-th call (`thin:MODULE.FUNCTION:every=N`; a library's by its module's
    dotted name, the job's own by its file's stem); None when no name reaches it."""
    if not et.file.endswith(".py") or not re.fullmatch(r"[A-Za-z_]\w*", et.function):
        return None
    lib = _PACKAGES.match(et.file)
    path = et.file[lib.end() :] if lib else et.file.rsplit("/", 1)[-1]
    module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    if not all(re.fullmatch(r"[A-Za-z_]\w*", p) for p in module.split(".")):
        return None
    every = max(2, round(factor))
    return {"kind": "thin", "target": f"{module}.{et.function}", "values": {"every": every}}


def cadence(tl: Aggregate, profile: LoopProfile, share: float) -> Cadence | None:
    """Evaluation's interval and duration: the hooks' long steps when they carry about the
    evaluation's time, else the loop thread's evaluation episodes over the sampled time."""
    ls = long_steps(tl)
    if ls is not None and ls.long and ls.share >= share / 2:
        return Cadence(
            ls.steps / ls.long,
            "steps",
            ls.pause_s,
            float(ls.long),
            "in-process hooks",
            timed_share=ls.share,
        )
    if ls is not None and not ls.long and ls.steps:  # every step evaluates
        return Cadence(1.0, "steps", share * ls.total_s / ls.steps, float(ls.steps), "hooks")
    passes = samples = 0.0
    for (tid, _thread, anchor), (episodes, count) in tl.episodes.items():
        if profile.thread is not None and tid == profile.thread.tid:
            parts = tuple(anchor.split(";"))
            if eval_frame_index(parts) == len(parts) - 1:
                passes += episodes
                samples += count
    w = tl.windows.get("all")
    rate = w.rate_hz if w and w.rate_hz else 100.0
    sampled_s = w.duration_s if w and w.duration_s else tl.duration_s
    if passes < 1 or sampled_s <= 0:
        return None
    return Cadence(sampled_s / passes, "s", samples / passes / rate, passes, "stacks")


def nice_ceil(x: float) -> float:
    """The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten) >= x."""
    if x <= 1:
        return 1.0
    mag = 10 ** math.floor(math.log10(x))
    return next((m * mag for m in NICE if m * mag >= x - 1e-9), 10 * mag)


def share_after(share: float, factor: float) -> float:
    """Evaluation's share once it runs `factor` times less often (the training between two
    passes `factor` times longer)."""
    return share / (share + (1.0 - share) * factor)


def plan(share: float, cad: Cadence | None, th: Thresholds) -> tuple[float, float, str]:
    """(factor, share after, the action): evaluation `factor` times less often holds it at
    or under eval_share_target."""
    t = th.eval_share_target
    need = share * (1.0 - t) / ((1.0 - share) * t) if share < 1 else 100.0
    if cad is not None and cad.unit == "steps":
        new = nice_ceil(cad.every * max(1.0, need))
        factor = new / cad.every
        what = f"every {new:.0f} steps instead of every {cad.every:.0f}"
    elif cad is not None:
        new = nice_ceil(cad.every * max(1.0, need))
        factor = new / cad.every
        what = f"every {new:.0f} s of training instead of every {cad.every:.0f} s"
    else:
        factor = nice_ceil(max(1.0, need))
        what = f"{factor:.3g}x less often"
    after = share_after(share, factor)
    return (
        factor,
        after,
        f"run evaluation {what} (evaluation {share:.0%} of wall time -> {after:.0%})",
    )


def _evidence(
    share: float, train: float, after: float, cad: Cadence | None, th: Thresholds, src: str
) -> list[Evidence]:
    ev = [
        th.evidence("eval_share_warn", "eval_share", round(share, 4), "ratio", ">=", src),
        th.evidence("eval_train_min", "training_share", round(train, 4), "ratio", ">=", "stacks"),
        th.evidence(
            "eval_share_target", "eval_share_after_fix", round(after, 4), "ratio", "<=", "model"
        ),
    ]
    if cad is not None:
        unit = "steps" if cad.unit == "steps" else "s"
        ev += [
            Evidence("evaluations_seen", cad.seen, "count", source=cad.source),
            Evidence(
                f"{'steps' if unit == 'steps' else 'seconds'}_between_evaluations",
                round(cad.every, 2),
                unit,
                source=cad.source,
            ),
            Evidence("seconds_per_evaluation", round(cad.pass_s, 3), "s", source=cad.source),
        ]
    return ev


def _wall_share(et: EvalTime, cad: Cadence | None) -> float:
    """Evaluation's share of wall time: the hooks' long steps where they carry it (exact
    wall time: nanoGPT at eval_interval=10 spent 94% of its timed steps in them where 74% of
    the stack samples fell under estimate_loss, and EVAL001 predicted x3.5 for a fix that
    measured x15-17; sentence-transformers' training_stsbenchmark.py 21% where 13% of the
    samples fell under Trainer.evaluate), else the stack samples'. The long steps carry it
    when the samples under evaluation are at least half of them (more: other long pauses, a
    checkpoint save, are in them)."""
    if cad is not None and cad.timed_share is not None and et.share >= cad.timed_share / 2:
        return min(1.0, cad.timed_share)
    return et.share


def find(c: Context) -> list[Finding]:
    """EVAL001 with the evaluation's share, interval and duration, and the interval that
    holds it under eval_share_target."""
    tl = c.view
    profile = c.profile
    clf = c.clf
    metrics = c.metrics
    th = c.th
    if profile.samples < th.stack_floor_samples:  # how sure: confidence_above, as LOOP001
        return []
    et = eval_time(tl, profile, clf)
    if et is None:
        return []
    # judged on the share it reports: the hooks' exact one where they carry it
    cad = cadence(tl, profile, et.share)
    share = _wall_share(et, cad)
    if share < th.eval_share_warn:
        return []
    train = sum(profile.share(c) for c in TRAINING)
    if train < th.eval_train_min and not metrics.get("steps"):
        return []  # an evaluation or inference job: evaluating is its work
    conf = confidence_above(share, th.eval_share_warn, profile.samples)
    if conf < th.min_confidence:
        return []
    factor, after, action = plan(share, cad, th)
    how = ""
    if cad is not None:
        every = f"{cad.every:.0f} steps" if cad.unit == "steps" else f"{cad.every:.1f} s"
        how = f" One pass every {every}, each about {cad.pass_s:.2f} s ({cad.source})."
    where = f" at {et.location}" if et.location else ""
    timed = (
        f" (timed: the long steps; {et.share:.0%} of the stack samples)"
        if share != et.share
        else ""
    )
    msg = (
        f"Evaluation ({et.function}{where}) takes {share:.0%} of the training loop's "
        f"wall time{timed}.{how}"
    )
    fix = trial_fix(et, factor)
    measure = (
        (
            f"measure it first: gpudiag try --fix thin:{fix['target']}:every="
            f"{fix['values']['every']} -- <the job> (the fixed arm runs {et.function} every "
            f"{fix['values']['every']}th time; timed against the job as it is)",
        )
        if fix
        else ()
    )
    actions = (
        action,
        *measure,
        "evaluate on a fixed subset of the held-out set between full evaluations "
        "(e.g. the first N batches), and the full set at the end of an epoch",
        "run evaluation under torch.inference_mode() with model.eval(), with a larger batch "
        "size than training (no activations are kept)",
        "or evaluate saved checkpoints in a separate process or on another device",
    )
    return [
        new_finding(
            "EVAL001",
            th,
            confidence=conf,
            impact=share,
            message=msg,
            evidence=tuple(
                _evidence(share, train, after, cad, th, "stacks" if share == et.share else "hooks")
            ),
            recommendation=Recommendation(
                f"Evaluate {factor:.3g}x less often, or on a subset", actions
            ),
            expected_speedup=speedup_from_step((1.0 - share) / (1.0 - after)),
            fix=fix,
            location=et.location,
            signals=("stacks",) + (("hooks",) if cad and cad.unit == "steps" else ()),
            speedup_basis=f"training between evaluations {factor:.3g}x longer: evaluation "
            f"{share:.0%} -> {after:.0%} of wall time, the training steps unchanged",
        )
    ]


FINDER = Finder("evaluation", find, (EVAL001,))
