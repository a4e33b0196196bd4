"""Shared pieces of the planted-bottleneck workloads: a small model and the training loop."""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn


def parse_args(description: str) -> argparse.Namespace:
    """--seconds (how long to train) and --threads (torch intra-op threads)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--data-delay",
        type=float,
        default=0.0,
        help="seconds added to every batch's loading (a planted slowdown)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    return args


def small_cnn(width: int = 16) -> nn.Module:
    """A tiny CNN for 3x32x32 inputs."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(width * 16, 10),
    )


def train(
    model: nn.Module,
    batches: Callable[[], Iterable],
    seconds: float,
    after_step: Callable[[int], None] | None = None,
) -> int:
    """Train until `seconds` pass, epoch after epoch; print and return the step count.
    With GPUDIAG_TEST_READY set, that file is created after the first step (a test that
    attaches waits for it: past the imports, the job is training)."""
    ready = os.environ.get("GPUDIAG_TEST_READY")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.time()
    steps = 0
    while time.time() - t0 < seconds:
        for x, y in batches():
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if ready and steps == 1:
                open(ready, "w").close()
            if after_step is not None:
                after_step(steps)
            if time.time() - t0 >= seconds:
                break
    print(f"steps: {steps} in {time.time() - t0:.1f} s", flush=True)
    return steps


def timed_steps(step: Callable[[], None], seconds: float, steps: int = 0) -> int:
    """Run `step` until `seconds` pass (or `steps` steps when given); print the count and the
    rate as the benchmarks read them. With GPUDIAG_TEST_READY set, that file is created after
    the first step."""
    ready = os.environ.get("GPUDIAG_TEST_READY")
    t0, done = time.perf_counter(), 0
    while True:
        step()
        done += 1
        if ready and done == 1:
            open(ready, "w").close()
        took = time.perf_counter() - t0
        if (steps and done >= steps) or (not steps and took >= seconds):
            break
    print(f"steps: {done} in {took:.2f} s ({done / took:.2f} steps/s)", flush=True)
    return done


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def announce_when_up(port: int, port_file: str, path: str) -> None:
    """The port to the port file once the server answers `path` with 200 (its workers' set-up
    done), or after 120 s."""
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(port_file + ".tmp", port_file)
