"""A model loaded per unit of work. SERVE005: a server loads its model on the request path: the
request handlers' stack samples in loading a model or its weights (Hugging Face's
from_pretrained and pipeline(), sentence-transformers' constructor, torch.load, safetensors),
and, with the hooks, a top module never seen before forwarding for most requests (one model
built per request, not one a server). INFER004: a batch-inference loop loads its model again
for every batch or chunk (the loading in most of the loop's stack windows, or, with the hooks,
most forwards run by a model never seen before)."""

from __future__ import annotations

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.findings.serving import samples_evidence
from gpudiag.analyzers.measures.loop import location_of
from gpudiag.analyzers.measures.serving import HandlerSplit, loads_other_models
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
)

SERVE005 = register(
    Spec(
        "SERVE005",
        "The model is loaded on the request path, per request",
        "host",
        False,
        settled_by_hooks=(
            "the in-process hooks tell a model loaded per request from one loaded "
            "once (gpudiag run, or attach --hooks)"
        ),
        claims=("loop_time",),
        doc=Doc(
            means=(
                "a server loads its model on the request path: `serve_load_warn` (0.10) or more "
                "of the request path's busy time is the handlers loading a model or its weights "
                "(Hugging Face's `from_pretrained`, `from_config` and `pipeline()`, "
                "sentence-transformers' constructor, `torch.load`, `torch.jit.load`, safetensors,"
                " `load_state_dict`; the modules' construction inside is not counted as a "
                "forward), named at the job's line; with the hooks, `serve_new_model_share` (0.5)"
                " or more of the forwards run by a top module never seen before (one built per "
                "request; a model loaded lazily by the first request gives one in all and no "
                "finding); without them, not sure (once or per request is not told)"
            ),
            fix=(
                "load the model once at start-up (module level, FastAPI's lifespan, Flask's app "
                "factory) and reuse it; a cache (`functools.lru_cache`) for a model per tenant; "
                "`gunicorn --preload` or one load per worker"
            ),
            measured=(
                Measured(
                    impact="the loading's share of the request path's busy time",
                    speedup=(
                        "the loading taken off the path; at least: a model loaded per request "
                        "also runs its forwards cold"
                    ),
                    checked="x2.28-x2.46 / x4.4-x4.5 (a FastAPI server, CPU)",
                ),
            ),
        ),
    )
)

INFER004 = register(
    Spec(
        "INFER004",
        "The model is loaded again for every batch",
        "host",
        True,
        settled_by_hooks=(
            "the in-process hooks tell the same model loaded again from a sweep "
            "over different checkpoints (gpudiag run, or attach --hooks)"
        ),
        claims=("loop_time",),
        doc=Doc(
            means=(
                "a batch-inference loop loads its model again for every batch or chunk: "
                "`serve_load_warn` (0.10) or more of the loop's stack samples load a model "
                "(Hugging Face's `from_pretrained`, `from_config` and `pipeline()`, "
                "sentence-transformers' constructor, `torch.jit.load`, `load_state_dict`; "
                "`torch.load` and safetensors alone may be reading data and do not count), and "
                "the loading recurs through the loop: seen in half or more of its stack windows "
                "(3 at least), or, with the hooks, `serve_new_model_share` (0.5) or more of the "
                "forwards run by a model never seen before; named at the job's line. The hooks "
                "read each new model's source (its `name_or_path`): when they know three or more "
                "and fewer than half were loaded before, it is a sweep over different checkpoints"
                " (each load the job's work): no INFER004 (nor SERVE005), and LOOP001 names the "
                "loading; without the hooks, not sure (the same model or a sweep is not told). "
                "Loading is never a forward (the modules' construction runs under "
                "`torch/nn/modules`): loading once, at start-up or lazily in the first batch, is "
                'start-up; loading that recurs is the loop\'s "other". In a loop found loading '
                "again, the loading is all of it: a weights file read by `torch.load` or "
                "safetensors counts (`torch.load(f, weights_only=False)` of a whole model, once "
                "the hooks see every forward run by a new model), and so does what the job's "
                "function that loads does around the loading call (building the model from its "
                "config before `load_state_dict(torch.load(f))`); where that function also runs "
                "the model, only its loading lines"
            ),
            fix=(
                "load the model once before the loop and pass it in, or cache the loader "
                "(`functools.lru_cache`); in a job split into tasks (Spark, Ray, "
                "multiprocessing), once per worker"
            ),
            measured=(
                Measured(
                    impact="the loading's share of the loop's stack samples",
                    speedup=(
                        "the loading taken out of the loop; at least: a model loaded per batch "
                        "also runs its forwards cold"
                    ),
                    checked=(
                        "x1.61-x1.69 / x1.78-x1.91 (chunks of 16, run and attach; the fix timed "
                        "over the same texts); x1.16 / x1.17 (chunks of 64); x5.01-x5.26 / "
                        "x4.95-x5.82 (`from_config` + `load_state_dict(torch.load(f))`); x1.43 / "
                        "x1.41-x1.42 (`torch.load` of the whole model, run; all-MiniLM-L6-v2, "
                        "CPU)"
                    ),
                ),
            ),
        ),
    )
)


# without the hooks: once (a lazy first load) or per request, the same model or another, not told
UNCONFIRMED = 0.6


def _load_share(metric: str, share: float, c: Context) -> Evidence:
    """The loading's share against `serve_load_warn` (the stacks)."""
    th = c.th
    return th.evidence("serve_load_warn", metric, round(share, 4), "ratio", ">=", "stacks")


def _models(c: Context) -> tuple[Evidence, ...]:
    """The hooks' new models: their share of the forwards against `serve_new_model_share`,
    their count and a forward's time (none without the hooks)."""
    th, m = c.th, c.metrics
    if m.get("models_new_share") is None:
        return ()
    return (
        th.evidence(
            "serve_new_model_share",
            "models_new_share",
            round(m["models_new_share"], 4),
            "ratio",
            ">=",
            "hooks",
        ),
        Evidence("models_new", m.get("models_new"), "count", source="hooks"),
        Evidence("forward_time_p50_s", m.get("forward_time_p50_s"), "s", source="hooks"),
    )


def _evidence(c: Context, split: HandlerSplit, share: float) -> tuple[Evidence, ...]:
    return (
        _load_share("request_path_load_share", share, c),
        samples_evidence("request_path_samples", split.samples, c.th),
    ) + _models(c)


def serve005(c: Context) -> list[Finding]:
    """SERVE005: the model loaded on the request path, named at the job's line."""
    th, m = c.th, c.metrics
    if c.workload is None or c.workload.kind != "server":
        return []
    split = c.handlers
    if split is None or split.samples < th.min_loop_samples or split.loading <= 0:
        return []
    share = split.loading / split.busy
    new = m.get("models_new_share")
    if share < th.serve_load_warn or (new is not None and new < th.serve_new_model_share):
        return []  # with the hooks' word that one model serves: a first, lazy load
    if loads_other_models(m):
        return []  # each request loads another model: its work, not a load to keep
    conf = confidence_above(share, th.serve_load_warn, split.busy)
    conf = conf if new is not None else conf * UNCONFIRMED
    if conf < th.min_confidence:
        return []
    loc = split.load_top
    where = f" at {loc.function} ({loc.file}:{loc.line})" if loc else ""
    told = (
        f" {new:.0%} of the model's forwards ran on a model never seen before: one is built "
        "for each request."
        if new is not None
        else " Without the hooks, a first load on a request (loaded lazily once) is not told "
        "from one a request: gpudiag run or attach --hooks tells."
    )
    msg = (
        f"{share:.0%} of the request path's busy time is loading a model or its weights"
        f"{where}.{told} A model loaded per request also runs its first forwards cold."
    )
    actions = (
        "load the model once, when the server starts (at module level, FastAPI's lifespan, "
        "Flask's app factory), and reuse it in every request",
        "a model per client or tenant: keep the loaded ones in a cache "
        "(functools.lru_cache on the loader), not one per request",
        "for several processes (gunicorn --preload, uvicorn --workers): load before the fork "
        "or once in each worker",
    )
    return [
        new_finding(
            "SERVE005",
            th,
            confidence=conf,
            impact=share,
            message=msg,
            evidence=_evidence(c, split, share),
            recommendation=Recommendation("Load the model once, not per request", actions),
            expected_speedup=speedup_from_impact(share),
            location=loc,
            signals=("stacks", "hooks") if new is not None else ("stacks",),
            speedup_kind="floor",
            speedup_basis="the loading taken off the request path; at least: a model loaded "
            "per request also runs its forwards cold (slower than a warm one)",
        )
    ]


def _loop_evidence(c: Context, share: float) -> tuple[Evidence, ...]:
    return (
        _load_share("loop_load_share", share, c),
        Evidence("loop_stack_samples", c.profile.samples, "samples", source="stacks"),
    ) + _models(c)


def infer004(c: Context) -> list[Finding]:
    """INFER004: a batch-inference loop loads its model again inside the loop (the loading
    that `window.model_reloaded` found spread over it, put in the loop's "other")."""
    th, m, p = c.th, c.metrics, c.profile
    if c.workload is None or c.workload.kind != "inference" or not c.win.reloads:
        return []
    if p.samples < th.min_loop_samples or p.loading_samples <= 0 or loads_other_models(m):
        return []  # (a sweep over different models: each load is the job's work)
    share = p.loading_samples / p.samples
    known = m.get("models_known") is not None
    conf = confidence_above(share, th.serve_load_warn, p.samples) * (1.0 if known else UNCONFIRMED)
    if share < th.serve_load_warn or conf < th.min_confidence:
        return []
    loc = location_of(p.loading_stacks)
    where = f" at {loc.function} ({loc.file}:{loc.line})" if loc else ""
    new = m.get("models_new_share")
    told = (
        f" {new:.0%} of the model's forwards ran on a model never seen before, loaded from "
        "the same place again."
        if known and new is not None
        else " The loading shows all through the loop, not once at its start; without the "
        "hooks, the same model loaded again is not told from a sweep over different "
        "checkpoints (each load then the job's work)."
    )
    msg = (
        f"The loop spends {share:.0%} of its time loading a model{where}, again for every "
        f"batch or chunk.{told} Each new model also runs its first forwards cold."
    )
    actions = (
        "load the model (and its tokenizer) once, before the loop, and pass it in; or cache "
        "the loader (functools.lru_cache) when the function that embeds or predicts loads it",
        "for a job split into tasks (one file, chunk or partition each: Spark, Ray, "
        "multiprocessing), load once per worker, not once per task",
        "gpudiag try --fix load_once -- <the job> measures it first (from_pretrained and "
        "SentenceTransformer loads with the same arguments reuse the first)",
    )
    return [
        new_finding(
            "INFER004",
            th,
            confidence=conf,
            impact=share,
            message=msg,
            evidence=_loop_evidence(c, share),
            recommendation=Recommendation("Load the model once, not per batch", actions),
            expected_speedup=speedup_from_impact(share),
            location=loc,
            signals=("stacks", "hooks") if known else ("stacks",),
            speedup_kind="floor",
            speedup_basis="the loading taken out of the loop; at least: a model loaded per "
            "batch also runs its forwards cold (slower than a warm one)",
            fix={"kind": "load_once", "values": {}},
        )
    ]


def find(c: Context) -> list[Finding]:
    """SERVE005 and INFER004, from the analysis context."""
    return serve005(c) + infer004(c)


FINDER = Finder("model_load", find, (SERVE005, INFER004))
