"""A gRPC model server as grpcio's docs write one (`grpc.server(ThreadPoolExecutor(...))`, a
unary-unary method, `server.start()` then `wait_for_termination()`), on 127.0.0.1, with the
same small transformer as serve_http.py. The service is a generic handler with JSON
(de)serializers (no protoc): method /gpudiag.Model/Predict takes {"tokens": [...], "text":
"..."} and answers {"label": N}.

Planted by the style itself: one forward per request (batch 1) on the RPC's pool thread, with
autograd on. --inference-mode runs the forwards under torch.inference_mode() (the INFER001
fix); --batching queues the requests to one model thread that runs up to --max-batch of them
at once, waiting at most --max-wait-ms for more (the SERVE001 fix); --healthy is both.
--tokenize turns each request's text into tokens with serve_http.py's slow pure-Python
tokenizer in the handler (planted SERVE002). --instrument calls gpudiag's instrument() (for
`gpudiag attach`). Binds 127.0.0.1 only.

    python serve_grpc.py --seconds 20 --port-file /tmp/port  # then: load_gen.py --grpc
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from concurrent import futures

import torch
from serve_http import SEQ, Batcher, TinyTransformer, server_parser, tokenize

SERVICE, METHOD = "gpudiag.Model", "Predict"  # the client calls /gpudiag.Model/Predict


def parse_args() -> argparse.Namespace:
    p = server_parser(__doc__, "in the handler")
    p.add_argument("--workers", type=int, default=8, help="the server's thread pool size")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.instrument:
        from gpudiag.probes.hooks import instrument

        instrument()
    import grpc

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    inference = args.inference_mode or args.healthy

    def run(batch: list[list[int]]) -> list[int]:
        with torch.inference_mode() if inference else contextlib.nullcontext():
            x = torch.tensor([(t + [0] * SEQ)[:SEQ] for t in batch])
            return model(x).argmax(dim=1).tolist()

    batcher = None
    if args.batching or args.healthy:
        batcher = Batcher(run, args.max_batch, args.max_wait_ms / 1e3)

    def predict(request: dict, context) -> dict:
        tokens = tokenize(request["text"]) if args.tokenize else request["tokens"]
        label = batcher.submit(tokens) if batcher is not None else run([tokens])[0]
        return {"label": label}

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            METHOD: grpc.unary_unary_rpc_method_handler(
                predict, request_deserializer=json.loads, response_serializer=_dumps
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination(timeout=args.seconds)
    server.stop(grace=1.0).wait()
    print("server stopped", flush=True)


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj).encode()


if __name__ == "__main__":
    main()
