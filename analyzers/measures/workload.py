"""What the job repeats: a training loop (unit: the step), a batch-inference loop (unit: the
batch) or a server (unit: the request), told from the stacks of every thread of the job and
the in-process hooks (optimizer steps, model forwards, requests)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudiag.analyzers.measures.rules import Frame, parse_stack
from gpudiag.analyzers.measures.triton import PROBE as TRITON
from gpudiag.analyzers.measures.triton import latency_basis, runs_triton
from gpudiag.analyzers.timeline.timeline import Aggregate

# A request handler or its listener, by the file of any frame (stdlib http.server and
# socketserver, wsgiref, Flask/Werkzeug, gunicorn, uvicorn/Starlette/FastAPI, aiohttp,
# tornado, gRPC, Ray Serve).
SERVER_FILE_RE = re.compile(
    r"/(socketserver|http/server|wsgiref/simple_server)\.py$|"
    r"/(werkzeug|flask|gunicorn|uvicorn|starlette|fastapi|hypercorn|aiohttp|tornado|grpc|"
    r"ray/serve)/"
)
# Training: a backward pass (Tensor.backward, torch.autograd.backward/grad) or an optimizer.
TRAIN_FUNC_RE = re.compile(r"torch\._tensor\.Tensor\.backward$|torch\.autograd\.(backward|grad)$")
OPTIM_FILE_RE = re.compile(r"torch/optim/")
FORWARD_FILE_RE = re.compile(r"torch/nn/modules/module\.py$")
# Hugging Face's generate() (its decoding loop's frames are in the same file)
GENERATE_RE = re.compile(r"\bgenerate \([^)]*/transformers/generation/utils\.py:")
STARTUP_FILE_RE = re.compile(r"^<frozen importlib\._bootstrap")  # imports: not the work
# Importing a trainer (Hugging Face's Trainer, Lightning's): a training job still starting up.
TRAINER_FILE_RE = re.compile(
    r"/transformers/trainer\.py$|/(lightning/pytorch|pytorch_lightning)/trainer/"
)
# A supervisor that only waits on the server it started (Werkzeug's reloader, uvicorn's
# --reload and --workers supervisors, gunicorn's arbiter, hupper): not a request handled.
# Its children's stacks may hold its frames too, under their own (a gunicorn worker runs
# inside the master's spawn_worker, a uvicorn worker inside its supervisor's process
# target): only a stack whose innermost server frame is a supervisor's is the supervisor's.
SUPERVISOR_FILE_RE = re.compile(
    r"/werkzeug/_reloader\.py$|/uvicorn/supervisors/|/gunicorn/arbiter\.py$|/hupper/"
)
# a listener, an event loop, or a server's main thread waiting for it to stop (gRPC's
# wait_for_termination: a grpc/ frame, not a request being handled). Ray Serve's replica runs
# the user's code on its own event loop thread, the loop in C (uvloop): the thread's target
# is the innermost frame while it waits.
LISTENER_FUNC_RE = re.compile(
    r"(^|\.)(serve_forever|_serve|serve|run_forever|_run_once|accept|wait_for_termination"
    r"|_run_user_code_event_loop)$"
)
# A request's handling that runs inside a listener's or event loop's frame: gunicorn's sync
# and async workers handle the connection they accepted inside `accept`/`run_for_one`; an
# asyncio loop runs a request's task inside `_run_once` (uvicorn's request cycle, aiohttp's
# handler, Starlette's or FastAPI's app, tornado's). Below the innermost listener frame, one
# of these is a request being handled, not the listener waiting.
HANDLER_ENTRY_RE = re.compile(
    r"(^|\.)gunicorn\.workers\.\w+\.(\w+\.)?handle(_request)?$|"
    r"(^|\.)uvicorn\.protocols\.http\.\w+\.(RequestResponseCycle\.)?run_asgi$|"
    r"(^|\.)(starlette|fastapi)\.|"
    r"(^|\.)aiohttp\.web_protocol\.(RequestHandler\.)?_handle_request$|"
    r"(^|\.)tornado\.web\.(RequestHandler\.)?_execute$|"
    r"(^|\.)ray\.serve\._private\.(replica\.UserCallableWrapper|http_util)\."
)
MIN_SAMPLES = 3.0  # stack samples that show a kind of work before it counts
TRITON_BASIS = "Triton Inference Server's metrics"


@dataclass(frozen=True)
class Workload:
    """The kind of job, its unit of work, what it was told from and the facts behind it."""

    kind: str  # training, inference, server, unknown
    unit: str  # step, batch, request
    basis: str
    evidence: tuple[str, ...] = ()
    generates: bool = False  # its forwards are decoding steps of Hugging Face's generate()

    def to_dict(self) -> dict:
        """JSON form (the report's `workload`)."""
        return {
            "kind": self.kind,
            "unit": self.unit,
            "basis": self.basis,
            "evidence": list(self.evidence),
        }


@dataclass
class StackCensus:
    """Stack samples of the job's threads by what they show."""

    samples: float = 0.0
    train: float = 0.0  # backward or optimizer frames
    forward: float = 0.0  # nn.Module calls (on any thread)
    server: float = 0.0  # request-handler or listener frames
    server_forward: float = 0.0  # module calls under a server's frames or on its threads
    handling: float = 0.0  # server frames not in the listener: requests being handled
    server_threads: int = 0
    threads: int = 0
    trainer_import: float = 0.0  # start-up samples importing a trainer library
    generate: float = 0.0  # inside Hugging Face's generate(): its forwards are decoding steps


def _is_training(fr: Frame) -> bool:
    """A backward, or an optimizer built or stepping (not torch.optim's own import)."""
    if OPTIM_FILE_RE.search(fr.file):
        return fr.function != "<module>"
    return bool(TRAIN_FUNC_RE.search(fr.dotted))


# asyncio's runner innermost: the event loop runs in C (uvloop), waiting or in its own I/O;
# a request's coroutine would show its frames above it
LOOP_IN_C_RE = re.compile(r"/asyncio/runners\.py$")


def is_listener(frames: tuple[Frame, ...]) -> bool:
    """A server's listener or event loop waiting for connections, or its master supervising
    worker processes: not handling a request (one handled inside the listener's frame, below
    it, is: a gunicorn sync worker's, an asyncio server's)."""
    if frames and LOOP_IN_C_RE.search(frames[-1].file):
        return True
    last = max(
        (i for i, fr in enumerate(frames) if LISTENER_FUNC_RE.search(fr.function)), default=-1
    )
    if last >= 0 and any(HANDLER_ENTRY_RE.search(fr.dotted) for fr in frames[last + 1 :]):
        return False
    return last >= 0 or is_supervising(frames)


def is_supervising(frames: tuple[Frame, ...]) -> bool:
    """A supervisor waiting on the server it started (gunicorn's arbiter, Werkzeug's reloader,
    uvicorn's supervisors): the innermost server frame is its own (a forked or spawned
    worker's stacks have theirs above it)."""
    server = [
        fr for fr in frames if SERVER_FILE_RE.search(fr.file) or SUPERVISOR_FILE_RE.search(fr.file)
    ]
    return bool(server) and bool(SUPERVISOR_FILE_RE.search(server[-1].file))


def is_handling(stack: str) -> bool:
    """A request being handled: server frames, not the listener's, not a supervisor's (a
    Flask app's reloader parent waiting on its server: SERVE002 named its `app.run` line as
    the request path's host work, sure) and not a server module being imported (a FastAPI
    server's start-up imports uvicorn and starlette: SERVE002 named its `import` lines)."""
    frames = parse_stack(stack)
    if any(STARTUP_FILE_RE.search(fr.file) for fr in frames):
        return False
    return any(SERVER_FILE_RE.search(fr.file) for fr in frames) and not is_listener(frames)


def _frames_of(stack: str) -> tuple[bool, bool, bool] | str:
    """(training, forward, server) frames in one stack; for an import (start-up), "train"
    when it builds an optimizer, "trainer" when it imports a trainer, else ""."""
    train = fwd = srv = False
    frames = parse_stack(stack)
    if any(STARTUP_FILE_RE.search(fr.file) for fr in frames):
        if any(_is_training(fr) for fr in frames):
            return "train"
        return "trainer" if any(TRAINER_FILE_RE.search(fr.file) for fr in frames) else ""
    for fr in frames:
        if not train and _is_training(fr):
            train = True
        if not fwd and FORWARD_FILE_RE.search(fr.file):
            fwd = True
        if not srv and SERVER_FILE_RE.search(fr.file):
            srv = True
    return train, fwd, srv


def census(tl: Aggregate) -> StackCensus:
    """Count the target's stack samples (mode all) by training, forward and server frames."""
    c = StackCensus()
    for key in tl.threads("all", "target"):
        rows = []
        for (stack, _code), n in tl.stacks[key].items():
            kinds = _frames_of(stack)
            if isinstance(kinds, tuple):
                rows.append((n, *kinds, stack))
            elif kinds == "train":  # an optimizer built: training, even in start-up
                c.train += n
            elif kinds == "trainer":
                c.trainer_import += n
        if not rows:
            continue
        serving = any(srv for _, _, _, srv, _ in rows)
        c.threads += 1
        c.server_threads += int(serving)
        for n, train, fwd, srv, stack in rows:
            c.samples += n
            c.train += n * train
            c.forward += n * fwd
            c.server += n * srv
            c.server_forward += n * (fwd and serving)
            c.handling += n * (srv and is_handling(stack))
            c.generate += n * (fwd and bool(GENERATE_RE.search(stack)))
    return c


def _hooks_count(tl: Aggregate, name: str, kind: str) -> float:
    r = tl.rollup("hooks", name, kind=kind)
    return float(r.count) if r else 0.0


def decide_workload(tl: Aggregate, steps: float = 0.0) -> Workload:
    """The job's kind from its stacks (`tl`, the whole run) and the hooks' counts (`steps`:
    optimizer steps). Training wins over everything (a trainer may serve metrics over HTTP);
    a server needs request-handler frames, and its threads doing the model's forwards when
    it has any; inference is forwards with no backward."""
    c = census(tl)
    forwards = _hooks_count(tl, "forward_time_s", "forward")
    requests = _hooks_count(tl, "request_latency_s", "request")
    if steps <= 0 and runs_triton(tl):
        return _triton_workload(tl, c)
    ev = [f"{c.samples:.0f} stack samples after start-up over {c.threads} threads"]
    if steps > 0 or c.train >= MIN_SAMPLES:
        if steps > 0:
            ev.append(f"{steps:.0f} optimizer steps (hooks)")
        if c.train:
            ev.append(f"{c.train:.0f} samples in backward, or building or stepping an optimizer")
        basis = "optimizer steps seen by the hooks" if steps > 0 else "backward/optimizer frames"
        return Workload("training", "step", basis, tuple(ev))
    outside = c.forward - c.server_forward
    # requests handled (or waiting on a batcher) at least a fifth as often as the model runs
    # elsewhere: a batch job's metrics endpoint is scraped far less than that
    busy = c.handling >= max(MIN_SAMPLES, 0.2 * outside)
    if requests > 0 or (c.server >= MIN_SAMPLES and (busy or outside < MIN_SAMPLES)):
        ev.append(f"{c.server:.0f} samples in request-handler frames on {c.server_threads} threads")
        if requests:
            ev.append(f"{requests:.0f} requests (hooks)")
        if c.server_forward or forwards:
            ev.append(f"{c.server_forward:.0f} samples in the model's forward under the server")
        basis = "requests seen by the hooks" if requests else "request-handler frames"
        return Workload("server", "request", basis, tuple(ev))
    if forwards > 0 or c.forward >= MIN_SAMPLES:
        if forwards:
            ev.append(f"{forwards:.0f} model forwards (hooks)")
        ev.append(f"{c.forward:.0f} samples in forward, none in backward or an optimizer")
        if c.generate >= MIN_SAMPLES:
            ev.append(
                f"{c.generate:.0f} samples inside Hugging Face's generate(): each forward is "
                "one decoding step (a new token for each sequence), so items/s are tokens/s"
            )
        basis = "model forwards with no backward"
        return Workload("inference", "batch", basis, tuple(ev), c.generate >= MIN_SAMPLES)
    if c.trainer_import >= 1:
        ev.append(f"{c.trainer_import:.0f} start-up samples importing a trainer")
        return Workload("training", "step", "start-up only: the job imports a trainer", tuple(ev))
    basis = "no backward, optimizer, forward or request frames after start-up"
    return Workload("unknown", "step", basis, tuple(ev))


def _triton_workload(tl: Aggregate, c: StackCensus) -> Workload:
    """A Triton Inference Server: a server, its requests counted by the server itself."""
    served = sum(r.total for _l, r in tl.matching(TRITON, "requests"))
    models = sorted({lab.get("model", "") for lab, _r in tl.matching(TRITON, "pending")})
    ev = (
        f"a tritonserver process serving {len(models)} model(s): {', '.join(models) or '?'}",
        f"{served:.0f} requests (Triton's nv_inference_request_success)",
        f"latency: {latency_basis(tl)}",
        f"{c.samples:.0f} stack samples after start-up over {c.threads} threads",
    )
    return Workload("server", "request", TRITON_BASIS, ev)
