"""More bad input, refused before anything starts: one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import sys

import pytest

from gpudiag.agent.cli import main as cli
from tests.conftest import assert_one_line_error


@pytest.mark.parametrize(
    "args, words",
    [
        (["--duration", "inf"], "finite"),
        (["--duration", "1e400"], "finite"),
        (["--duration", "nan"], "finite"),
        (["--window", "0.01"], "0.5 to 60 seconds"),
        (["--window", "1e9"], "0.5 to 60 seconds"),
        (["--rate", "0"], "1..1000 Hz"),
        (["--rate", "1000000"], "1..1000 Hz"),
        (["--cpu-budget", "-1"], "0 to 100"),
        (["--cpu-budget", "nan"], "0 to 100"),
        (["--record-max-mb", "0.00001"], "1 to"),
        (["--price", "-2"], "must be a finite non-negative number"),
        (["--price", "nan"], "finite price"),
        (["--price", "inf"], "finite price"),
        (["--set", "no_such_threshold=1"], "unknown threshold"),
        (["--set", "data_wait_warn=2"], "share from 0 to 1"),
        (["--set", "data_wait_warn"], "name=value"),
    ],
)
def test_out_of_range_options(cli, args, words):
    assert_one_line_error(cli("run", *args, "--", sys.executable, "-c", "pass"), words)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["gate", "--baseline", "b.json", "--runs", "0", "--", "true"], "--runs must be at least"),
        (["gate", "--baseline", "b.json", "--warmup-steps", "-1", "--", "true"], "not negative"),
        (["attach", "12abc"], "PID must be a number"),
        (["attach", "0"], "PID must be positive"),
        (["attach", "-3"], "PID must be positive"),
        (["attach", "2"], "cannot attach"),  # kthreadd: a kernel thread, not Python
    ],
)
def test_bad_pids_and_counts(cli, argv, words):
    if argv[:2] == ["attach", "2"] and not os.path.exists("/proc/2/stat"):
        pytest.skip("no pid 2 in this PID namespace")
    assert_one_line_error(cli(*argv), words)


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("huge.json", b"{" + b" " * (1 << 20), "not a gpudiag report"),
        ("future.json", json.dumps({"schema_version": "9.0"}).encode(), "report schema '9.0'"),
        ("nul.json", b"\0" * 64, "not a gpudiag report"),
    ],
    ids=["huge", "future-major", "nul-bytes"],
)
def test_bad_report_files(cli, tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    assert_one_line_error(cli("report", str(path)), words)
    assert_one_line_error(cli("gate", "--baseline", str(path), str(path)), name)


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "no header"),
        (gzip.compress(b""), "no header"),
        (gzip.compress(b"not json\n"), "not JSON"),
        (gzip.compress(b'{"format": "gpudiag-recording", "version": 99}\n'), "format 99"),
        (gzip.compress(b'{"format": "gpudiag-recording", "version": 1, "run": 3}\n'), "header"),
        (gzip.compress(b"\xff\xfe\x00"), "not a gpudiag recording"),
        (gzip.compress(b'{"format": "gpudiag-recording", "version": 1}\n')[:-6], ""),
    ],
)
def test_bad_recordings(cli, tmp_path, content, words):
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(content)
    res = cli("replay", str(path))
    if words:
        assert_one_line_error(res, words)
    else:  # cut short while writing: replays what was complete
        assert res.returncode in (0, 2) and "Traceback" not in res.stderr


def test_runaway_report_file_is_not_read_into_memory(cli, tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(200 * 1024 * 1024)  # sparse: takes no disk space
    assert_one_line_error(cli("report", str(path)), "too large")
    assert_one_line_error(cli("gate", "--baseline", str(path), str(path)), "too large")


def test_recording_with_a_malformed_footer(cli, tmp_path):
    path = tmp_path / "r.jsonl.gz"
    lines = [
        {"format": "gpudiag-recording", "version": 1, "run": {"pid": 1, "command": ["x"]}},
        {"probe": "host", "t_ns": 1, "labels": {}, "values": {"cpu_util": 0.5}},
        {"footer": True, "probes": [{"name": 3}], "errors": []},
    ]
    path.write_bytes(gzip.compress("\n".join(json.dumps(x) for x in lines).encode()))
    assert_one_line_error(cli("replay", str(path)), "footer is malformed")


@pytest.mark.parametrize(
    "toml, words",
    [
        (b"\x89PNG\r\n\x1a\n\0\0", "not UTF-8"),
        (b"thresholds = [1, 2]\n", "[thresholds] must be a table"),
        (b"[tool]\ngpudiag = 'x'\n", "[tool.gpudiag] must be a table"),
        (b"rules = 'data_wait'\n", "array of tables"),
    ],
)
def test_bad_config_files(cli, tmp_path, toml, words):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(toml)
    assert_one_line_error(cli("run", "--config", str(cfg), "--", "true"), words)


def test_no_privilege_raising_code():
    """Nothing in gpudiag changes its user or calls sudo: the OS's rules decide what it reads."""
    from pathlib import Path

    root = Path(__file__).parents[2]
    forbidden = ("setuid(", "seteuid(", "setresuid(", "setgid(", '"sudo"', "'sudo'", "pkexec")
    for folder in ("agent", "probes", "analyzers", "tui"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            for word in forbidden:
                assert word not in text, f"{path}: {word}"


def test_an_internal_error_is_one_line(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("boom")

    command = cli.BY_NAME["thresholds"]
    monkeypatch.setitem(cli.BY_NAME, "thresholds", dataclasses.replace(command, main=broken))
    monkeypatch.delenv("GPUDIAG_DEBUG", raising=False)
    assert cli.main(["thresholds"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpudiag: internal error: RuntimeError: boom")
