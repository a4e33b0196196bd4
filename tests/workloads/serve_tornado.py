"""A tornado model server written the way tornado's docs show one (a `RequestHandler` subclass
with a `post` method, `tornado.web.Application` with its routes, `app.listen(port)`, then
waiting on an `asyncio.Event`), the model loaded at start-up, one forward per request called
inline, on 127.0.0.1. Planted by the style itself: the forward runs on the IOLoop (SERVE004),
batch 1, autograd on; --to-thread is SERVE004's fix (`await IOLoop.current().run_in_executor
(None, ...)` around the model call). --instrument calls gpudiag's instrument() after tornado is
imported (for `gpudiag attach`: its RequestHandler and HTTPServer patched where they are).

    python serve_tornado.py --seconds 20 --port-file /tmp/port   # then: load_gen.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import torch
import tornado.ioloop
import tornado.web
from serve_http import TinyTransformer

model = TinyTransformer().eval()
MODE = {"to_thread": False}


def run_model(tokens: list[int]) -> int:
    return int(model(torch.tensor([tokens[:32]])).argmax())


class Predict(tornado.web.RequestHandler):
    async def post(self) -> None:
        tokens = json.loads(self.request.body)["tokens"]
        if MODE["to_thread"]:
            loop = tornado.ioloop.IOLoop.current()
            label = await loop.run_in_executor(None, run_model, tokens)
        else:
            label = run_model(tokens)
        self.write({"label": label})


async def serve(seconds: float, port_file: str) -> None:
    app = tornado.web.Application([(r"/predict", Predict)])
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(port_file + ".tmp", port_file)
    await asyncio.sleep(seconds)
    server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--to-thread", action="store_true", help="the model off the IOLoop")
    p.add_argument("--instrument", action="store_true", help="call gpudiag's instrument()")
    args = p.parse_args()
    if args.instrument:
        from gpudiag.probes.hooks import instrument

        instrument()
    torch.set_num_threads(1)
    MODE["to_thread"] = args.to_thread
    asyncio.run(serve(args.seconds, args.port_file))


if __name__ == "__main__":
    main()
