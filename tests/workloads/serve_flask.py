"""A Flask model server written the way Flask's docs write one (a module-level app, a
`@app.post` view reading `request.get_json()` and answering `jsonify`, the model loaded at
import), served by Werkzeug's threaded server on 127.0.0.1 (`make_server(..., threaded=True)`,
what `app.run(threaded=True)` starts, without its banner and reloader), the same small
transformer as serve_http.py.

Planted by the style itself: one forward per request (batch 1) on the request's thread, with
autograd on. --inference-mode runs the forwards under torch.inference_mode() (the INFER001
fix); --batching queues the requests to one model thread that runs up to --max-batch of them
at once, waiting at most --max-wait-ms for more (the SERVE001 fix); --healthy is both.
--tokenize turns each request's text into tokens with serve_http.py's slow pure-Python
tokenizer in the view (planted SERVE002). --instrument calls gpudiag's instrument() (for
`gpudiag attach`). --reloader serves through `app.run(use_reloader=True)`, as `debug=True`
does: a parent process that only restarts the server, which runs in its child (the port
file is written by the child). Werkzeug's access log is off (as serve_http.py's and uvicorn's at
`warning`). Binds 127.0.0.1 only.

    python serve_flask.py --seconds 20 --port-file /tmp/port   # then: load_gen.py --port-file
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import threading

import torch
from flask import Flask, jsonify, request
from serve_http import SEQ, Batcher, TinyTransformer, server_parser, tokenize
from werkzeug.serving import make_server

app = Flask(__name__)
model = TinyTransformer().eval()
MODE = {"inference": False, "tokenize": False, "batcher": None}


def run(batch: list[list[int]]) -> list[int]:
    """The model on a batch of token lists (padded or cut to SEQ)."""
    with torch.inference_mode() if MODE["inference"] else contextlib.nullcontext():
        x = torch.tensor([(t + [0] * SEQ)[:SEQ] for t in batch])
        return model(x).argmax(dim=1).tolist()


@app.post("/predict")
def predict():
    body = request.get_json()
    tokens = tokenize(body["text"]) if MODE["tokenize"] else body["tokens"]
    batcher = MODE["batcher"]
    label = batcher.submit(tokens) if batcher is not None else run([tokens])[0]
    return jsonify({"label": label})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = server_parser(__doc__, "in the view")
    p.add_argument("--reloader", action="store_true", help="app.run(use_reloader=True)")
    return p.parse_args(argv)


def configure(args: argparse.Namespace) -> None:
    """The variant the flags ask for, in this process (serve_gunicorn.py: in each worker)."""
    torch.set_num_threads(1)
    MODE["inference"] = args.inference_mode or args.healthy
    MODE["tokenize"] = args.tokenize
    if args.batching or args.healthy:
        MODE["batcher"] = Batcher(run, args.max_batch, args.max_wait_ms / 1e3)


def serve_reloaded(args: argparse.Namespace) -> None:
    """Serve under Werkzeug's reloader: the parent binds the port and restarts its child,
    the child serves; after --seconds the child exits 0, and the parent with it."""
    port = int(os.environ.get("SERVE_FLASK_PORT") or args.port or free_port())
    os.environ["SERVE_FLASK_PORT"] = str(port)  # the child re-runs this with it
    if os.environ.get("WERKZEUG_RUN_MAIN") == "true":  # the child: the server
        if args.port_file:
            with open(args.port_file + ".tmp", "w") as f:
                f.write(str(port))
            os.replace(args.port_file + ".tmp", args.port_file)
        threading.Timer(args.seconds, os._exit, args=(0,)).start()
    app.run("127.0.0.1", port, use_reloader=True, threaded=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = parse_args()
    if args.instrument:
        from gpudiag.probes.hooks import instrument

        instrument()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    configure(args)
    if args.reloader:
        serve_reloaded(args)
        return
    server = make_server("127.0.0.1", args.port, app, threaded=True)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(server.server_port))
        os.replace(args.port_file + ".tmp", args.port_file)
    threading.Timer(args.seconds, server.shutdown).start()
    server.serve_forever(poll_interval=0.2)


if __name__ == "__main__":
    main()
