"""A synthetic long recording of an eight-GPU training job, at gpudiag's default rates.

Writes what `gpudiag run --record` would write for a job on a big box (64 cores, 8 GPUs,
a 12-thread loop process with 8 DataLoader workers), healthy at first and starved by its
input pipeline from `--starved-after-h` on: host (1 Hz, per core), process (threads every
0.2 s, the workers' aggregate every 1 s), stacks (a py-spy window every 3 s: loop process
at 100 Hz, GIL at 25 Hz, one worker in turn), GPU (8 devices, 1 Hz) and hook rows (steps,
CUDA memory). The rates are the configured maxima; the budget governor only lowers them.

    python benchmarks/synthetic_recording.py --hours 24 --out /tmp/day.jsonl.gz --replay

Prints the rows written and the file's size; with `--replay`, then times `gpudiag replay` of
it (wall and CPU seconds, peak RSS) and prints its top finding. `--max-mb` applies the
recorder's rotation (default: off, to measure a whole day's size).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

from gpudiag.agent.output.recording import Recorder
from gpudiag.probes.base import Sample

LIB = "/opt/venv/lib/python3.11/site-packages"
TRAIN = "/work/train.py"
PID, CORES, GPUS, WORKERS, THREADS = 4242, 64, 8, 8, 12
LOOP_TID = PID

HEALTHY = [  # loop thread stack (leaf last), share of samples
    (
        (
            "main (/work/train.py:80)",
            f"Module._call_impl ({LIB}/torch/nn/modules/module.py:1747)",
            "Net.forward (/work/train.py:40)",
        ),
        0.35,
    ),
    (
        (
            "main (/work/train.py:82)",
            f"Tensor.backward ({LIB}/torch/_tensor.py:626)",
            f"backward ({LIB}/torch/autograd/__init__.py:347)",
        ),
        0.40,
    ),
    (("main (/work/train.py:83)", f"SGD.step ({LIB}/torch/optim/sgd.py:120)"), 0.15),
    (
        (
            "main (/work/train.py:78)",
            f"_BaseDataLoaderIter.__next__ ({LIB}/torch/utils/data/dataloader.py:733)",
            f"Queue.get ({LIB}/../multiprocessing/queues.py:113)",
        ),
        0.10,
    ),
]
STARVED = [
    (HEALTHY[0][0], 0.12),
    (HEALTHY[1][0], 0.15),
    (HEALTHY[2][0], 0.05),
    (HEALTHY[3][0], 0.68),
]
WORKER = [
    (
        (
            f"_worker_loop ({LIB}/torch/utils/data/_utils/worker.py:349)",
            f"fetch ({LIB}/torch/utils/data/_utils/fetch.py:52)",
            "Images.__getitem__ (/work/train.py:20)",
            "decode (/work/train.py:12)",
        ),
        0.8,
    ),
    (
        (
            f"_worker_loop ({LIB}/torch/utils/data/_utils/worker.py:309)",
            f"Queue.get ({LIB}/../multiprocessing/queues.py:113)",
        ),
        0.2,
    ),
]


def _frames(stack: tuple[str, ...], tid: int, name: str) -> str:
    return ";".join((f"thread ({tid}): {name} (:0)",) + stack)


def _split(
    total: int, mix: list[tuple[tuple[str, ...], float]], rng: random.Random
) -> list[tuple[tuple[str, ...], int]]:
    out = []
    for stack, share in mix:
        n = max(0, round(total * share + rng.gauss(0, 2)))
        if n:
            out.append((stack, n))
    return out


def second(t: float, rng: random.Random, starved: bool, n: int) -> list[Sample]:
    """The rows of one second of the run."""
    ns = int(t * 1e9)
    rows: list[Sample] = []
    busy = 0.35 if starved else 0.7
    for c in range(CORES):
        rows.append(Sample("host", ns, {"cpu": str(c)}, {"core_util": rng.uniform(0.2, 0.9)}))
    rows.append(
        Sample(
            "host",
            ns,
            {},
            {
                "cpu_count": float(CORES),
                "cpu_util": busy * rng.uniform(0.9, 1.1),
                "cpu_iowait": rng.uniform(0, 0.02),
                "mem_available_bytes": rng.uniform(3.9e11, 4.1e11),
                "mem_total_bytes": 1e12,
                "swap_in_bytes_per_s": 0.0,
                "swap_out_bytes_per_s": 0.0,
                "psi_cpu_some": 0.05,
                "psi_io_some": 0.01,
                "psi_memory_some": 0.0,
            },
        )
    )
    for k in range(5):  # process probe every 0.2 s
        tk = ns + k * 200_000_000
        for j in range(THREADS):
            tid = PID + j
            rows.append(
                Sample(
                    "process",
                    tk,
                    {"scope": "thread", "tid": str(tid), "comm": "python" if j == 0 else f"pt_{j}"},
                    {
                        "running": 1.0 if j == 0 and rng.random() < 0.6 else 0.0,
                        "d_state": 0.0,
                        "cpu": rng.uniform(0.5, 0.7) if j == 0 else rng.uniform(0, 0.02),
                        "runqueue_wait": rng.uniform(0, 0.04),
                    },
                )
            )
        rows.append(
            Sample(
                "process",
                tk,
                {"scope": "target"},
                {
                    "procs": 1.0,
                    "threads": float(THREADS),
                    "cpu_cores": rng.uniform(0.8, 1.0),
                    "rss_bytes": float(9_000_000_000 + rng.randrange(10_000_000)),
                    "read_bytes_per_s": 0.0,
                    "ctx_voluntary_per_s": rng.uniform(400, 600),
                    "ctx_involuntary_per_s": rng.uniform(10, 30),
                    "d_state_share": 0.0,
                    "running_share": 0.1,
                },
            )
        )
    rows.append(
        Sample(
            "process",
            ns,
            {"scope": "workers"},
            {
                "procs": float(WORKERS),
                "threads": float(WORKERS * 2),
                "cpu_cores": 7.5 if starved else 4.0,
                "rss_bytes": 2e10,
                "read_bytes_per_s": 3e8,
                "ctx_voluntary_per_s": 900.0,
                "ctx_involuntary_per_s": 50.0,
                "d_state_share": 0.0,
                "running_share": 0.8,
            },
        )
    )
    for g in range(GPUS):
        util = (0.35 if starved else 0.93) + rng.uniform(-0.03, 0.03)
        rows.append(
            Sample(
                "gpu",
                ns,
                {"gpu": str(g), "uuid": f"GPU-{g:08d}-0000", "name": "NVIDIA H100 80GB HBM3"},
                {
                    "lost": 0.0,
                    "util_gpu": util,
                    "util_mem": util * 0.5,
                    "mem_used_bytes": float(60_000_000_000 + rng.randrange(10**8)),
                    "mem_total_bytes": 8.5e10,
                    "pcie_gen": 5.0,
                    "pcie_gen_max": 5.0,
                    "pcie_width": 16.0,
                    "pcie_width_max": 16.0,
                    "sm_clock_mhz": 1980.0,
                    "sm_clock_max_mhz": 1980.0,
                    "mem_clock_mhz": 2619.0,
                    "mem_clock_max_mhz": 2619.0,
                    "temperature_c": float(rng.randint(58, 66)),
                    "power_w": 300 + 350 * util + rng.uniform(-20, 20),
                    "power_limit_w": 700.0,
                    "ecc_uncorrected": 0.0,
                    "pcie_tx_bytes_per_s": rng.uniform(4e8, 6e8),
                    "pcie_rx_bytes_per_s": rng.uniform(1.5e9, 2.5e9),
                    "throttle_power_cap": 0.0,
                    "throttle_hw_slowdown": 0.0,
                    "throttle_sw_thermal": 0.0,
                    "throttle_hw_thermal": 0.0,
                    "throttle_power_brake": 0.0,
                    "job_on_device": 1.0,
                    "foreign_procs": 0.0,
                    "job_mem_bytes": 5.8e10,
                    "job_sm_util": util * rng.uniform(0.95, 1.0),
                    "job_uses_gpu": 1.0,
                    "gpm_sm_active": util * 0.6,
                    "gpm_sm_occupancy": util * 0.3,
                    "gpm_tensor_active": util * 0.4,
                    "gpm_dram_bw": util * 0.5,
                },
            )
        )
    step_s = 0.5 if starved else 0.2
    for k in range(int(1 / step_s)):
        rows.append(
            Sample(
                "hooks",
                ns + int(k * step_s * 1e9),
                {"kind": "step"},
                {
                    "step_time_s": step_s * rng.uniform(0.95, 1.05),
                    "data_wait_s": step_s * (0.6 if starved else 0.02),
                    "batch_size": 256.0,
                    "h2d_copy_s": 0.004,
                    "h2d_pinned": 1.0,
                    "h2d_pageable": 0.0,
                    "syncs": 1.0,
                    "sync_time_s": 0.001,
                },
            )
        )
    if n % 2 == 0:
        rows.append(
            Sample(
                "hooks",
                ns,
                {"kind": "cuda_mem"},
                {
                    "allocated": 5e10,
                    "reserved": 5.6e10,
                    "peak": 5.7e10,
                    "alloc_retries": 0.0,
                    "inactive_split": 1e9,
                },
            )
        )
    if n % 3 == 2:
        rows.extend(window(ns, rng, starved, n // 3))
    return rows


def window(ns: int, rng: random.Random, starved: bool, w: int) -> list[Sample]:
    """One 3-second py-spy window: loop process, GIL holders and one worker in turn."""
    rows = []
    mix = STARVED if starved else HEALTHY
    for stack, count in _split(300, mix, rng):
        rows.append(_stack("all", LOOP_TID, "MainThread", stack, count, "target"))
    for j in range(1, THREADS):  # idle helper threads, every tick
        rows.append(
            _stack("all", PID + j, f"pt_{j}", (f"_wait ({LIB}/threading.py:324)",), 300, "target")
        )
    for stack, count in _split(75, mix[:3], rng):
        rows.append(_stack("gil", LOOP_TID, "MainThread", stack, count, "target"))
    worker = 5000 + w % WORKERS
    weight = WORKERS * 100 / 20
    for stack, count in _split(60, WORKER, rng):
        s = _stack("all", worker, "MainThread", stack, count * weight, "worker")
        s.values["weight"] = weight
        rows.append(s)
    rows.append(
        Sample(
            "stacks",
            ns,
            {
                "mode": "all",
                "kind": "episode",
                "pid": str(PID),
                "tid": str(LOOP_TID),
                "thread": "MainThread",
                "anchor": _frames(HEALTHY[1][0][:2], LOOP_TID, "MainThread"),
            },
            {"episodes": 15.0, "count": 120.0},
        )
    )
    for mode, rate in (("all", 100.0), ("gil", 25.0)):
        rows.append(
            Sample(
                "stacks",
                ns,
                {"mode": mode, "kind": "window"},
                {"ticks": 3 * rate, "duration_s": 3.0, "rate_hz": rate, "errors": 0.0},
            )
        )
    rows.append(
        Sample(
            "stacks",
            ns,
            {"mode": "workers", "kind": "window"},
            {
                "duration_s": 3.0,
                "rate_hz": 20.0,
                "workers": float(WORKERS),
                "recorded": 1.0,
                "weight": weight,
            },
        )
    )
    return rows


def _stack(
    mode: str, tid: int, thread: str, stack: tuple[str, ...], count: float, role: str
) -> Sample:
    pid = PID if role == "target" else tid
    return Sample(
        "stacks",
        0,
        {
            "mode": mode,
            "kind": "stack",
            "pid": str(pid),
            "tid": str(tid),
            "thread": thread,
            "role": role,
            "stack": _frames(stack, tid, thread),
            "code": "",
        },
        {"count": float(count)},
    )


def time_replay(path: str) -> None:
    """Replay the recording in a child process; print its wall and CPU time and peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "gpudiag.agent.cli.main", "replay", path, "--format", "json"],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if res.returncode != 0:
        sys.exit(f"replay failed: {res.stderr.strip()}")
    doc = json.loads(res.stdout.split("\nReport written")[0])
    top = doc["findings"][0]["id"] if doc["findings"] else "none"
    print(
        f"replay: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {after.ru_maxrss / 1024:.0f} MB; "
        f"top finding {top}; periods {len(doc.get('periods') or [])}"
    )


def main() -> None:
    """Write the recording; print rows, size and how long writing took."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--starved-after-h", type=float, default=20.0)
    ap.add_argument("--out", default="synthetic-day.jsonl.gz")
    ap.add_argument(
        "--max-mb",
        type=float,
        default=None,
        help="rotate like `--record-max-mb` (default: keep everything)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--layout", choices=("windows", "samples"), default="windows", help="as --record-layout"
    )
    ap.add_argument("--replay", action="store_true", help="then time `gpudiag replay` of it")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = 1.8e9
    header = {
        "environment": {
            "host": "synthetic-8xH100",
            "cpu_count": CORES,
            "python": "3.11.7",
            "torch": "2.13.0",
            "driver": "570.0",
            "gpus": [
                {
                    "index": g,
                    "name": "NVIDIA H100 80GB HBM3",
                    "uuid": f"GPU-{g:08d}-0000",
                    "memory_total_bytes": 8.5e10,
                }
                for g in range(GPUS)
            ],
        },
        "run": {"mode": "attach", "command": ["python", TRAIN], "pid": PID},
    }
    max_bytes = int(args.max_mb * 2**20) if args.max_mb else None
    rec = Recorder(args.out, header, max_bytes=max_bytes, layout=args.layout)
    started = time.monotonic()
    rows = 0
    seconds = int(args.hours * 3600)
    for n in range(seconds):
        t = t0 + n
        batch = second(t, rng, n >= args.starved_after_h * 3600, n)
        for i, s in enumerate(batch):
            if s.t_ns == 0:  # stack rows carry their window's time
                batch[i] = Sample(s.probe, int(t * 1e9), s.labels, s.values)
        rec.write(batch)
        rows += len(batch)
        if n and n % 3600 == 0:
            print(
                f"{n / 3600:.0f} h: {rows:,} rows, {os.path.getsize(args.out) / 2**20:.0f} MiB",
                flush=True,
            )
    rec.close(
        {
            "probes": [
                {"name": p, "available": True, "reason": None, "hint": None}
                for p in ("host", "process", "stacks", "gpu", "hooks")
            ],
            "errors": [],
            "end_reason": "interrupted",
            "exit_code": None,
            "start": t0,
            "end": t0 + seconds,
            "environment": header["environment"],
        }
    )
    size = os.path.getsize(args.out) + (os.path.getsize(args.out + ".1") if rec.rotations else 0)
    print(
        f"{args.hours:g} h, {rows:,} rows ({rows / max(1, seconds):.0f}/s), "
        f"{size / 2**20:.1f} MiB on disk ({size / max(1, seconds) * 86400 / 2**30:.2f} GiB "
        f"a day), {rec.rotations} rotations, written in {time.monotonic() - started:.0f} s"
    )
    if args.replay:
        time_replay(args.out)


if __name__ == "__main__":
    main()
