"""A small CPU training job that reports its own step timings, for the capture tests.

Prints one JSON line at the end: the wall time of each optimizer step measured by the job
itself (from one `opt.step()` return to the next), whether the PyTorch profiler is still on,
and the steps/s before and after the capture window.
"""

import json
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(64 * steps, 256), torch.randint(0, 10, (64 * steps,)))
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ends = []
    for x, y in DataLoader(data, batch_size=64):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if len(ends) % 7 == 3:
            time.sleep(0.004)  # uneven steps, so a wrong step alignment shows
        opt.step()
        ends.append(time.perf_counter())
    print(
        json.dumps(
            {
                "step_times": [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)],
                "profiler_on": bool(torch.autograd._profiler_enabled()),
            }
        )
    )
