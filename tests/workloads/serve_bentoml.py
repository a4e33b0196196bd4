"""BentoML's quick-start service as its docs write it (a `@bentoml.service` class whose
`__init__` loads the model, one `@bentoml.api` method, served as `bentoml serve
serve_bentoml:Classifier` does), the model a small text classifier built from its config (no
download), one request a forward, on the CPU. The process started is BentoML's arbiter: it
binds the port and spawns the service worker that takes the HTTP requests on the inherited
socket and runs the model; the model never runs in the arbiter.

    python serve_bentoml.py --seconds 20 --port-file /tmp/port   # then: load_gen.py --rows

The API takes `tokens` as rows (a batch of one a request), as a batchable API's input is:
load_gen.py --rows sends them so. --batching is BentoML's adaptive batching
(`@bentoml.api(batchable=True, max_batch_size=8, max_latency_ms=1000)`: SERVE001's batch, and
BentoML's latency cap well above the p99; the SERVE001 fix).
Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

os.environ.setdefault("BENTOML_DO_NOT_TRACK", "True")  # no usage report (no network here)

import bentoml  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import announce_when_up, free_port  # noqa: E402
from serve_http import TinyTransformer  # noqa: E402

PATH = "/readyz"  # BentoML answers 200 here once its worker is ready

BATCHING = os.environ.get("SERVE_BENTOML_BATCHING") == "1"  # read again in every worker
API = (
    {"batchable": True, "max_batch_size": 8, "max_latency_ms": 1000, "batch_dim": 0}
    if BATCHING
    else {}
)


@bentoml.service
class Classifier:
    """The quick start's service: the model built once per worker, one forward per call."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = TinyTransformer().eval()

    @bentoml.api(route="/predict", **API)
    def predict(self, tokens: np.ndarray) -> np.ndarray:
        """Rows of token ids in, a label per row out (NumPy arrays, as BentoML's batching
        examples take them: its batcher concatenates them along batch_dim 0)."""
        with torch.inference_mode():
            rows = torch.from_numpy(np.asarray(tokens, dtype=np.int64)[:, :32])
            return self.model(rows).argmax(dim=-1).numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--batching", action="store_true", help="batchable, max_batch_size=8")
    args = p.parse_args()
    if args.batching:
        os.environ["SERVE_BENTOML_BATCHING"] = "1"
    # what `bentoml serve serve_bentoml:Classifier` does (bentoml>=1.2): load, configure, serve
    from _bentoml_impl.server import serve_http
    from bentoml._internal.service.loader import load

    svc = load("serve_bentoml:Classifier", working_dir=HERE)
    svc.inject_config()

    port = free_port()
    threading.Thread(
        target=announce_when_up, args=(port, args.port_file, PATH), daemon=True
    ).start()
    stop = threading.Timer(args.seconds, os.kill, (os.getpid(), signal.SIGINT))
    stop.daemon = True
    stop.start()
    serve_http(svc, host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
