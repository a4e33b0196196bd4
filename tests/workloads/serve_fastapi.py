"""A FastAPI model server written the way FastAPI's docs show it (a module-level app, a
pydantic request body, the model loaded at start-up, one forward per request in a plain
`def` endpoint, which FastAPI runs in its thread pool), under uvicorn on 127.0.0.1. Planted
by the style itself: batch 1 per forward, autograd on (nothing in the docs' example turns
it off); --inference-mode is the INFER001 fix; --instrument calls gpudiag's instrument()
(for `gpudiag attach`).

    python serve_fastapi.py --seconds 20 --port-file /tmp/port   # then: load_gen.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from serve_http import TinyTransformer

app = FastAPI()
model = TinyTransformer().eval()
MODE = {"inference": False}


class Item(BaseModel):
    tokens: list[int]
    text: str = ""


@app.post("/predict")
def predict(item: Item) -> dict:
    tokens = torch.tensor([item.tokens[:32]])
    with torch.inference_mode() if MODE["inference"] else contextlib.nullcontext():
        logits = model(tokens)
    return {"label": int(logits.argmax())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--inference-mode", action="store_true")
    p.add_argument("--instrument", action="store_true", help="call gpudiag's instrument()")
    args = p.parse_args()
    if args.instrument:
        from gpudiag.probes.hooks import instrument

        instrument()
    torch.set_num_threads(1)
    MODE["inference"] = args.inference_mode
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Timer(args.seconds, lambda: setattr(server, "should_exit", True)).start()
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
