"""A training job that POSTs its metrics to a slow collector after every step (a blocking
HTTP call in the loop). `--post-every N` sends them every N steps: the fix."""

import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, TensorDataset


class Collector(BaseHTTPRequestHandler):
    """A metrics collector that takes `DELAY_S` to answer each POST."""

    DELAY_S = 0.03

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(self.DELAY_S)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def start_collector() -> str:
    """The collector on 127.0.0.1, on a thread that sleeps (it holds no GIL to speak of)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/metrics"


if __name__ == "__main__":
    every = 1
    if "--post-every" in sys.argv:
        i = sys.argv.index("--post-every")
        every = int(sys.argv[i + 1])
        del sys.argv[i : i + 2]
    args = parse_args(__doc__)
    url = start_collector()
    data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
    model = small_cnn(width=16)

    def push(step: int) -> None:
        if step % every:
            return
        body = json.dumps({"step": step, "time": time.time()}).encode()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()

    train(model, lambda: DataLoader(data, batch_size=32, shuffle=True), args.seconds, push)
