"""One look at a planted model server (tests/workloads/serve_*.py) under its load generator:
gpudiag's requests/s and p50/p95 against the client's, and the findings, with the box's load.

`--how run`: `gpudiag run --duration LOOK` on the server, the load (--clients, 4) started as the
server listens. `--how hooks`: the server started bare, `gpudiag attach PID --hooks` once it
listens, the load started once gpudiag has attached (both ends count the same requests).
`--how instrument`: the same, the server started with `--instrument` (it calls instrument()),
attached without `--hooks`. `--how stacks`: `attach` without the hooks, the load through
the look (estimates only).

    python benchmarks/serve_look.py serve_tornado.py --how run [--look 14 --load 10] [-- ARGS]
    python benchmarks/serve_look.py serve_bentoml.py --rows --how hooks --clients 6 --look 24
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
CLI = [sys.executable, "-m", "gpudiag.agent.cli.main"]
ROWS: list[str] = []  # ["--rows"] for a server whose API takes rows (serve_bentoml.py)


def _wait(path: Path, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.stat().st_size:
            return
        time.sleep(0.1)
    raise SystemExit(f"no {what} after {timeout:.0f} s")


def _load(port: Path, out: Path, seconds: float, clients: int = 4) -> subprocess.Popen:
    gen = [sys.executable, str(WORKLOADS / "load_gen.py"), "--port-file", str(port), *ROWS]
    with open(out, "w") as f:
        return subprocess.Popen(
            [*gen, "--clients", str(clients), "--seconds", str(seconds), "--procs"], stdout=f
        )


def stop_tree(job: subprocess.Popen, grace_s: float = 15.0) -> None:
    """The server stopped as Ctrl-C stops it, then its process group and every descendant
    killed (BentoML's workers run in sessions of their own and outlive a killed arbiter)."""
    import psutil

    try:
        kids = psutil.Process(job.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    job.send_signal(signal.SIGINT)
    try:
        job.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass
    job.wait()


def look(
    script: str, how: str, look_s: float, load_s: float, extra: list[str], clients: int = 4
) -> dict:
    """Run one look; gpudiag's report and the client's last line."""
    tmp = Path(tempfile.mkdtemp(prefix="serve-look-"))
    port, report, client = tmp / "port", tmp / "r.json", tmp / "client.txt"
    server = [sys.executable, str(WORKLOADS / script), "--port-file", str(port), *extra]
    if how == "run":
        serve_s = str(look_s + 15)
        agent = subprocess.Popen(
            [*CLI, "run", "-q", "--duration", str(look_s), "--out", str(report), "--",
             *server, "--seconds", serve_s],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait(port, "port")
        _load(port, client, load_s, clients).wait()
        agent.wait()
    else:
        flags = ["--instrument"] if how == "instrument" else []
        # its own process group: a server's workers (LitServe's) are stopped with it
        job = subprocess.Popen(
            [*server, "--seconds", str(look_s + 40), *flags], start_new_session=True
        )
        _wait(port, "port")
        err = tmp / "err"
        hooks = ["--hooks"] if how == "hooks" else []
        with open(err, "w") as f:
            agent = subprocess.Popen(
                [*CLI, "attach", str(job.pid), "--duration", str(look_s), "--out", str(report),
                 *hooks],
                stdout=subprocess.DEVNULL, stderr=f,
            )  # fmt: skip
        deadline = time.time() + 60
        while how != "stacks" and "attached to pid" not in err.read_text():
            if time.time() > deadline:
                raise SystemExit(f"gpudiag did not attach: {err.read_text()[-300:]}")
            time.sleep(0.1)
        _load(port, client, load_s, clients).wait()
        agent.wait()
        stop_tree(job)
    doc = json.loads(report.read_text())
    return {"doc": doc, "client": " | ".join(client.read_text().strip().splitlines())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("script", help="a server in tests/workloads, e.g. serve_tornado.py")
    p.add_argument("--how", choices=("run", "hooks", "instrument", "stacks"), default="run")
    p.add_argument("--look", type=float, default=14.0, help="gpudiag's look, s (default 14)")
    p.add_argument("--load", type=float, default=10.0, help="the clients' seconds (default 10)")
    p.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--rows", action="store_true", help="load_gen.py --rows (serve_bentoml.py)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = p.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: the server's flags
    ROWS[:] = ["--rows"] if args.rows else []
    before = os.getloadavg()[0]
    got = look(args.script, args.how, args.look, args.load, extra, args.clients)
    m, doc = got["doc"]["metrics"], got["doc"]
    p50, p95 = m.get("request_latency_p50_s"), m.get("request_latency_p95_s")
    lat = f"{p50 * 1e3:.1f} / {p95 * 1e3:.1f} ms" if p50 and p95 else "-"
    rate = m.get("requests_per_second")
    print(f"load {before:.1f}-{os.getloadavg()[0]:.1f}  {got['client']}")
    print(
        f"gpudiag: kind {doc['workload']['kind']}, "
        f"{'-' if rate is None else f'{rate:.1f}'} req/s, p50 / p95 {lat}, "
        f"findings {[f['id'] for f in doc['findings'] if f['severity'] != 'note']}"
    )
    if args.how == "stacks":  # what the stacks alone read: their estimates and the verdict
        est = ("requests_in_flight_est", "handler_forward_share", "pool_forward_est")
        print("stacks:", ", ".join(f"{k} {m[k]:.3f}" for k in est if m.get(k) is not None))
        for f in doc["findings"]:
            if f["severity"] != "note":
                print(f"  {f['id']} {f['confidence']:.0%}: {f['speedup_basis']}"[:400])
        print("verdict:", doc["verdict"]["statement"][:600])
    return 0


if __name__ == "__main__":
    sys.exit(main())
