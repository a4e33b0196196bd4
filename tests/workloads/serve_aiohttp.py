"""An aiohttp model server written the way aiohttp's docs show a handler (a module-level
`web.Application`, an `async def` handler reading the JSON body, the model loaded at start-up,
one forward per request called inline), served by `web.AppRunner` on 127.0.0.1. Planted by the
style itself: the forward runs on the event loop (SERVE004), batch 1, autograd on;
--to-thread is SERVE004's fix (`await asyncio.to_thread(...)` around the model call).

    python serve_aiohttp.py --seconds 20 --port-file /tmp/port   # then: load_gen.py
"""

from __future__ import annotations

import argparse
import asyncio
import os

import torch
from aiohttp import web
from serve_http import TinyTransformer

model = TinyTransformer().eval()
MODE = {"to_thread": False}


def run_model(tokens: list[int]) -> int:
    return int(model(torch.tensor([tokens[:32]])).argmax())


async def predict(request: web.Request) -> web.Response:
    body = await request.json()
    if MODE["to_thread"]:
        label = await asyncio.to_thread(run_model, body["tokens"])
    else:
        label = run_model(body["tokens"])
    return web.json_response({"label": label})


async def serve(seconds: float, port_file: str) -> None:
    app = web.Application()
    app.add_routes([web.post("/predict", predict)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    with open(port_file + ".tmp", "w") as f:
        f.write(str(runner.addresses[0][1]))
    os.replace(port_file + ".tmp", port_file)
    await asyncio.sleep(seconds)
    await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--to-thread", action="store_true", help="the model off the event loop")
    args = p.parse_args()
    torch.set_num_threads(1)
    MODE["to_thread"] = args.to_thread
    asyncio.run(serve(args.seconds, args.port_file))


if __name__ == "__main__":
    main()
