"""Where the loop's time goes when no catalogued category holds it: every loop stack sample
that no frame rule placed (and, on a job with no GPU, the "sync" and "copy" lines, which only
cost time on a device), grouped by the call the job's own code made and what that call is.

A site is the innermost frame of the job's own code, the first library call below it (the
call the job made: `urllib.request.urlopen`, `logging.Logger.debug`) and the family of the
work under it (a network call, a logging handler, a sleep, a lock, formatting tensors...),
from which the finding that names it writes its fix. Off-CPU families are waits the thread
sleeps through; the rest run on the CPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.measures.rules import Classifier, Frame, parse_stack
from gpudiag.analyzers.measures.workload import LOOP_IN_C_RE, is_supervising
from gpudiag.analyzers.model.results import Location
from gpudiag.analyzers.timeline.timeline import Aggregate
from gpudiag.probes.stacks.pyspy_output import eval_frame_index

# (family, library label, expression on a frame's file or dotted name), first match wins,
# tested from the call the job made inwards.
_FAMILIES: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (fam, lib, re.compile(rx))
    for fam, lib, rx in (
        ("network", "requests", r"(^|/)requests/"),
        ("network", "urllib3", r"(^|/)urllib3/"),
        ("network", "httpx", r"(^|/)(httpx|httpcore)/"),
        ("network", "aiohttp", r"(^|/)aiohttp/"),
        ("network", "grpc", r"(^|/)grpc/"),
        ("network", "boto3", r"(^|/)(boto3|botocore|s3transfer)/"),
        ("network", "urllib", r"(^|/)urllib/request\.py$"),
        ("network", "http.client", r"(^|/)http/client\.py$"),
        ("network", "socket", r"(^|/)(socket|ssl)\.py$"),
        ("logging", "logging", r"(^|/)logging/(__init__|handlers)\.py$"),
        ("subprocess", "subprocess", r"(^|/)subprocess\.py$"),
        ("tensor_text", "torch", r"(^|/)torch/_tensor_str\.py$"),
        ("lock", "threading", r"(^|/)(threading|queue)\.py$|multiprocessing/synchronize\.py$"),
        # a queue or event in another process (a multiprocessing Manager's proxy, a Pipe):
        # the call waits for that process's answer (LitServe's workers take their requests
        # so; its front end waits on its shutdown event so)
        ("lock", "multiprocessing", r"multiprocessing/(managers|connection)\.py$"),
    )
)
# Calls on the executing line of the job's own code (C functions py-spy shows no frame for).
_CODE_FAMILIES: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (fam, lib, re.compile(rx))
    for fam, lib, rx in (
        ("gc", "gc", r"\bgc\.collect\("),
        ("sleep", "time", r"\bsleep\("),
        ("network", "socket", r"\.(recv|recv_into|sendall|send|connect)\("),
        # a transaction committed (DB-API's conn.commit(), SQLAlchemy's session.commit()) or
        # a file synced to disk: the thread waits for the disk or the database server
        ("commit", "db", r"\.commit\(|\bos\.(fsync|fdatasync)\("),
        ("print", "print", r"(^|[^\w.])print\("),
        ("file", "io", r"\.(write|flush)\(|\b(json|pkl|np|numpy|torch)\.(dump|save)\(|\.dump\("),
    )
)
MAX_SITES = 50  # sites kept, largest first (a finding shows three)
OFF_CPU = frozenset({"network", "sleep", "subprocess", "lock", "file", "commit"})
# Families of calls the loop makes and waits for, each a blocking call (BLOCK001).
BLOCKING = frozenset({"network", "logging", "sleep", "subprocess", "file", "commit"})


@dataclass(frozen=True)
class Site:
    """One place the loop's unplaced time goes."""

    location: Location | None  # the job's own frame that made the call
    call: str  # the call it made ("urllib.request.urlopen"), or its own code line
    family: str  # network, logging, sleep, lock, gc, tensor_text, print, file, commit, python,
    # user
    library: str  # requests, urllib, logging, torch..., or "" for the job's own code
    share: float  # of the loop's stack samples
    code: str = ""  # the executing line (innermost frame)

    @property
    def off_cpu(self) -> bool:
        """True when the thread sleeps through this work (a wait, not computation)."""
        return self.family in OFF_CPU


@dataclass(frozen=True)
class Unplaced:
    """The loop's time no category holds: its share and the sites it goes to, largest first."""

    share: float
    samples: float
    sites: tuple[Site, ...]

    def capped(self, share: float) -> Unplaced:
        """The same sites scaled to at most `share` of the loop (the breakdown's share of
        these categories once the hooks' exact timings and the GIL wait took theirs)."""
        if self.share <= share or self.share <= 0:
            return self
        k = share / self.share
        return Unplaced(
            share, self.samples, tuple(replace(s, share=s.share * k) for s in self.sites)
        )

    def of(self, families: frozenset[str]) -> float:
        """The share in these families."""
        return sum(s.share for s in self.sites if s.family in families)


def code_family(code: str) -> str | None:
    """The family of a C call on the job's own executing line (gc.collect(), a sleep, a
    socket read), None for plain Python work."""
    for fam, _lib, rx in _CODE_FAMILIES:
        if rx.search(code):
            return fam
    return None


def _family(frames: tuple[Frame, ...], user_idx: int, code: str) -> tuple[str, str]:
    """What the work under the job's own frame is: (family, library)."""
    below = frames[user_idx + 1 :]
    if is_supervising(below):
        # gunicorn's master: waiting for signals, sleeping between its workers' spawns and
        # stops; a server's process that serves no request, idle as a lock wait is
        return "lock", "gunicorn"
    if below and LOOP_IN_C_RE.search(below[-1].file):
        # asyncio's runner innermost: a uvloop event loop running in C, in its epoll wait
        # (BentoML's idle worker read LOOP001 100% on it); a busy loop shows its callbacks
        return "lock", "asyncio"
    for fr in below:
        for fam, lib, rx in _FAMILIES:
            if rx.search(fr.file):
                return fam, lib
    inner_user = not below
    if user_idx < 0 and not below:
        return "native", ""
    for fam, lib, rx in _CODE_FAMILIES:
        if rx.search(code) and (inner_user or fam != "print"):
            return fam, lib
    return ("user", "") if inner_user else ("python", below[0].dotted.split(".")[0])


def _site_key(stack: str, code: str) -> tuple[Location | None, str, str, str, bool]:
    """(the job's frame, the call it made, family, library, whether the job's own code is
    the innermost frame)."""
    # gpudiag's own wrappers and py-spy's process/thread labels say nothing of the call
    frames = tuple(fr for fr in parse_stack(stack) if fr.file and fr.line > 0 and not fr.is_own)
    user_idx = max((i for i, fr in enumerate(frames) if fr.is_user and fr.line > 0), default=-1)
    fam, lib = _family(frames, user_idx, code)
    loc = None
    if user_idx >= 0:
        fr = frames[user_idx]
        loc = Location(fr.file, fr.line, fr.function)
    below = frames[user_idx + 1 :]
    call = below[0].dotted if below else (code.strip() or "(no Python frame: native code)")
    return loc, call, fam, lib, user_idx >= 0 and not below


# a wait on another thread or process (a lock, queue, event, a Manager's proxy), or a sleep
# between polls of it (LitServe's front end sleeps while its workers start): no work of its own
WAITS = frozenset({"lock", "sleep"})


def waiting_share(view: Aggregate, profile: LoopProfile, clf: Classifier) -> float:
    """The share of the loop's stack samples that wait on another thread or process (a lock,
    a queue, an event, a Manager's proxy, a sleep between polls) with no rule placing them: a
    process that waits through its whole loop (a front end joined on its workers) does no
    work of its own."""
    return unplaced(view, profile, clf, ("other",)).of(WAITS)


def reads_python(rows: dict[tuple[str, str], float]) -> bool:
    """Whether most of a thread's samples hold Python frames: then a sample with none is one
    py-spy could not read (a thread that runs Python keeps its outer frames while it calls
    native code; at a load of 8 on 2 cores 23% of a loop thread's samples came back empty
    while it ran 15% of the time), never native work of its own. A thread that never shows a
    Python frame (a Triton stub's C++ loop) keeps its samples."""
    total = sum(rows.values())
    framed = sum(n for (stack, _code), n in rows.items() if stack)
    return total > 0 and framed >= total / 2


def unplaced(
    view: Aggregate,
    profile: LoopProfile,
    clf: Classifier,
    categories: tuple[str, ...],
    skip: frozenset[str] = frozenset(),
    named: frozenset[tuple[str, str]] = frozenset(),
) -> Unplaced:
    """The loop samples in `categories` (the ones no rule explains), by site. `skip` "user"
    leaves out samples whose innermost frame is the job's own plain Python (HOST001 names
    those; a C call on its line, such as gc.collect() or a socket read, stays here). `named`:
    (file, function) of the job's frames another finding already names; `skip` "eval" leaves
    out the samples under an evaluation pass (EVAL001 names that time, whatever it does
    inside: nanoGPT's estimate_loss spends it in get_batch); `skip` "lock" leaves out the
    waits on a queue, lock or event (a server's threads waiting for work: idle); `skip`
    "native" the samples with no Python frame (a Triton server's own machinery)."""
    n = profile.samples
    if n <= 0 or profile.thread is None:
        return Unplaced(0.0, 0.0, ())
    by_site: dict[tuple, list] = {}
    rows = view.stacks.get(profile.thread, {})
    torn = reads_python(rows)
    for (stack, code), count in rows.items():
        if profile.placed(clf, stack, code) not in categories:
            continue
        if torn and not stack:
            continue  # an unreadable sample of a Python thread, not native work
        loc, call, fam, lib, own = _site_key(stack, code)
        if "user" in skip and own and fam == "user":
            continue
        if fam in skip and fam in ("lock", "native"):
            continue
        if "eval" in skip and eval_frame_index(tuple(stack.split(";"))) is not None:
            continue
        if loc is not None and (loc.file, loc.function) in named:
            continue  # a finding already names this function: its time is explained
        entry = by_site.setdefault((loc, call, fam, lib), [0.0, code])
        entry[0] += count
    total = sum(v[0] for v in by_site.values())
    sites = sorted(
        (Site(k[0], k[1], k[2], k[3], v[0] / n, v[1]) for k, v in by_site.items()),
        key=lambda s: (-s.share, s.call),
    )
    return Unplaced(min(1.0, total / n), n, tuple(sites[:MAX_SITES]))


MODEL_CATEGORIES = ("forward", "backward", "optimizer")


def loop_function(view: Aggregate, profile: LoopProfile, clf: Classifier) -> tuple[str, str] | None:
    """(file, function) of the job's frame that runs the loop: the one that calls into the
    model's forward, backward and optimizer step most often (the job's frame just above the
    first library frame of those stacks)."""
    if profile.thread is None:
        return None
    counts: dict[tuple[str, str], float] = {}
    for (stack, code), n in view.stacks.get(profile.thread, {}).items():
        if profile.placed(clf, stack, code) not in MODEL_CATEGORIES:
            continue
        frames = tuple(fr for fr in parse_stack(stack) if fr.file and fr.line > 0)
        caller = None
        for fr in frames:
            if not fr.is_user:
                break
            caller = fr
        if caller is not None:
            key = (caller.file, caller.function)
            counts[key] = counts.get(key, 0.0) + n
    return max(counts, key=lambda k: (counts[k], k)) if counts else None


# a C call on the job's own line, as the thin/skip trial names it (its module's attribute)
_CODE_TARGETS = (
    (re.compile(r"\bgc\.collect\("), "gc.collect"),
    (re.compile(r"\btime\.sleep\("), "time.sleep"),
    (re.compile(r"(^|[^\w.])print\("), "builtins.print"),
    (re.compile(r"\bos\.(fsync|fdatasync)\("), "os.{0}"),
)
_NAME = re.compile(r"[A-Za-z_]\w*")


def call_target(site: Site, loop: tuple[str, str] | None) -> str | None:
    """MODULE.FUNCTION of the call a thin or skip trial of `site` runs less often: the job's
    own function that makes the call when the loop calls it (a helper, a callback), else the
    call the loop makes itself (a library function, or a C call on its line); None when no
    name reaches it (a method of a C object, such as sqlite3's conn.commit())."""
    loc = site.location
    if loc is not None and (loc.file, loc.function) != loop and loc.function != "<module>":
        stem = loc.file.rsplit("/", 1)[-1].removesuffix(".py")
        target = f"{stem}.{loc.function}"
        return (
            target
            if all(_NAME.fullmatch(p) or p == "<locals>" for p in target.split("."))
            else None
        )
    if "." in site.call and all(_NAME.fullmatch(p) for p in site.call.split(".")):
        return site.call
    for rx, name in _CODE_TARGETS:
        m = rx.search(site.code)
        if m:
            return name.format(m.group(1)) if "{0}" in name else name
    return None


def every_n(share: float, target: float) -> int:
    """Every how many steps a per-step call keeps `target` of the loop (a multiple of 10)."""
    return max(10, 10 * math.ceil(share / max(target, 1e-3) / 10))


# What a line of the job's own per-step Python does, from its text (first match wins): the
# fix follows from it. (kind, expression)
LINE_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(rx))
    for kind, rx in (
        # reading or preparing the batch's inputs: DataLoader workers overlap it
        (
            "input",
            r"(?i)token|encode|decode|transform|augment|collate|preprocess|\bopen\(|"
            r"\bread|imread|Image\.|load\(",
        ),
        # a structure rebuilt: build it once, update it in place
        (
            "rebuilt",
            r"\b(deepcopy|copy\.copy|dict|list|set|tuple|defaultdict|Counter|DataFrame|array)\(|"
            r"\.copy\(\)|\{[^}]*:[^}]*\bfor\b",
        ),
        # a whole collection reduced again (sorted, summed, ranked): incrementally
        (
            "recomputed",
            r"\b(sorted|sum|min|max|mean|median|statistics\.\w+|np\.\w+|torch\.\w+)\(|"
            r"\.sort\(|\.(mean|sum|std|var|quantile)\(",
        ),
        # a Python loop over items: vectorised
        ("loop", r"^\s*(for|while)\b|\[[^\]]*\bfor\b[^\]]*\bin\b"),
    )
)


def line_kind(code: str, function: str = "") -> str:
    """What a line of the job's own Python does: input, rebuilt, recomputed, loop or other."""
    for kind, rx in LINE_KINDS:
        if rx.search(code) or (kind == "input" and rx.search(function)):
            return kind
    return "other"
