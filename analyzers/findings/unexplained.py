"""Every second of the loop accounted for: the time no catalogued cause explains is named.

BLOCK001: the loop waits for a call it makes every step (a metrics POST, a logging handler,
a synchronous upload, a sleep, a subprocess), named by the call and its library.
LOOP001: the rest of the loop's unplaced time above `unexplained_warn`, named by where it
goes (call sites, on or off the CPU), so that "no bottleneck" is never said over it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.findings.host_bound import user_code_share
from gpudiag.analyzers.measures.accounting import (
    BLOCKING,
    Site,
    Unplaced,
    call_target,
    every_n,
    loop_function,
    unplaced,
    waiting_share,
)
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.measures.workload import TRITON_BASIS
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.model.thresholds import Thresholds

BLOCK001 = register(
    Spec(
        "BLOCK001",
        "A blocking call in the loop holds every step (network, logging, sleep, upload)",
        "host",
        True,
        reads=("loop_time", "eval_pass"),
        doc=Doc(
            means=(
                "the loop waits for a call it makes itself every step: a network call (requests, "
                "urllib, http.client, a raw socket, boto3, grpc), a logging handler (and the "
                "tensor reprs it formats), a file write, a transaction committed or a file synced"
                " to disk (`conn.commit()`, `session.commit()`, `os.fsync`), a sleep, a "
                "subprocess: loop stack samples no frame rule places, grouped by the job's own "
                "frame and the call it made (`blocking_call_warn`)"
            ),
            fix=(
                "names the call, its library and the line; send it from a background thread, or "
                "every N steps (N chosen to keep `per_step_call_target` of the loop); log "
                "numbers, not tensors; a `QueueHandler`; one commit per batch, not per row; "
                "carries the trial that measures it: `gpudiag try --fix "
                "thin:MODULE.FUNCTION:every=N` on its top call site"
            ),
            measured=(
                Measured(
                    impact="the blocking calls' share",
                    speedup="the share taken off the loop "
                    "(sent in the background or every N steps)",
                ),
            ),
        ),
    )
)

LOOP001 = register(
    Spec(
        "LOOP001",
        "Loop time no catalogued cause explains",
        "host",
        True,
        note_title="Loop time no catalogued cause explains, under the warning threshold",
        claims=("unexplained",),  # a verdict with it is never a sure "no bottleneck"
        reads=("loop_time", "eval_pass"),
        doc=Doc(
            means=(
                "loop time no catalogued cause explains, above `unexplained_warn`: the rest of "
                "the unplaced samples (a `gc.collect()` per step, formatting tensors, a lock "
                "another thread holds, library code no rule knows), by call site, on or off the "
                'CPU; "no bottleneck" is never said over it (on a job with no GPU, the lines that'
                " only cost time on a device, `.tolist()`, `.to(device)`, count here)"
            ),
            fix=(
                "names the call site and what it is (`gc.collect()`: remove it or `gc.freeze()`; "
                "a lock: find its holder); otherwise make it cheaper, run it every N steps, or "
                "move it off the loop thread; carries the trial that measures it: `gpudiag try "
                "--fix thin:MODULE.FUNCTION:every=N` on its top call site"
            ),
            measured=(
                Measured(
                    impact="the unexplained share",
                    speedup="a bound: the share removed",
                ),
            ),
        ),
    )
)


# Categories that cost time only on a device: on a job with no GPU they are plain CPU work
# (a CPU tensor's .tolist() is a copy, not a wait for a GPU).
DEVICE_ONLY = ("sync", "h2d_copy")

_WHAT = {
    "network": "a network call",
    "logging": "a logging call",
    "sleep": "a sleep",
    "subprocess": "a subprocess",
    "file": "a file write",
    "commit": "a commit or sync to disk",
    "lock": "a wait on a lock, queue or event",
    "gc": "a garbage collection",
    "tensor_text": "formatting tensors as text",
    "print": "printing",
    "python": "library code",
    "user": "the job's own code",
    "native": "native code with no Python frame",
}


def _every(share: float, th: Thresholds) -> int:
    """Every how many steps a per-step call keeps `per_step_call_target` of the loop."""
    return every_n(share, th.per_step_call_target)


def _where(s: Site) -> str:
    """'urllib.request.urlopen, called from push (train.py:41)'."""
    at = f"{s.location.function} ({s.location.file}:{s.location.line})" if s.location else ""
    if s.family in ("user", "gc", "print", "sleep") and s.call == s.code.strip():
        return f"`{s.call}` in {at}" if at else f"`{s.call}`"
    return f"{s.call}, called from {at}" if at else s.call


def _site_line(s: Site) -> str:
    cpu = "off-CPU, waiting" if s.off_cpu else "on the CPU"
    return f"{s.share:.0%} in {_WHAT[s.family]}: {_where(s)} ({cpu})"


def _actions(s: Site, th: Thresholds) -> tuple[str, ...]:
    """The fix, written from what the call is."""
    n = _every(s.share, th)
    after = f"{s.share:.0%} of the loop -> {s.share / n:.1%}"
    by_family = {
        "network": (
            f"send it from a background thread (queue.Queue + threading.Thread) so the loop "
            f"never waits for the {s.library} call",
            f"or send every {n} steps, batched ({after})",
        ),
        "logging": (
            f"log every {n} steps ({after}), and log numbers (loss.item()), not tensors",
            "or hand records to a logging.handlers.QueueHandler + QueueListener, so the "
            "loop does not wait for the handler",
        ),
        "file": (f"write every {n} steps ({after}), or from a background thread",),
        "commit": (
            f"commit once per batch or every {n} rows ({after}): one transaction around the "
            "batch's writes (`with conn:`), not a commit per row",
            "or hand the rows to a writer thread that commits in batches",
        ),
        "sleep": (
            "remove the sleep from the loop, or move it to a thread the loop does not wait for",
        ),
        "subprocess": (f"start it without waiting (subprocess.Popen) or run it every {n} steps",),
        "lock": (
            "another thread holds what the loop waits for: find the holder (py-spy dump "
            "--pid PID) and shorten its critical section, or stop sharing it with the loop",
        ),
        "gc": (
            "remove the per-step gc.collect(): CPython collects by itself",
            f"if memory needs it: every {n} steps, or gc.freeze() after set-up so that "
            "long-lived objects are not scanned again",
        ),
        "tensor_text": (
            f"print or log numbers (loss.item()) every {n} steps, not whole tensors ({after})",
        ),
        "print": (f"print every {n} steps ({after})",),
    }
    generic = (
        f"make {_where(s)} cheaper, run it every {n} steps ({after}), or move it off the "
        "loop thread",
        "profile it: py-spy record --pid PID --native shows what it does inside",
    )
    return by_family.get(s.family, generic)


@dataclass(frozen=True)
class Claim:
    """What one finding claims of the unplaced time: its sites, their share, and the
    threshold setting it crossed."""

    sites: tuple[Site, ...]
    share: float
    setting: str
    limit: float


def _evidence(u: Unplaced, claim: Claim, metric: str, loop_cpu: float | None) -> tuple:
    share, sites = claim.share, claim.sites
    ev = [Evidence(metric, round(share, 4), "ratio", claim.limit, ">=", claim.setting, "stacks")]
    for s in sites[:3]:
        ev.append(
            Evidence(f"site_share[{s.call[:80]}]", round(s.share, 4), "ratio", source="stacks")
        )
    if loop_cpu is not None:
        ev.append(
            Evidence("loop_thread_cpu", round(loop_cpu, 4), "ratio", source="procfs schedstat")
        )
    ev.append(Evidence("loop_stack_samples", u.samples, "count", source="stacks"))
    return tuple(ev)


def trial_fix(site: Site, every: int, loop: tuple[str, str] | None) -> dict | None:
    """The thin trial of a site (`gpudiag try --fix thin:MODULE.FUNCTION:every=N`): its call
    run every `every`-th time; None when no name reaches the call."""
    target = call_target(site, loop)
    if target is None:
        return None
    return {"kind": "thin", "target": target, "values": {"every": every}}


def try_line(fix: dict, site: Site, share: float) -> str:
    """The action that measures a call-site fix on the job itself (its top site's share)."""
    every = fix["values"]["every"]
    part = "" if site.share >= 0.95 * share else f", {site.share:.0%} of its {share:.0%}"
    return (
        f"measure it first: gpudiag try --fix thin:{fix['target']}:every={every} -- <the job> "
        f"(the fixed arm runs {fix['target']} every {every}th time{part}; timed against the "
        "job as it is)"
    )


def _finding(
    fid: str, u: Unplaced, claim: Claim, c: Context, loop: tuple[str, str] | None
) -> Finding:
    sites, share, setting = claim.sites, claim.share, claim.setting
    top = sites[0]
    fix = trial_fix(top, _every(top.share, c.th), loop)
    conf = confidence_above(share, claim.limit, u.samples)
    lines = "; ".join(_site_line(s) for s in sites[:3] if s.share >= 0.01 or s is top)
    if fid == BLOCK001.id:
        msg = (
            f"The loop waits {share:.0%} of its time for calls it makes itself: {lines}. "
            "No step can finish before the call returns."
        )
        summary = f"Take {_WHAT[top.family]} off the loop's path"
        kind, basis = (
            "model",
            (
                f"the blocking calls' share ({share:.0%}) taken off the loop "
                "(sent in the background or every N steps)"
            ),
        )
    else:
        msg = (
            f"{share:.0%} of the loop goes to work no catalogued cause explains: {lines}. "
            "It is not the model, the input pipeline, a checkpoint or a wait gpudiag "
            "knows; it is where this job's time goes."
        )
        summary = f"Make {_where(top)} cheaper, rarer, or move it off the loop thread"
        kind, basis = (
            "bound",
            (f"at most: the unexplained share ({share:.0%}) removed from the loop"),
        )
    return new_finding(
        fid,
        c.th,
        note=setting == "unexplained_note",
        confidence=conf,
        impact=share,
        message=msg,
        evidence=_evidence(
            u,
            claim,
            "unplaced_loop_share" if fid == LOOP001.id else "blocking_call_share",
            c.metrics.get("loop_thread_cpu"),
        ),
        recommendation=Recommendation(
            summary, _actions(top, c.th) + ((try_line(fix, top, share),) if fix else ())
        ),
        expected_speedup=speedup_from_impact(share),
        location=top.location,
        signals=("stacks",),
        speedup_basis=basis,
        speedup_kind=kind,
        fix=fix,
    )


def find(c: Context) -> list[Finding]:
    """BLOCK001 and LOOP001 over the loop's unplaced time."""
    th, profile = c.th, c.profile
    # how sure follows from the effect against its threshold and the samples behind it
    # (confidence_above), not from min_loop_samples: a 60% share is sure on few samples
    if profile.samples < th.stack_floor_samples:
        return []
    if waiting_share(c.view, profile, c.clf) >= th.waiting_loop_share:
        return []  # the process only waits on others: never the loop (the verdict says so)
    cats = ("other",) + (DEVICE_ONLY if c.idle is None and not c.stats else ())
    user, _ = user_code_share(c.view, profile, c.clf)
    host001 = c.idle is None and user >= th.host_user_code_warn  # HOST001 names that time
    named = frozenset((f.location.file, f.location.function) for f in c.found if f.location)
    # a server's threads wait on a queue or event when there is no work: its model thread
    # for requests, a request for its batch's answer (SERVE001 names a batching that waits)
    server = c.workload is not None and c.workload.kind == "server"
    # a Triton server's Python process outside Python is Triton's own machinery moving each
    # execution's requests and answers (a Python backend's C++ stub, PyTriton's proxy): the
    # cost an execution pays, which SERVE001's batching shares
    triton = server and c.workload is not None and c.workload.basis == TRITON_BASIS
    skip = frozenset(
        ({"user"} if host001 else set())
        | ({"eval"} if c.claimed("eval_pass") else set())
        | ({"lock"} if server else set())
        | ({"native"} if triton else set())
    )
    u = unplaced(c.view, profile, c.clf, cats, skip=skip, named=named)
    loop = loop_function(c.view, profile, c.clf)
    u = u.capped(sum(c.shares.get(cat, 0.0) for cat in cats))
    out: list[Finding] = []
    blocking = tuple(s for s in u.sites if s.family in BLOCKING)
    block_share = sum(s.share for s in blocking)
    rest, rest_share = u.sites, u.share
    # with a GPU signal, the loop's host time costs no more than the GPU idles: a GPU busy
    # through the loop (a memory-bound elementwise job at 100%) hides it
    cap = 1.0 if c.idle is None else c.idle
    if block_share >= th.blocking_call_warn and cap >= th.blocking_call_warn:
        claim = Claim(blocking, block_share, "blocking_call_warn", th.blocking_call_warn)
        out.append(_finding("BLOCK001", u, claim, c, loop))
        rest = tuple(s for s in u.sites if s.family not in BLOCKING)
        rest_share = max(0.0, u.share - block_share)
    # under unexplained_warn, down to unexplained_note, LOOP001 is a note
    for setting in ("unexplained_warn", "unexplained_note"):
        if rest and min(rest_share, cap) >= getattr(th, setting):
            out.append(
                _finding(
                    "LOOP001", u, Claim(rest, rest_share, setting, getattr(th, setting)), c, loop
                )
            )
            break
    return out


FINDER = Finder("unexplained", find, (BLOCK001, LOOP001))
