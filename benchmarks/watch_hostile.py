"""What `gpudiag watch` costs beside the hostile processes of review adversarial-6 (section 2
of issue 53), against the same watch without them, in one run: its CPU (gpudiag and every
py-spy it ran, in cores) and its peak resident memory, next to its budget (0.10 cores and
400 MB for every job together).

Both arms watch one light training job (benchmarks/light_job.py) with `--match` on a fresh
folder. The hostile arm adds, as another user (uid 65534 when run as root) and each naming
that folder on its command line so that `--match` sees them:

- X04: BIG processes with 14 arguments of 131,000 bytes (1.8 MB of command line) each;
- X05: MAPS Python processes with 30,000 memory mappings each (no libtorch: never watched);
- N27: FAKE processes that map a file named libtorch (each a job to watch) and sleep;
- N65: one such process with 1,500 idle threads;
- X03: one with a 48 KB argument of `a.a.a…` (the redaction's worst case).

With `--short S` each fake job lives S seconds and a new one (a new pid) takes its place as it
ends: an attacker who keeps starting short-lived jobs, each a session start for watch.
`--before PYTHON` adds the hostile arm once more with that interpreter's gpudiag (another
checkout's venv: the code before a change), in the same run.

    python benchmarks/watch_hostile.py --seconds 40
    python benchmarks/watch_hostile.py --seconds 90 --short 8 --before ../base/.venv/bin/python
    python benchmarks/watch_hostile.py --seconds 60 --settle 25 --threads-first

CPU is given over the whole run (start-up and the first session starts included) and over
the steady part after `--settle` seconds; /metrics is scraped every 15 s, as Prometheus
would, and the last scrape's size is shown.

Run it under the box's measurement lock, and give the load average beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
HOSTILE_PY = "/usr/bin/python3"  # another user must be able to run it (not root's pyenv)
NOBODY = 65534
FAKE = """
import mmap, sys, threading, time
f = open(sys.argv[1], "rb"); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
ev = threading.Event()
for _ in range(int(sys.argv[2])):
    threading.Thread(target=ev.wait, daemon=True).start()
time.sleep(float(sys.argv[3]))
"""
MAPS = """
import mmap, sys, time
keep = [mmap.mmap(-1, 4096, prot=mmap.PROT_READ | (mmap.PROT_WRITE if i % 2 else 0))
        for i in range(int(sys.argv[1]))]
time.sleep(float(sys.argv[2]))
"""


def _as_other_user() -> dict:
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}


def _fake(folder: Path, seconds: float) -> subprocess.Popen:
    """One idle fake job (it maps a file named libtorch) living `seconds`."""
    kw = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **_as_other_user()}
    lib = folder / "libtorch_fake.so"
    cmd = [HOSTILE_PY, str(folder / "fake.py"), str(lib), "0", str(seconds)]
    return subprocess.Popen(cmd, **kw)


def _hostile(folder: Path, args: argparse.Namespace, seconds: float) -> list[subprocess.Popen]:
    """The hostile processes, each naming `folder` on its command line."""
    lib = folder / "libtorch_fake.so"
    lib.write_bytes(b"\0" * 4096)
    (folder / "fake.py").write_text(FAKE)
    (folder / "maps.py").write_text(MAPS)
    kw = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **_as_other_user()}
    fake_s = args.short or seconds
    py, tag, s = HOSTILE_PY, str(folder), str(seconds)
    big = ["a" * 131_000] * 14
    extra: list[subprocess.Popen] = []
    if getattr(args, "extra", True):  # N65 and X03: with the fake jobs
        extra.append(subprocess.Popen([py, str(folder / "fake.py"), str(lib), "1500", s], **kw))
        extra.append(
            subprocess.Popen([py, str(folder / "fake.py"), str(lib), "0", s, "a." * 24576], **kw)
        )
    procs = [
        *(extra if getattr(args, "threads_first", False) else []),
        *(
            subprocess.Popen([py, "-c", f"import time; time.sleep({s})", tag, *big], **kw)
            for _ in range(args.big)
        ),
        *(
            subprocess.Popen([py, str(folder / "maps.py"), "30000", s, tag], **kw)
            for _ in range(args.maps)
        ),
        *(_fake(folder, fake_s) for _ in range(args.fake)),
    ]
    # started last, they have the highest pids: watch takes new jobs by pid, so with
    # --max-jobs 8 the 1,500-thread job is watched only when started first (--threads-first)
    return procs if getattr(args, "threads_first", False) else procs + extra


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict:
    """One /metrics scrape: its bytes, series and jobs shown; {} when it did not answer."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    except OSError:
        return {}
    lines = [ln for ln in text.decode(errors="replace").splitlines() if ln and ln[0] != "#"]
    jobs = sum(1 for ln in lines if ln.startswith("gpudiag_job_info"))
    return {"bytes": len(text), "series": len(lines), "jobs": jobs}


def _cpu_rss(p: psutil.Process) -> tuple[float, int]:
    """CPU seconds (with reaped and live children) and resident bytes (with live children)."""
    t = p.cpu_times()
    cpu, rss = t.user + t.system + t.children_user + t.children_system, p.memory_info().rss
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            cpu, rss = cpu + ct.user + ct.system, rss + c.memory_info().rss
        except psutil.Error:
            pass
    return cpu, rss


KINDS = ("light job", "1,500 threads", "dotted argv", "fake job")


def _kind_of(job: subprocess.Popen, others: list[subprocess.Popen]) -> dict[int, str]:
    """Each watched-looking process's kind, by pid (what py-spy's --pid names)."""
    kinds = {job.pid: "light job"}
    for p in others:
        args = p.args if isinstance(p.args, list) else []
        if len(args) > 3 and str(args[1]).endswith("fake.py"):
            kinds[p.pid] = "1,500 threads" if args[3] == "1500" else "fake job"
            if len(args) > 5:
                kinds[p.pid] = "dotted argv"
    return kinds


class ByThread:
    """gpudiag's own CPU after the settle time by thread name (--by-thread): each thread's
    CPU from /proc/PID/task/TID/stat at every look, named by a `py-spy dump --nonblocking`
    of watch every 10 s (threads are named per probe: gpudiag-process, gpudiag-stacks...;
    summed over the sessions). No sampler runs beside it, so the figures are CPU, not
    shares of samples."""

    def __init__(self, watch_pid: int, settle: float) -> None:
        self.pid, self.settle, self.t0 = watch_pid, settle, time.monotonic()
        self.base: dict[str, float] = {}  # tid -> CPU s at the settle time (0: born after)
        self.now: dict[str, float] = {}
        self.names: dict[str, str] = {}
        self.next_dump, self.t_settled = self.t0 + settle, 0.0
        self.spy = str(Path(sys.executable).parent / "py-spy")

    def _cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[tid] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, ValueError, IndexError):
                continue
        return out

    def look(self) -> None:
        now = time.monotonic()
        cpu = self._cpu()
        if now - self.t0 < self.settle:
            return
        if not self.t_settled:
            self.t_settled, self.base = now, dict(cpu)
        self.now.update(cpu)
        if now >= self.next_dump:
            self.next_dump = now + 10
            cmd = [self.spy, "dump", "--pid", str(self.pid), "--nonblocking"]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            for ln in out.splitlines():
                if ln.startswith("Thread ") and '"' in ln:
                    self.names[ln.split()[1]] = ln.split('"')[1]

    def split(self) -> dict[str, float]:
        """Cores by thread name over the settled part, largest first."""
        span = time.monotonic() - self.t_settled if self.t_settled else 0.0
        by: dict[str, float] = {}
        for tid, cpu in self.now.items():
            name = self.names.get(tid, "unnamed (ended before a dump)")
            by[name] = by.get(name, 0.0) + cpu - self.base.get(tid, 0.0)
        if span <= 0:
            return {}
        return {k: round(v / span, 4) for k, v in sorted(by.items(), key=lambda x: -x[1])}


class Where:
    """Where watch's CPU goes (--where): each py-spy child's CPU by the kind of process it
    reads (its last reading before it ended: up to one look late), and gpudiag's own
    Python threads by what they run, from a py-spy of its own (not watch's child) at 20 Hz,
    busy samples only."""

    def __init__(self, watch_pid: int, seconds: float, out: Path) -> None:
        self.watch_pid, self.out = watch_pid, out
        self.kids: dict[int, tuple[int, str, float]] = {}
        spy = str(Path(sys.executable).parent / "py-spy")
        self.spy = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(watch_pid),
                "--rate",
                "20",
                "--format",
                "raw",
                "--duration",
                str(max(1, round(seconds))),
                "--output",
                str(out),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def look(self) -> None:
        """Each live py-spy child's target, mode and CPU so far."""
        try:
            kids = psutil.Process(self.watch_pid).children(recursive=True)
        except psutil.Error:
            return
        for c in kids:
            try:
                args, t = c.cmdline(), c.cpu_times()
            except psutil.Error:
                continue
            if "--pid" not in args:
                continue
            target = int(args[args.index("--pid") + 1])
            mode = "gil" if "--gil" in args else "all" if "--idle" in args else args[1]
            self.kids[c.pid] = (target, mode, t.user + t.system)

    def split(self, kinds: dict[int, str], wall: float) -> dict:
        """py-spy cores by kind and mode; gpudiag's own busy samples by what ran."""
        spy: dict[str, float] = {}
        for target, mode, cpu in self.kids.values():
            key = f"{kinds.get(target, 'other')} {mode}"
            spy[key] = spy.get(key, 0.0) + cpu / wall
        try:
            self.spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.spy.kill()
        own: dict[str, int] = {}
        try:
            lines = self.out.read_text().splitlines()
        except OSError:
            lines = []
        inner: dict[str, int] = {}
        for ln in lines:
            stack, _, n = ln.rpartition(" ")
            own[_what(stack)] = own.get(_what(stack), 0) + int(n or 0)
            top = _innermost(stack)
            inner[top] = inner.get(top, 0) + int(n or 0)
        total = sum(own.values()) or 1
        return {
            "py_spy_cores": {k: round(v, 4) for k, v in sorted(spy.items(), key=lambda x: -x[1])},
            "own_busy_share": {
                k: round(v / total, 3) for k, v in sorted(own.items(), key=lambda x: -x[1])[:12]
            },
            "own_busy_innermost": {
                k: round(v / total, 3) for k, v in sorted(inner.items(), key=lambda x: -x[1])[:12]
            },
        }


OWN_PARTS = (
    ("probes/host/process", "process probe"),
    ("probes/stacks/", "stack probe (parse, start py-spy)"),
    ("probes/host/discovery", "discovery"),
    ("probes/host/", "host probe"),
    ("probes/servers/connections", "conns probe"),
    ("probes/servers/triton", "triton probe"),
    ("probes/inprocess/", "hooks probe"),
    ("probes/gpu/", "gpu probe"),
    ("probes/", "other probes"),
    ("session/budget", "governor"),
    ("agent/commands/watch", "watch's poll"),
    ("fleet/metrics", "metrics/accounting"),
    ("timeline/", "timeline (samples kept)"),
    ("analyzers/", "analysis"),
    ("session/", "session"),
)


def _innermost(stack: str) -> str:
    """The innermost gpudiag frame of a busy stack, and the frame it called (by name)."""
    frames = stack.split(";")
    for i in range(len(frames) - 1, -1, -1):
        if "gpudiag" in frames[i] or "/work/" in frames[i]:
            callee = frames[i + 1].split(" (")[0] if i + 1 < len(frames) else ""
            return f"{frames[i].split(':')[0][-60:]} -> {callee}"
    return frames[-1][:60]


def _what(stack: str) -> str:
    """The part of gpudiag a busy stack (outermost first) is in: its innermost gpudiag
    part."""
    frames = stack.split(";")
    for frame in reversed(frames):
        for key, name in OWN_PARTS:
            if key in frame:
                return f"{name} ({frame.split(' (')[0]})" if name == "session" else name
    return frames[1].split(" (")[0] if len(frames) > 1 else stack[:40]


def _watched(lines: list[str], kinds: dict[int, str]) -> dict[str, int]:
    """How many sessions watch started on each kind of process."""
    out: dict[str, int] = {}
    for ln in lines:
        if "watching pid" in ln:
            pid = int(ln.split("watching pid ", 1)[1].split()[0])
            kind = kinds.get(pid, "fake job")  # a respawned one that ended
            out[kind] = out.get(kind, 0) + 1
    return out


def _respawn(folder: Path, procs: list[subprocess.Popen], seconds: float) -> int:
    """Replace each ended fake job by a new one; how many were started."""
    fake = str(folder / "fake.py")
    started = 0
    for i, p in enumerate(procs):
        if isinstance(p.args, list) and fake in p.args and p.poll() is not None:
            procs[i] = _fake(folder, seconds)
            started += 1
    return started


class Follow:
    """What one watch costs as it runs: peak RSS, its CPU now and after the settle time, and
    its /metrics scraped every 15 s."""

    def __init__(self, proc: psutil.Process, port: int, args: argparse.Namespace) -> None:
        self.proc, self.port, self.args = proc, port, args
        self.t0 = time.monotonic()
        self.peak, self.own, self.respawned = 0, 0.0, 0
        self.settled: tuple[float, float, float] | None = None  # (time, CPU, own CPU)
        self.last: tuple[float, float, float] | None = None
        self.scrape: dict = {}
        self.next_scrape = self.t0 + 15

    def look(self) -> None:
        now = time.monotonic()
        try:
            cpu, rss = _cpu_rss(self.proc)
            self.own = sum(self.proc.cpu_times()[:2])  # gpudiag itself
            self.peak, self.last = max(self.peak, rss), (now, cpu, self.own)
            if self.settled is None and now - self.t0 >= self.args.settle:
                self.settled = self.last
        except psutil.Error:
            pass
        if now >= self.next_scrape and now - self.t0 < self.args.seconds - 2:
            self.next_scrape += 15  # as Prometheus would
            self.scrape = _scrape(self.port) or self.scrape

    def steady(self) -> tuple[float | None, float | None]:
        """CPU cores (with children, and gpudiag's own) from the settle time to the end."""
        a, b = self.settled, self.last
        if a is None or b is None or b[0] - a[0] <= 1.0:
            return None, None
        return (b[1] - a[1]) / (b[0] - a[0]), (b[2] - a[2]) / (b[0] - a[0])


def measure(hostile: bool, args: argparse.Namespace, python: str = sys.executable) -> dict:
    """One watch of `args.seconds` over the light job, with or without the hostile set, by
    `python`'s gpudiag."""
    folder = Path(tempfile.mkdtemp(prefix="gpudiag-hostile-bench-"))
    folder.chmod(0o755)
    shutil.copy(HERE / "light_job.py", folder / "watched_job.py")
    life = args.seconds + 90
    job = subprocess.Popen(
        [sys.executable, str(folder / "watched_job.py"), "--seconds", str(life)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    others = _hostile(folder, args, life) if hostile else []
    time.sleep(args.setup)  # imports done, mappings made
    port = _port()
    cmd = [python, "-m", "gpudiag.agent.cli.main", "watch", "--match", str(folder)]
    cmd += ["--duration", str(args.seconds), "--metrics-port", str(port)]
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would stop watch
    watch = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    where = Where(watch.pid, args.seconds, folder.with_suffix(".where")) if args.where else None
    by_thread = ByThread(watch.pid, args.settle) if args.by_thread else None
    follow = Follow(psutil.Process(watch.pid), port, args)
    try:
        while True:
            pid, status, usage = os.wait4(watch.pid, os.WNOHANG)
            if pid:
                break
            if args.short and others:
                follow.respawned += _respawn(folder, others, args.short)
            follow.look()
            if where is not None:
                where.look()
            if by_thread is not None:
                by_thread.look()
            time.sleep(0.25 if where is not None else 0.5)
        wall = time.monotonic() - follow.t0
        log.seek(0)
        err = log.read()
        kinds = _kind_of(job, others)
        split = where.split(kinds, wall) if where is not None else None
    finally:
        for p in [job, *others]:
            p.kill()
            p.wait()
        shutil.rmtree(folder, ignore_errors=True)
        folder.with_suffix(".where").unlink(missing_ok=True)
    cpu = usage.ru_utime + usage.ru_stime  # gpudiag and every child it reaped (py-spy)
    lines = err.splitlines()
    if args.log:
        with open(args.log, "a") as f:
            f.write(f"==== {'hostile' if hostile else 'quiet'} arm, {python}\n{err}")
    steady, own_steady = follow.steady()
    return {
        "arm": "hostile" if hostile else "quiet",
        "processes": 1 + len(others) + follow.respawned,
        "sessions_started": sum(1 for ln in lines if "watching pid" in ln),
        "deferred_lines": [ln for ln in lines if "deferred" in ln][-2:],
        "seconds": round(wall, 1),
        "cpu_cores": round(cpu / wall, 4),
        "own_cpu_cores": round(follow.own / wall, 4),  # the rest: py-spy
        # after --settle seconds (start-up and the first sessions' starts left out)
        "steady_cpu_cores": None if steady is None else round(steady, 4),
        "steady_own_cpu_cores": None if own_steady is None else round(own_steady, 4),
        "scrape": follow.scrape,
        "peak_rss_mb": round(follow.peak / 2**20, 1),
        "exit_status": os.waitstatus_to_exitcode(status),
        "stderr_tail": [ln for ln in lines if "Traceback" in ln or "rror" in ln][-3:],
        **({"where": split} if split is not None else {}),
        **({"own_steady_by_thread": by_thread.split()} if by_thread is not None else {}),
        "watched": _watched(lines, kinds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0, help="each watch this long")
    ap.add_argument("--setup", type=float, default=15.0, help="seconds before watch starts")
    ap.add_argument(
        "--settle", type=float, default=20.0, help="steady CPU: from this many seconds on"
    )
    ap.add_argument(
        "--threads-first",
        action="store_true",
        help="the hostile arms' 1,500-thread and dotted-argv jobs start first (lowest pids: "
        "watched among the first 8; else they start last and are not watched)",
    )
    ap.add_argument("--big", type=int, default=30, help="X04: 1.8 MB command lines")
    ap.add_argument("--maps", type=int, default=20, help="X05: 30,000 mappings each")
    ap.add_argument("--fake", type=int, default=24, help="N27: idle 'jobs' with libtorch")
    ap.add_argument(
        "--parts",
        nargs="*",
        default=[],
        choices=["big", "maps", "fake"],
        help="also each hostile kind alone",
    )
    ap.add_argument(
        "--short", type=float, default=0.0, help="each fake job lives this long, then a new one"
    )
    ap.add_argument("--before", metavar="PYTHON", help="also the hostile arm by its gpudiag")
    ap.add_argument(
        "--where", action="store_true", help="split watch's CPU: py-spy by target, its own by part"
    )
    ap.add_argument(
        "--by-thread", action="store_true", help="gpudiag's own steady CPU by thread name"
    )
    ap.add_argument("--log", help="append each arm's watch log to this file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load = open("/proc/loadavg").read().split()[:3]
    rows = [measure(False, args), measure(True, args)]
    if args.before:
        rows.append({**measure(True, args, args.before), "arm": "before"})
    for part in args.parts:  # one hostile kind at a time (the others at 0)
        one = argparse.Namespace(**{**vars(args), "big": 0, "maps": 0, "fake": 0})
        setattr(one, part, getattr(args, part))
        one.extra = part == "fake"
        rows.append({**measure(True, one), "arm": f"only {part}"})
    ratio = {
        "cpu": round(rows[1]["cpu_cores"] / rows[0]["cpu_cores"], 2)
        if rows[0]["cpu_cores"]
        else None,
        "steady_cpu": round(rows[1]["steady_cpu_cores"] / rows[0]["steady_cpu_cores"], 2)
        if rows[0]["steady_cpu_cores"] and rows[1]["steady_cpu_cores"]
        else None,
        "rss": round(rows[1]["peak_rss_mb"] / rows[0]["peak_rss_mb"], 2)
        if rows[0]["peak_rss_mb"]
        else None,
    }
    load_after = open("/proc/loadavg").read().split()[:3]
    out = {
        "load_before": load,
        "load_after": load_after,
        "rows": rows,
        "hostile_over_quiet": ratio,
        "budget": {"cpu_cores": 0.10, "rss_mb": 400},
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"load before {' '.join(load)}, after {' '.join(load_after)}")
    print(
        f"arm         processes  seconds  CPU cores  own CPU  steady (after {args.settle:.0f} s)"
        "  steady own  peak RSS MB  sessions  exit"
    )
    nan = float("nan")
    for r in rows:
        print(
            f"{r['arm']:<11} {r['processes']:>9}  {r['seconds']:>7}  {r['cpu_cores']:>9.4f}"
            f"  {r['own_cpu_cores']:>7.4f}  {r['steady_cpu_cores'] or nan:>19.4f}"
            f"  {r['steady_own_cpu_cores'] or nan:>10.4f}  {r['peak_rss_mb']:>11.1f}"
            f"  {r['sessions_started']:>8}  {r['exit_status']}"
        )
        print(f"    sessions by kind: {r['watched']}; last scrape: {r['scrape']}")
        for line in r["deferred_lines"] + r["stderr_tail"]:
            print(f"    {line[:200]}")
        if "where" in r:
            print(f"    py-spy cores by target: {r['where']['py_spy_cores']}")
            print(f"    gpudiag's own busy samples: {r['where']['own_busy_share']}")
        if "own_steady_by_thread" in r:
            top = list(r["own_steady_by_thread"].items())[:10]
            print(f"    gpudiag's own steady cores by thread: {dict(top)}")
    print(
        f"hostile/quiet: CPU x{ratio['cpu']} (steady x{ratio['steady_cpu']}), RSS x{ratio['rss']}"
        " (budget 0.10 cores, 400 MB)"
    )


if __name__ == "__main__":
    main()
