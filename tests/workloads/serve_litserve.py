"""LitServe's quick-start server as its README writes it (a `LitAPI` whose `setup` loads the
model, `decode_request` / `predict` / `encode_response`, `LitServer(api).run(port=...)`), the
model a small text classifier built from its config (no download), batch 1, on the CPU. The
process started is LitServe's front end: it spawns the inference worker that runs the model
and forks the uvicorn process that takes the HTTP requests; the model never runs in it.

    python serve_litserve.py --seconds 20 --port-file /tmp/port   # then: load_gen.py

--batching is LitServe's own batching (`max_batch_size=8, batch_timeout=0.01`, its docs'
values: the SERVE001 fix); --instrument calls gpudiag's instrument() in the front end (for
`gpudiag attach`; the workers inherit it). Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

import litserve as ls
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import announce_when_up, free_port  # noqa: E402
from serve_http import TinyTransformer  # noqa: E402

PATH = "/health"  # LitServe answers 200 here once its workers are set up


class ClassifierAPI(ls.LitAPI):
    """The README's LitAPI: the model loaded in setup, one forward per request (or batch)."""

    def setup(self, device: str) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = TinyTransformer().eval().to(device)

    def decode_request(self, request: dict) -> torch.Tensor:
        return torch.tensor(request["tokens"][:32])

    def batch(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(inputs)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            tokens = x if x.dim() == 2 else x.unsqueeze(0)
            return self.model(tokens).argmax(dim=-1)

    def unbatch(self, output: torch.Tensor) -> list[torch.Tensor]:
        return list(output)

    def encode_response(self, output: torch.Tensor) -> dict:
        return {"label": int(output.reshape(-1)[0])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--batching", action="store_true", help="max_batch_size=8, batch_timeout=0.01")
    p.add_argument("--instrument", action="store_true", help="call gpudiag's instrument()")
    args = p.parse_args()
    if args.instrument:
        from gpudiag.probes.hooks import instrument

        instrument()
    batch = {"max_batch_size": 8, "batch_timeout": 0.01} if args.batching else {}
    api = ClassifierAPI(**batch)
    # LitServe 0.2.19 wires its MCP endpoint whenever the `mcp` package is installed but only
    # imports it with `fastmcp` too: beside mcp 2 (gpudiag's [mcp] extra) it fails to start
    # (NameError: MCPServer). This server has no MCP tools: leave that path out.
    import litserve.server

    litserve.server._MCP_AVAILABLE = False
    server = ls.LitServer(api, accelerator="cpu")
    port = free_port()
    threading.Thread(
        target=announce_when_up, args=(port, args.port_file, PATH), daemon=True
    ).start()
    stop = threading.Timer(args.seconds, os.kill, (os.getpid(), signal.SIGINT))
    stop.daemon = True
    stop.start()
    server.run(host="127.0.0.1", port=port, generate_client_file=False)


if __name__ == "__main__":
    main()
