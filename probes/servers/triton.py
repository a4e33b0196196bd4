"""Triton probe: NVIDIA Triton Inference Server's own counters, read from its Prometheus
metrics endpoint (`tritonserver --metrics-port`, 8002 by default), per model.

Triton queues and batches requests in C++ before any Python sees them (a Python backend's
`model.py`, PyTriton's inference callable): the request rate, the latency, the time queued
and the batch size per execution are only in its counters. The server is found among the
job's processes (the target itself, or a child: PyTriton starts `tritonserver` itself),
looked for again until it appears, its metrics address read from its command line.

What the server's command line says is its owner's word, and gpudiag may run as root: only an
IP address and a port number are taken from it, the scrape goes only to a port that the server
process itself listens on (a socket in its own fd table), always for the fixed path
`/metrics`, without following redirects, at most `MAX_SCRAPE_BYTES` and `MAX_MODELS` models.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import psutil
from prometheus_client.parser import text_string_to_metric_families

from gpudiag.probes.base import Field, Probe, ProbeStatus, Sample, Target, now_ns
from gpudiag.probes.files import descendants
from gpudiag.probes.net import http_get, listens_on, unspecified

SERVER_NAME = "tritonserver"
STUB_NAME = "triton_python_backend_stub"  # a Python backend model's process
DEFAULT_METRICS_PORT = 8002
FIND_EVERY_S = 2.0  # how often to look for a server not found yet...
FIND_FOR_S = 120.0  # ...and for how long (PyTriton starts its server within seconds)
SCRAPE_TIMEOUT_S = 0.5
MAX_SCRAPE_BYTES = 4 << 20  # of one scrape's answer: more is refused, not parsed
MAX_MODELS = 256  # (model, version) pairs followed per server: later ones are not read
METRICS_PATH = "/metrics"

# Triton's cumulative per-model counters (microseconds or counts) -> this probe's fields
COUNTERS = {
    "nv_inference_request_success": ("requests", 1.0),
    "nv_inference_request_failure": ("failures", 1.0),
    "nv_inference_count": ("inferences", 1.0),
    "nv_inference_exec_count": ("executions", 1.0),
    "nv_inference_request_duration_us": ("request_s", 1e-6),
    "nv_inference_queue_duration_us": ("queue_s", 1e-6),
    "nv_inference_compute_input_duration_us": ("compute_input_s", 1e-6),
    "nv_inference_compute_infer_duration_us": ("compute_infer_s", 1e-6),
    "nv_inference_compute_output_duration_us": ("compute_output_s", 1e-6),
}
# its latency summaries (`--metrics-config summary_latencies=true`): quantiles over its
# recent window
SUMMARY = "nv_inference_request_summary_us"
QUANTILES = {"0.5": "latency_p50_s", "0.95": "latency_p95_s", "0.99": "latency_p99_s"}
PENDING = "nv_inference_pending_request_count"


@dataclass(frozen=True)
class Endpoint:
    """A Triton server of the job: its pid and metrics URL (host an IP address)."""

    pid: int
    url: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_METRICS_PORT


def _flag(args: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in a command line (the last one)."""
    found = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(name + "="):
            found = a.split("=", 1)[1]
    return found


def metrics_url(args: list[str]) -> str | None:
    """The metrics endpoint of a `tritonserver` command line; None when it turns metrics off.
    ValueError when the port is not a number or the address not an IP address."""
    got = metrics_address(args)
    if got is None:
        return None
    host, port = got
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{METRICS_PATH}"


def metrics_address(args: list[str]) -> tuple[str, int] | None:
    """(IP address, port) of a `tritonserver` command line's metrics; None when metrics are
    off; ValueError when either is not what Triton itself would take."""
    if (_flag(args, "--allow-metrics") or "true").lower() in ("false", "0", "off", "no"):
        return None
    raw_port = _flag(args, "--metrics-port") or str(DEFAULT_METRICS_PORT)
    if not (raw_port.isascii() and raw_port.isdigit() and 0 < int(raw_port[:6]) < 65536):
        raise ValueError(f"--metrics-port {raw_port[:40]!r} is not a port number")
    host = (_flag(args, "--metrics-address") or "").strip("[]")
    if unspecified(host):  # every interface: this box's loopback is one of them
        return "127.0.0.1", int(raw_port)
    try:
        return str(ipaddress.ip_address(host)), int(raw_port)
    except ValueError:
        raise ValueError(f"--metrics-address {host[:40]!r} is not an IP address") from None


def scrape(endpoint: Endpoint) -> str:
    """The body of one GET of /metrics at the endpoint (no redirects followed, at most
    MAX_SCRAPE_BYTES): OSError or ValueError when there is none."""
    body = http_get(endpoint.host, endpoint.port, METRICS_PATH, SCRAPE_TIMEOUT_S, MAX_SCRAPE_BYTES)
    return body.decode("utf-8", "replace")


def find_server(pid: int) -> tuple[int, list[str]] | None:
    """The `tritonserver` process among `pid`, its descendants (PyTriton starts one) and its
    ancestors (a Python backend's stub runs under one): (its pid, command line)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *_processes(descendants(pid)), *root.parents()]
    except psutil.Error:
        return None
    for p in procs:
        try:
            if p.name() == SERVER_NAME or p.exe().rsplit("/", 1)[-1] == SERVER_NAME:
                return p.pid, p.cmdline()
        except psutil.Error:
            continue
    return None


def _processes(pids: list[int]) -> list[psutil.Process]:
    """The processes of `pids` still running."""
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return out


def _cpu_s(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.Error:
        return -1.0
    return t.user + t.system


def model_process(pid: int) -> int | None:
    """The busiest Python backend stub of the Triton server `pid` (its Python models run
    there; py-spy reads it); None when `pid` is not a tritonserver or runs none yet."""
    try:
        proc = psutil.Process(pid)
        if proc.name() != SERVER_NAME:
            return None
        stubs = [k for k in proc.children(recursive=True) if is_stub(k)]
    except psutil.Error:
        return None
    return max(stubs, key=_cpu_s).pid if stubs else None


def is_stub(p: psutil.Process) -> bool:
    """A Python backend stub, by its name (the kernel keeps 15 characters of it) or exe."""
    try:
        name = p.name()
        if name == STUB_NAME or (len(name) == 15 and STUB_NAME.startswith(name)):
            return True
        return p.exe().rsplit("/", 1)[-1] == STUB_NAME
    except psutil.Error:
        return False


def parse_metrics(
    text: str,
    keep: set[tuple[str, str]] | None = None,
    max_models: int = MAX_MODELS,
    skipped: list[int] | None = None,
) -> dict[tuple[str, str], dict[str, float]]:
    """Triton's metrics text as {(model, version): {field: value}}: the counters summed over
    their other labels (a failure's reason), the pending gauge, the latency quantiles. At
    most `max_models` pairs, those of `keep` (already followed) first; the samples of the
    others are counted in `skipped[0]`."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    room = max(0, max_models - len(keep or ()))
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            model = s.labels.get("model")
            # the parser names a counter's samples NAME_total, a summary's NAME_count/_sum
            if model is None or s.name not in (fam.name, fam.name + "_total"):
                continue
            key = (model, s.labels.get("version", ""))
            if key not in out and not (keep and key in keep):
                if room <= 0:
                    if skipped is not None:
                        skipped[0] += 1
                    continue
                room -= 1
            name = _field_of(fam.name, s.labels)
            if name is None:
                continue
            scale = COUNTERS[fam.name][1] if fam.name in COUNTERS else 1e-6
            row = out.setdefault(key, {})
            row[name] = row.get(name, 0.0) + float(s.value) * (1.0 if name == "pending" else scale)
    return out


def _field_of(name: str, labels: dict[str, str]) -> str | None:
    if name in COUNTERS:
        return COUNTERS[name][0]
    if name == PENDING:
        return "pending"
    if name == SUMMARY:
        return QUANTILES.get(labels.get("quantile", ""))
    return None


@dataclass
class Interval:
    """One model's counters between two scrapes, held back one scrape so that an interval
    inside a busy stretch (both neighbours busy: the whole interval served) is told from the
    stretch's edges."""

    t_ns: int
    labels: dict[str, str]
    values: dict[str, float | None]
    busy_before: bool = False


def deltas(prev: dict[str, float], cur: dict[str, float]) -> dict[str, float] | None:
    """The counters' growth between two scrapes; None when one went back (the server or
    the model restarted: counting starts again)."""
    out = {}
    for name, _scale in COUNTERS.values():
        d = cur.get(name, 0.0) - prev.get(name, 0.0)
        if d < -1e-9:
            return None
        out[name] = d
    return out


class TritonProbe(Probe):
    """Scrapes a Triton server's metrics each tick into per-model intervals: requests,
    failures, inferences and executions (the batch per execution), the time requests spent
    in the server, queued, and in the model; the requests pending; its latency quantiles."""

    name = "triton"
    interval_s = 0.5
    fields = (
        Field("requests", "count", "counter", "requests served in the interval (label model)"),
        Field("failures", "count", "counter", "requests failed in the interval"),
        Field("inferences", "count", "counter", "items inferred (a batch's rows each)"),
        Field("executions", "count", "counter", "model executions (one per batch run)"),
        Field("request_s", "s", "counter", "requests' time in the server, summed"),
        Field("queue_s", "s", "counter", "requests' time queued for the model, summed"),
        Field("compute_input_s", "s", "counter", "time moving inputs to the model, summed"),
        Field("compute_infer_s", "s", "counter", "time in the model's execution, summed"),
        Field("compute_output_s", "s", "counter", "time moving outputs back, summed"),
        Field("interval_s", "s", "gauge", "the interval's length"),
        Field("busy_s", "s", "gauge", "the length of an interval with requests served"),
        Field("steady_requests", "count", "counter", "requests of an interval inside traffic"),
        Field("steady_s", "s", "gauge", "the length of an interval inside traffic"),
        Field("pending", "count", "gauge", "requests received and not yet executing"),
        Field("latency_p50_s", "s", "gauge", "Triton's own request latency median"),
        Field("latency_p95_s", "s", "gauge", "Triton's own request latency p95"),
        Field("latency_p99_s", "s", "gauge", "Triton's own request latency p99"),
    )

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._root: int | None = None
        self.endpoint: Endpoint | None = None
        self._off: str | None = None  # why the server's metrics cannot be read
        self._next_find = 0.0
        self._give_up = 0.0
        self._prev: dict[tuple[str, str], tuple[int, dict[str, float]]] = {}
        self._held: dict[tuple[str, str], Interval] = {}
        self._errors: list[str] = []
        self._scrapes = 0
        self._checked_at = 0.0  # when the server was last seen listening on the port
        self._last_skipped = 0  # samples of models past MAX_MODELS in the last scrape

    def open(self, target: Target) -> ProbeStatus:
        """Look for the server now; a job that starts it later (PyTriton) is looked at again."""
        self._root = target.pid
        self._give_up = now_ns() / 1e9 + FIND_FOR_S
        self._find()
        return ProbeStatus(self.name, True)

    def applies(self) -> bool:
        """Whether the job runs a Triton server (a probe that found none is not reported)."""
        return self.endpoint is not None or self._off is not None

    def _find(self) -> None:
        if self._root is None or self.endpoint is not None or self._off is not None:
            return
        self._next_find = now_ns() / 1e9 + FIND_EVERY_S
        got = find_server(self._root)
        if got is None:
            return
        pid, args = got
        try:
            addr = metrics_address(args)
        except ValueError as exc:
            self._off = f"the Triton server's metrics address is not used: {exc}"
            return
        if addr is None:
            self._off = "the Triton server runs with --allow-metrics=false"
            return
        host, port = addr
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}{METRICS_PATH}"
        self.endpoint = Endpoint(pid, url, host, port)

    def sample(self) -> list[Sample]:
        """Scrape once; the intervals that the scrape completes (one scrape late)."""
        if self.endpoint is None:
            now = now_ns() / 1e9
            if self._next_find <= now < self._give_up:
                self._find()
            if self.endpoint is None:
                return []
        t = now_ns()
        ep = self.endpoint
        if t / 1e9 - self._checked_at > FIND_EVERY_S:  # the port is still the server's own
            if not listens_on(ep.pid, ep.host, ep.port):
                self._problem(f"pid {ep.pid} does not listen on {ep.host}:{ep.port}: not scraped")
                return []
            self._checked_at = t / 1e9
        try:
            skipped: list[int] = [0]
            rows = parse_metrics(scrape(ep), set(self._prev), skipped=skipped)
            self._last_skipped = skipped[0]
        except Exception as exc:  # the server stopping, a refused, slow or too large scrape
            self._problem(f"scraping {ep.url}: {exc}")
            return []
        if self._last_skipped:
            self._problem(f"over {MAX_MODELS} models: only the first {MAX_MODELS} are read")
        self._scrapes += 1
        out: list[Sample] = []
        for key, cur in rows.items():
            out.extend(self._interval(key, t, cur))
        return out

    def _interval(self, key: tuple[str, str], t: int, cur: dict[str, float]) -> list[Sample]:
        """The previous interval of a model, now that its next neighbour is known."""
        labels = {"model": key[0], "version": key[1]}
        gauges = {k: cur[k] for k in ("pending", *QUANTILES.values()) if k in cur}
        prev = self._prev.get(key)
        self._prev[key] = (t, cur)
        out = [Sample(self.name, t, labels, dict(gauges))] if gauges else []
        d = deltas(prev[1], cur) if prev is not None else None
        if prev is None or d is None:  # a restart: the interval held is the last before it
            held = self._held.pop(key, None)
            return out + ([Sample(self.name, held.t_ns, held.labels, held.values)] if held else [])
        busy = d["requests"] > 0
        vals: dict[str, float | None] = {**d, "interval_s": (t - prev[0]) / 1e9}
        if busy:
            vals["busy_s"] = vals["interval_s"]
        held = self._held.get(key)
        held_busy = held is not None and (held.values.get("requests") or 0) > 0
        self._held[key] = Interval(t, labels, vals, busy_before=held_busy)
        if held is None:
            return out
        if held.busy_before and held_busy and busy:
            held.values["steady_requests"] = held.values["requests"]
            held.values["steady_s"] = held.values["interval_s"]
        return out + [Sample(self.name, held.t_ns, held.labels, held.values)]

    def _problem(self, text: str) -> None:
        if len(self._errors) < 5 and text not in self._errors:
            self._errors.append(text)

    def close(self) -> None:
        """Emit nothing more: an interval still held is the traffic's last, partial one."""
        self._held.clear()

    def problems(self) -> list[str]:
        """Scrapes that failed."""
        return list(self._errors)

    def final_status(self) -> ProbeStatus | None:
        """Whether the server's counters were read, and if not why and how to get them."""
        if self._off is not None:
            return ProbeStatus(
                self.name,
                False,
                self._off,
                "start tritonserver with --allow-metrics=true (PyTriton: "
                "TritonConfig(allow_metrics=True)) for its request counters",
            )
        if self.endpoint is not None and not self._scrapes:
            return ProbeStatus(
                self.name,
                False,
                f"no answer from {self.endpoint.url}",
                "check --metrics-port and --metrics-address of the tritonserver command",
            )
        return None
