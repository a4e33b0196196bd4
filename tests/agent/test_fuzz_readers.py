"""Fuzzing the readers of what users hand gpudiag (reports, recordings, baselines, config
files) and of the hooks' channel: any input gives a result or one UsageError, never a crash.

Every crash hypothesis found is kept below as a plain regression test (`test_regression_*`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.gate import decide, load_baseline, load_gate_config
from gpudiag.agent.commands.replay import replay_report
from gpudiag.agent.output import recording
from gpudiag.agent.output.report import load_report
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.inprocess.channel import decode_datagram, parse_message

FIXTURE = Path(__file__).parents[1] / "fixtures" / "h100" / "ckpt.jsonl.gz"

# the normal suite replays the same examples every run (stable CI); set
# GPUDIAG_FUZZ_EXAMPLES=2000 to hunt for new crashes with fresh random ones
DEEP = os.environ.get("GPUDIAG_FUZZ_EXAMPLES")

FUZZ = settings(
    max_examples=int(DEEP or 40),
    derandomize=not DEEP,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


def _tmp(data: bytes, suffix: str) -> str:
    f = tempfile.NamedTemporaryFile(suffix=suffix, delete=False)
    f.write(data)
    f.close()
    return f.name


def _refused_or_read(fn, *args):
    """Call a reader: it returns, or raises UsageError with a one-line message."""
    try:
        return fn(*args)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)
        return None


# ---- reports ----------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _valid_report() -> dict:
    return replay_report(str(FIXTURE), load_settings(None))


@FUZZ
@given(st.binary(max_size=400))
def test_report_reader_bytes(data):
    _refused_or_read(load_report, _tmp(data, ".json"))


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "run",
                    "metrics",
                    "findings",
                    "environment",
                    "probes",
                    "breakdown",
                    "schema_version",
                    "cost",
                    "verdict",
                    "errors",
                ]
            ),
            junk,
        ),
        max_size=4,
    )
)
def test_report_reader_mutated_report(mutations):
    doc = json.loads(json.dumps(_valid_report()))
    for key, value in mutations:
        doc[key] = value
    path = _tmp(json.dumps(doc).encode(), ".json")
    got = _refused_or_read(load_report, path)
    if got is not None:  # a report that loads can be rendered
        from gpudiag.agent.output.render.text import render_markdown, render_text

        render_text(got)
        render_markdown(got)


# ---- recordings -------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _fixture_lines() -> list[dict]:
    with gzip.open(FIXTURE, "rt") as f:
        lines = [json.loads(line) for line in f]
    return lines[:600] + lines[-1:]  # the header, every probe's first ticks, the footer


def _mutate(obj: dict, where: str, key: str, value) -> None:
    if where == "values" and isinstance(obj.get("values"), dict) and obj["values"]:
        name = sorted(obj["values"])[hash(key) % len(obj["values"])]
        obj["values"][name] = value
    elif where == "labels" and isinstance(obj.get("labels"), dict) and obj["labels"]:
        name = sorted(obj["labels"])[hash(key) % len(obj["labels"])]
        obj["labels"][name] = value
    else:
        obj[where] = value


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=600),
            st.sampled_from(
                [
                    "values",
                    "labels",
                    "t_ns",
                    "probe",
                    "run",
                    "environment",
                    "footer",
                    "probes",
                    "errors",
                    "start",
                    "segment",
                ]
            ),
            st.text(max_size=3),
            junk,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_recording_reader_mutated_samples(mutations):
    lines = json.loads(json.dumps(_fixture_lines()))
    for index, where, key, value in mutations:
        _mutate(lines[index % len(lines)], where, key, value)
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    path = _tmp(gzip.compress(text.encode(), compresslevel=1), ".jsonl.gz")
    doc = _refused_or_read(replay_report, path, load_settings(None))
    if doc is not None:
        from gpudiag.agent.output.report import validate

        validate(doc)  # what replay made is a valid report


@lru_cache(maxsize=1)
def _windows_lines() -> list[dict]:
    """A windows-layout recording (the default) of the fixture's first samples."""
    from gpudiag.agent.output.recording import Recorder, sample_of

    path = tempfile.NamedTemporaryFile(suffix=".jsonl.gz", delete=False).name
    rec = Recorder(path, {"run": {"command": ["python", "t.py"], "pid": 1}}, layout="windows")
    lines = _fixture_lines()
    rec.write([sample_of(x, "fixture") for x in lines[1:-1]])
    rec.close({"probes": [], "errors": []})
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def _mutate_deep(obj, path: list[int], value) -> None:
    """Replace one value somewhere inside a JSON object (chosen by `path`)."""
    for step in path:
        kids = sorted(obj) if isinstance(obj, dict) else list(range(len(obj)))
        if not kids:
            return
        key = kids[step % len(kids)]
        if not isinstance(obj[key], (dict, list)) or not obj[key]:
            obj[key] = value
            return
        obj = obj[key]


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=50),
            st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=5),
            junk,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_windows_recording_reader_mutated(mutations):
    lines = json.loads(json.dumps(_windows_lines()))
    for index, where, value in mutations:
        _mutate_deep(lines[index % len(lines)], where, value)
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    path = _tmp(gzip.compress(text.encode(), compresslevel=1), ".jsonl.gz")
    doc = _refused_or_read(replay_report, path, load_settings(None))
    if doc is not None:
        from gpudiag.agent.output.report import validate

        validate(doc)


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_recording_reader_bytes(data, compress):
    raw = gzip.compress(data) if compress else data
    _refused_or_read(replay_report, _tmp(raw, ".jsonl.gz"), load_settings(None))


# ---- baselines ---------------------------------------------------------------------------
@FUZZ
@given(json_values, st.booleans())
def test_baseline_reader(runs, as_baseline):
    doc = (
        {"format": "gpudiag-gate-baseline", "version": 1, "runs": runs, "fingerprint": {}}
        if as_baseline
        else runs
    )
    path = _tmp(json.dumps(doc).encode(), ".json")
    got = _refused_or_read(load_baseline, path)
    if got is not None:
        cfg = load_gate_config(None, cwd=Path(tempfile.gettempdir()))
        base_runs, fp = got
        _refused_or_read(decide, cfg, base_runs, fp, base_runs, fp)


# ---- config files ------------------------------------------------------------------------
def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


toml_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
)

NAMES = sorted(Thresholds.names())[:12] + ["nope", "category", "function", "file", "code"]


@FUZZ
@given(
    st.dictionaries(st.sampled_from(NAMES + ["rules", "prices", "thresholds"]), toml_scalars),
    st.dictionaries(st.sampled_from(NAMES), toml_scalars),
    st.lists(
        st.dictionaries(
            st.sampled_from(["category", "function", "file", "code", "x"]),
            st.one_of(st.sampled_from(["data_wait", "checkpoint", "(", "a.b"]), toml_scalars),
        ),
        max_size=3,
    ),
    st.dictionaries(st.text(min_size=1, max_size=5), toml_scalars, max_size=3),
)
def test_config_reader(top, thresholds, rules, prices):
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in top.items()]
    lines.append("[thresholds]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in thresholds.items()]
    lines.append("[prices]")
    lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in prices.items()]
    for rule in rules:
        lines.append("[[rules]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in rule.items()]
    path = _tmp("\n".join(lines).encode(), ".toml")
    _refused_or_read(load_settings, path)


@FUZZ
@given(st.binary(max_size=200))
def test_config_reader_bytes(data):
    _refused_or_read(load_settings, _tmp(data, ".toml"))


# ---- the hooks' channel ------------------------------------------------------------------
@FUZZ
@given(json_values, st.binary(max_size=200))
def test_hooks_datagrams_are_data_only(head, body):
    """A malformed datagram is dropped; it never raises in the probe's thread."""
    msg = decode_datagram(json.dumps(head).encode() + b"\n" + body)
    if msg is not None:
        parse_message(msg)


@pytest.mark.parametrize(
    "datagram",
    [
        b'{"width": "x"}\n' + b"\0" * 8,
        b'{"width": -1}\n' + b"\0" * 8,
        b'{"steps": [["a", 1, 2, 3, 4, 5, 6, 7, 8]]}\n',
        b'{"sites": [1, 2]}\n',
        b'{"mem": {"allocated": "lots"}}\n',
    ],
)
def test_regression_hooks_datagrams(datagram):
    msg = decode_datagram(datagram)
    if msg is not None:
        parse_message(msg)


# ---- crashes hypothesis found, kept as regression tests -------------------------------------
@pytest.mark.parametrize(
    "text, words",
    [
        (b"\xff\xfe[thresholds]", "not UTF-8"),
        (b"[tool]\ngpudiag = 3\n", "[tool.gpudiag] must be a table"),
        (b"thresholds = 3\n", "[thresholds] must be a table"),
        (b"rules = 3\n", "rules must be an array of tables"),
    ],
)
def test_regression_config_files(tmp_path, text, words):
    path = tmp_path / "c.toml"
    path.write_bytes(text)
    with pytest.raises(UsageError, match=__import__("re").escape(words)):
        load_settings(str(path))


@pytest.mark.parametrize("value", ["", "0", [], {"a": 1}, True])
@pytest.mark.parametrize("line", [1, 367])  # a GPU tick; a stack row (count, episodes)
def test_regression_recording_values_that_are_not_numbers(tmp_path, value, line):
    lines = json.loads(json.dumps(_fixture_lines()))
    name = sorted(lines[line]["values"])[0]
    lines[line]["values"][name] = value
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(json.dumps(x) for x in lines) + "\n").encode()))
    with pytest.raises(UsageError, match=f"line {line + 1}: value '{name}' is not a number"):
        replay_report(str(path), load_settings(None))


def test_regression_recording_keeps_nan_values(tmp_path):
    """NaN is what a probe writes for an unmeasured GPM counter: not refused, as live."""
    rec = _refused_or_read(replay_report, str(FIXTURE), load_settings(None))
    assert rec is not None and rec["findings"]


@pytest.mark.parametrize(
    "value", [9.223372036854776e27, 9.223372036854774e27, 2.534023007991795e20]
)
def test_regression_windows_recording_with_times_out_of_range(value):
    lines = json.loads(json.dumps(_windows_lines()))
    _mutate_deep(lines[1], [0], False)
    _mutate_deep(lines[1], [3, 1], value)
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    path = _tmp(gzip.compress(text.encode()), ".jsonl.gz")
    doc = _refused_or_read(replay_report, path, load_settings(None))  # was OverflowError
    if doc is not None:
        from gpudiag.agent.output.report import validate

        validate(doc)


def test_regression_baseline_with_text_metrics(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(
        json.dumps(
            {
                "format": "gpudiag-gate-baseline",
                "version": 1,
                "runs": [{"steps_per_s": "fast"}],
                "fingerprint": {},
            }
        )
    )
    with pytest.raises(UsageError, match="malformed"):
        load_baseline(str(path))


def test_regression_baseline_with_nan_metrics_is_refused(tmp_path):
    """Issue 23 #6: `steps_per_second: NaN` in a baseline passed the gate (+nan%)."""
    path = tmp_path / "b.json"
    runs = [{"steps_per_s": float("nan")}]
    path.write_text(
        json.dumps({"format": "gpudiag-gate-baseline", "runs": runs, "fingerprint": {}})
    )
    with pytest.raises(UsageError, match="non-finite number NaN"):
        load_baseline(str(path))


def _gz_lines(tmp_path: Path, lines: list[bytes]) -> str:
    path = tmp_path / "r.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        for line in lines:
            f.write(line + b"\n")
    return str(path)


def test_regression_gzip_bomb_line_is_refused_at_the_line_bound(tmp_path, monkeypatch):
    """Issue 23 #5: a 4 MB gzip holding one 4 GiB line took 8 GB before it was refused.
    Here: a 4 MiB line against a lowered 256 KiB bound (memory stays near the bound)."""
    monkeypatch.setattr(recording, "MAX_LINE_BYTES", 256 * 1024)
    header = json.dumps(_fixture_lines()[0]).encode()
    path = _gz_lines(tmp_path, [header, b'{"probe": "' + b"x" * (4 << 20) + b'"}'])
    with pytest.raises(UsageError, match="line 2 is longer than 262144 bytes"):
        replay_report(path, load_settings(None))


def test_regression_decompressed_size_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(recording, "MAX_UNZIPPED_BYTES", 64 * 1024)
    lines = [json.dumps(x).encode() for x in _fixture_lines()]
    with pytest.raises(UsageError, match="more than 65536 bytes decompressed"):
        replay_report(_gz_lines(tmp_path, lines), load_settings(None))


def test_regression_distinct_stack_table_is_bounded(tmp_path, monkeypatch):
    """Issue 23 #5: a recording of distinct long stacks was accepted at 3.2 GB."""
    lines = _windows_lines()
    entries = sum(len(x.get("new") or []) for x in lines)
    assert entries > 4
    monkeypatch.setattr(recording, "MAX_TABLE_ENTRIES", 4)
    path = _gz_lines(tmp_path, [json.dumps(x).encode() for x in lines])
    with pytest.raises(UsageError, match="more than 4 distinct keys, threads and stacks"):
        replay_report(path, load_settings(None))


@given(st.text(max_size=80))
def test_mcp_and_otlp_addresses(text):
    """--http ADDR:PORT, --otlp ENDPOINT and a report named to an MCP tool: a value or one
    UsageError line, nothing else."""
    from gpudiag.agent.commands.mcp import parse_http
    from gpudiag.agent.commands.mcp_tools import McpConfig, report_path
    from gpudiag.agent.fleet.otlp import metrics_url

    for read in (parse_http, metrics_url, lambda t: report_path(McpConfig(Path(".")), t)):
        try:
            read(text)
        except UsageError as exc:
            assert "\n" not in str(exc)
