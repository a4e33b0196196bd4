"""A model served with NVIDIA's PyTriton (Triton Inference Server with the Python backend,
the inference callable in this process) the way its quick start writes one: a `@batch`
function bound with `triton.bind`, served by `triton.serve()`. The model is the planted
server's small transformer (tests/workloads/serve_http.py). `--max-batch 1` (the planted
cause: no dynamic batching); `--max-batch 4 --max-wait-us 1600` the fix SERVE001 names.

    PYTHONPATH=tests/workloads python triton_serve.py --port-file F [--summaries]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from serve_http import TinyTransformer

p = argparse.ArgumentParser()
p.add_argument("--max-batch", type=int, default=1)
p.add_argument("--max-wait-us", type=int, default=2000)
p.add_argument("--port-file")
p.add_argument("--summaries", action="store_true", help="Triton's latency quantiles on /metrics")
a = p.parse_args()

torch.set_num_threads(1)
model = TinyTransformer().eval()


@batch
def infer_fn(tokens):
    with torch.no_grad():
        x = torch.from_numpy(tokens).long()
        return {"label": model(x).argmax(dim=1).numpy().astype(np.int64).reshape(-1, 1)}


batcher = DynamicBatcher(max_queue_delay_microseconds=a.max_wait_us) if a.max_batch > 1 else None
config = ModelConfig(max_batch_size=a.max_batch, batcher=batcher)
metrics = ["summary_latencies=true"] if a.summaries else None
server = TritonConfig(http_port=8000, grpc_port=8001, metrics_port=8002, metrics_config=metrics)
with Triton(config=server) as triton:
    triton.bind(
        model_name="classifier",
        infer_func=infer_fn,
        inputs=[Tensor(name="tokens", dtype=np.int64, shape=(-1,))],
        outputs=[Tensor(name="label", dtype=np.int64, shape=(1,))],
        config=config,
    )
    if a.port_file:
        with open(a.port_file, "w") as f:
            f.write("8000")
    triton.serve()
