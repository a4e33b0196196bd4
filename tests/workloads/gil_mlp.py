"""GIL contention on a small CPU MLP loop (batch 16, 64 wide) from competing Python threads.

--kind dict: pure-Python dict-update loops; log: a logging/metrics thread formatting records;
pool: a ThreadPoolExecutor doing Python preprocessing; sleep: threads that sleep (healthy);
native: threads in native code that releases the GIL (healthy). --competitors 1-8.
"""

import argparse
import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


def dict_loop(stop: threading.Event) -> None:
    """A metrics aggregator in pure Python: dict updates, never releasing the GIL for long."""
    d: dict[int, int] = {}
    i = 0
    while not stop.is_set():
        d[i % 1000] = d.get(i % 1000, 0) + i
        i += 1


def log_loop(stop: threading.Event) -> None:
    """A logging/metrics thread: formats records and aggregates them in Python."""
    log = logging.getLogger(f"metrics.{threading.get_ident()}")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    stats: dict[str, float] = {}
    while not stop.is_set():
        for k in ("loss", "lr", "grad_norm", "tokens"):
            stats[k] = stats.get(k, 0.0) * 0.9 + 0.1 * len(k)
        log.info("step stats %s", ", ".join(f"{k}={v:.4f}" for k, v in stats.items()))


def preprocess(n: int) -> int:
    """Python preprocessing of one item (a tokenizer-like loop)."""
    words = ("the quick brown fox jumps over the lazy dog " * 20).split()
    vocab: dict[str, int] = {}
    return sum(vocab.setdefault(w, len(vocab)) for w in words * 5) + n


def pool_loop(stop: threading.Event, pool: ThreadPoolExecutor) -> None:
    """Feed a thread pool with Python preprocessing work."""
    while not stop.is_set():
        list(pool.map(preprocess, range(16)))


def sleep_loop(stop: threading.Event) -> None:
    """A healthy helper: wakes up, does a little, sleeps."""
    while not stop.is_set():
        time.sleep(0.05)


def native_loop(stop: threading.Event) -> None:
    """A healthy helper in native code that releases the GIL (hashing large buffers)."""
    buf = b"x" * (8 << 20)
    while not stop.is_set():
        hashlib.sha256(buf).digest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--competitors", type=int, default=3)
    p.add_argument("--kind", choices=("dict", "log", "pool", "sleep", "native"), default="dict")
    args = p.parse_args()
    torch.set_num_threads(1)
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=max(1, args.competitors), thread_name_prefix="prep")
    targets = {
        "dict": dict_loop,
        "log": log_loop,
        "sleep": sleep_loop,
        "native": native_loop,
    }
    model = nn.Sequential(
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    # one step before the helpers start: torch's lazy imports (torch._dynamo on the first
    # optimizer) would otherwise run under the contention and take most of a short look
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if args.kind == "pool":
        threading.Thread(target=pool_loop, args=(stop, pool), name="feeder", daemon=True).start()
    else:
        for i in range(args.competitors):
            threading.Thread(
                target=targets[args.kind], args=(stop,), name=f"{args.kind}-{i}", daemon=True
            ).start()
    t0 = time.time()
    steps = 0
    while time.time() - t0 < args.seconds:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    stop.set()
    pool.shutdown(wait=False)
    print(f"steps: {steps} in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
