"""Planted SERVE001 and INFER001: a standard-library model server (ThreadingHTTPServer) whose
handler runs a small transformer forward per request (batch 1) with autograd on.

    python serve_http.py --seconds 20 --port-file /tmp/port   # then: load_gen.py --port-file

--tokenize turns each request's text into tokens with a slow pure-Python tokenizer on the
handler thread (planted SERVE002: host work on the request path). --batching queues the
requests to one model thread that runs up to --max-batch of them at once, waiting at most
--max-wait-ms for more (the SERVE001 fix); --inference-mode runs the forwards under
torch.inference_mode() (the INFER001 fix); --healthy is both. --instrument
calls gpudiag's instrument() (for `gpudiag attach`). Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from torch import nn

SEQ = 32
WORDS = {f"w{i}": i for i in range(1000)}


def tokenize(text: str) -> list[int]:
    """A slow, pure-Python tokenizer: split, normalise, look up (as real ones do, slower)."""
    ids = []
    for word in text.split():
        word = word.strip(".,;:!?").lower()
        for _ in range(4000):  # a long normalisation chain
            word = word.replace("--", "-").strip("-")
        ids.append(WORDS.get(word, 0))
    return ids


class TinyTransformer(nn.Module):
    """A small encoder classifier built from its config (no weights downloaded)."""

    def __init__(self, vocab: int = 1000, dim: int = 128, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class Batcher:
    """One model thread: takes up to max_batch queued requests, waiting max_wait_s for more."""

    def __init__(self, run, max_batch: int, max_wait_s: float) -> None:
        self.run, self.max_batch, self.max_wait_s = run, max_batch, max_wait_s
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="batcher", daemon=True).start()

    def submit(self, tokens: list[int]) -> int:
        slot = {"done": threading.Event()}
        self.q.put((tokens, slot))
        slot["done"].wait()
        return slot["answer"]

    def _loop(self) -> None:
        while True:
            items = [self.q.get()]
            deadline = time.perf_counter() + self.max_wait_s
            while len(items) < self.max_batch:
                left = deadline - time.perf_counter()
                try:
                    items.append(
                        self.q.get(timeout=max(0.0, left)) if left > 0 else self.q.get_nowait()
                    )
                except queue.Empty:
                    break
            answers = self.run([t for t, _ in items])
            for (_, slot), a in zip(items, answers, strict=True):
                slot["answer"] = a
                slot["done"].set()


def make_handler(predict, slow_tokenizer: bool = False):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            req = json.loads(body)
            tokens = tokenize(req["text"]) if slow_tokenizer else req["tokens"]
            out = json.dumps({"label": predict(tokens)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args) -> None:
            pass

    return Handler


def server_parser(doc: str, tokenize_where: str) -> argparse.ArgumentParser:
    """The options every model server here takes (serve_http.py, serve_flask.py)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0, help="serve this long, then exit")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", help="write the port here once listening")
    p.add_argument("--tokenize", action="store_true", help=f"tokenize text {tokenize_where}")
    p.add_argument("--batching", action="store_true")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--inference-mode", action="store_true")
    p.add_argument("--healthy", action="store_true", help="--batching --inference-mode")
    p.add_argument("--instrument", action="store_true", help="call gpudiag's instrument()")
    return p


def parse_args() -> argparse.Namespace:
    p = server_parser(__doc__, "on the handler")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.instrument:
        from gpudiag.probes.hooks import instrument

        instrument()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    grad = torch.inference_mode if args.inference_mode or args.healthy else contextlib.nullcontext

    def run(batch: list[list[int]]) -> list[int]:
        with grad():
            x = torch.tensor([(t + [0] * SEQ)[:SEQ] for t in batch])
            return model(x).argmax(dim=1).tolist()

    if args.batching or args.healthy:
        batcher = Batcher(run, args.max_batch, args.max_wait_ms / 1e3)
        predict = batcher.submit
    else:

        def predict(tokens: list[int]) -> int:
            return run([tokens])[0]

    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(predict, args.tokenize))
    server.daemon_threads = True
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os

        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    threading.Timer(args.seconds, server.shutdown).start()
    server.serve_forever(poll_interval=0.2)
    print("server stopped", flush=True)


if __name__ == "__main__":
    main()
