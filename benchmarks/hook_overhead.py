"""Cost of the in-process hooks per training step, measured inside a tiny CPU loop.

Runs the same loop (DataLoader over in-memory tensors, a 4->1 linear model, SGD: a step of a
few tens of microseconds, so the hooks' cost is not hidden) in fresh processes, alternately
bare and with gpudiag's hooks sending to a live agent socket, and reports the median extra
time per step.

    python benchmarks/hook_overhead.py --rounds 7 --steps 5000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading

from gpudiag.probes.base import Target
from gpudiag.probes.inprocess.channel import HookProbe, injection_env

LOOP = """
import time, torch
torch.set_num_threads(1)
from torch.utils.data import DataLoader, TensorDataset
data = DataLoader(TensorDataset(torch.randn({steps}, 4), torch.randn({steps}, 1)), batch_size=1)
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
it = iter(data)
for _ in range(200):  # warm-up
    x, y = next(it); opt.zero_grad(); ((m(x) - y) ** 2).mean().backward(); opt.step()
t = time.perf_counter()
for x, y in it:
    opt.zero_grad(); ((m(x) - y) ** 2).mean().backward(); opt.step()
print((time.perf_counter() - t) / ({steps} - 200) * 1e6)
"""


def per_step_us(code: str, env: dict) -> float:
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument(
        "--micro", action="store_true", help="only time the hooks' own work per step, in-process"
    )
    args = ap.parse_args()
    if args.micro:
        micro()
        return
    probe = HookProbe()
    probe.open(Target(0))
    stop = threading.Event()

    def drain() -> None:
        while not stop.wait(0.05):
            probe.sample()

    threading.Thread(target=drain, daemon=True).start()
    code = LOOP.format(steps=args.steps)
    bare_env = dict(os.environ)
    hooked_env = injection_env(bare_env, probe.path or "")
    deltas = []
    for r in range(args.rounds):
        bare = per_step_us(code, bare_env)
        hooked = per_step_us(code, hooked_env)
        deltas.append(hooked - bare)
        print(
            f"round {r + 1}: bare {bare:.1f} us/step, hooked {hooked:.1f} us/step, "
            f"extra {hooked - bare:+.1f} us",
            flush=True,
        )
    stop.set()
    probe.close()
    print(
        f"median extra cost of the hooks: {statistics.median(deltas):+.1f} us per step "
        f"({probe.messages} messages received)"
    )


def micro(calls: int = 200_000) -> None:
    """The hooks' own work per step, timed in-process (no training noise): on_step plus the
    DataLoader wrapper's bookkeeping, with a live agent socket receiving the flushes."""
    import time

    from gpudiag.probes.inject import gpudiag_hooks as hooks

    probe = HookProbe()
    probe.open(Target(0))
    st = hooks._State(hooks._Channel(probe.path))
    st.loop_start = time.perf_counter()
    batch = [[0.0] * 4]
    t = time.perf_counter()
    for i in range(calls):
        t0 = time.perf_counter()  # what the wrapped __next__ adds around the real fetch
        st.data_wait += time.perf_counter() - t0
        st.batch += hooks._batch_size(batch)
        st.on_step()
        if i % 5000 == 0:
            probe.sample()
    per = (time.perf_counter() - t) / calls * 1e6
    probe.close()
    print(f"hook work per step, in-process: {per:.2f} us ({calls} steps)")


if __name__ == "__main__":
    main()
