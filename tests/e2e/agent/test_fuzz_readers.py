"""End to end: fuzzing the readers of what users hand gpudiag (reports, recordings, baselines,
config files) and of the hooks' channel: any input gives a result or one UsageError, never a crash.

Every crash hypothesis found is kept below as a plain regression test (`test_regression_*`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.commands.replay import replay_report
from tests.agent.test_fuzz_readers import (
    FIXTURE,
    _fixture_lines,
    _gz_lines,
    _refused_or_read,
    _windows_lines,
)
from tests.conftest import assert_one_line_error

# ---- hostile files (issue 23): every reader, run as the CLI, memory and time bounded ------
# One interpreter runs every hostile case below (main([...]) for each, as `gpudiag` runs it),
# its address space capped at 3 GiB and each case under its own time limit: a reader that
# follows /dev/zero or waits on a FIFO fails its test instead of taking the machine. One
# process for the 45 cases, not one each (each took about 0.5 s to start on a 2-core box).
BOUNDED = r"""
import contextlib, io, json, resource, signal, sys

resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from gpudiag.agent.cli.main import main


class Hung(BaseException):
    pass


def hung(signum, frame):
    raise Hung


signal.signal(signal.SIGALRM, hung)
results = {}
for key, argv in json.load(sys.stdin).items():
    out, err = io.StringIO(), io.StringIO()
    signal.alarm(int(sys.argv[1]))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    except Hung:
        code, err = "hung", io.StringIO("hung (a FIFO read?)")
    except MemoryError:
        code, err = "out of memory", io.StringIO("over the 3 GiB address space")
    finally:
        signal.alarm(0)
    results[key] = [code, out.getvalue(), err.getvalue()]
json.dump(results, sys.stdout)
"""

READERS = {  # reader: CLI arguments reading FILE
    "report": lambda f: ["report", f],
    "baseline": lambda f: ["gate", "--baseline", f, f],
    "merge": lambda f: ["merge", f, f],
    "recording": lambda f: ["replay", f],
    "config": lambda f: ["replay", str(FIXTURE), "--config", f],
    "prices": lambda f: ["replay", str(FIXTURE), "--prices", f],
}


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return str(path)


def _zero_link(tmp_path: Path) -> str:
    path = tmp_path / "zero.json"
    path.symlink_to("/dev/zero")
    return str(path)


MAKERS = {"fifo": _fifo, "link-to-dev-zero": _zero_link}


@pytest.mark.parametrize("make", list(MAKERS))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_regression_non_regular_files_are_refused_before_reading(bounded_cli_runs, reader, make):
    """Issue 23 #4: a link to /dev/zero grew gpudiag to 23 GB; a FIFO hung it forever."""
    res, _ = bounded_cli_runs[f"non-regular {reader} {make}"]
    assert_one_line_error(res, "not a regular file")


DEEP_JSON = b"[" * 100_000 + b"]" * 100_000

HUGE_INT = b'{"schema_version": "1.0", "n": ' + b"9" * 5000 + b"}"

JSON_CASES = {  # id: (the file, the words of its one-line error)
    "deep": (DEEP_JSON, "nested deeper"),
    "huge-int": (HUGE_INT, "integer of 5000 digits"),
    "nan": (b'{"schema_version": "1.0", "x": NaN}', "non-finite number NaN"),
    "-inf": (b'{"schema_version": "1.0", "x": -Infinity}', "non-finite number -Infinity"),
    "1e999": (b'{"schema_version": "1.0", "x": 1e999}', "out of range"),
}

JSON_READERS = ["report", "baseline", "merge"]


@pytest.mark.parametrize("reader", JSON_READERS)
@pytest.mark.parametrize("case", list(JSON_CASES))
def test_regression_json_readers_refuse_deep_huge_and_non_finite(bounded_cli_runs, reader, case):
    """Issue 23 #6, #7: each was an internal error, or NaN passed the gate on every metric."""
    res, path = bounded_cli_runs[f"json {reader} {case}"]
    assert_one_line_error(res, path, JSON_CASES[case][1])


TOML_CASES = {  # id: (the file, the words of its one-line error)
    "nan": ("[prices]\nH100 = nan\n", "out of range"),
    "inf": ("[prices]\nH100 = inf\n", "out of range"),
    "-inf": ("[prices]\nH100 = -inf\n", "out of range"),
    "huge-int": ("[prices]\nH100 = " + "9" * 5000 + "\n", "integer too large"),
    "deep-array": ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper"),
    "deep-table": ("a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", "nested deeper"),
}


@pytest.mark.parametrize("case", list(TOML_CASES))
@pytest.mark.parametrize("flag", ["--prices", "--config"], ids=["prices", "config"])
def test_regression_toml_readers_refuse_non_finite_huge_and_deep(bounded_cli_runs, case, flag):
    """Issue 23 #6, #7: "$nan/day"; deep TOML or a 5,000-digit integer was an internal error."""
    res, path = bounded_cli_runs[f"toml {flag} {case}"]
    assert_one_line_error(res, path, TOML_CASES[case][1])


LINE_CASES = {  # id: (the recording's second line, the words of its one-line error)
    "deep": (DEEP_JSON, "nested deeper"),
    "huge-int": (b'{"probe": "gpu", "t_ns": ' + b"1" * 5000 + b"}", "integer of 5000 digits"),
}


@pytest.mark.parametrize("case", list(LINE_CASES))
def test_regression_recording_lines_deep_or_huge(bounded_cli_runs, case):
    res, _ = bounded_cli_runs[f"line {case}"]
    assert_one_line_error(res, "line 2", LINE_CASES[case][1])


TIDS = ["abc", "12.5", [1], None]


def _wrong_tid(folder: Path, tid) -> str:
    lines = json.loads(json.dumps(_windows_lines()))
    for x in lines:
        for e in x.get("new") or []:
            if e[0] == "t":
                e[3] = tid
    return _gz_lines(folder, [json.dumps(x).encode() for x in lines])


@pytest.mark.parametrize("tid", TIDS)
def test_regression_recording_tid_of_the_wrong_type(bounded_cli_runs, tid):
    """Issue 23 #7: a `tid` of the wrong type is the user's bad input, not a crash."""
    res, path = bounded_cli_runs[f"tid {json.dumps(tid)}"]
    _refused_or_read(replay_report, path, load_settings(None))
    assert res.returncode in (0, 2) and "internal error" not in res.stderr, res.stderr


def _hostile_cases(folder: Path):
    """(case, its file, gpudiag's arguments) for every test above that reads a hostile file
    as the CLI does."""
    n = 0

    def fresh() -> Path:
        nonlocal n
        n += 1
        (folder / str(n)).mkdir()
        return folder / str(n)

    for reader in sorted(READERS):
        for make, fn in MAKERS.items():
            path = fn(fresh())
            yield f"non-regular {reader} {make}", path, READERS[reader](path)
    for case, (content, _) in JSON_CASES.items():
        path = fresh() / "bad.json"
        path.write_bytes(content)
        for reader in JSON_READERS:
            yield f"json {reader} {case}", str(path), READERS[reader](str(path))
    for case, (text, _) in TOML_CASES.items():
        path = fresh() / "bad.toml"
        path.write_text(text)
        for flag in ("--prices", "--config"):
            yield f"toml {flag} {case}", str(path), ["replay", str(FIXTURE), flag, str(path)]
    header = json.dumps(_fixture_lines()[0]).encode()
    for case, (line, _) in LINE_CASES.items():
        path = _gz_lines(fresh(), [header, line])
        yield f"line {case}", path, ["replay", path]
    for tid in TIDS:
        path = _wrong_tid(fresh(), tid)
        yield f"tid {json.dumps(tid)}", path, ["replay", path]


@pytest.fixture(scope="module")
def bounded_cli_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, str]]:
    """case -> (what gpudiag gave, as a CompletedProcess; the file it read), every case run by
    BOUNDED in one capped interpreter."""
    cases = {key: (path, argv) for key, path, argv in _hostile_cases(tmp_path_factory.mktemp("h"))}
    res = subprocess.run(
        [sys.executable, "-c", BOUNDED, "60"],
        input=json.dumps({key: argv for key, (_, argv) in cases.items()}),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout)
    return {
        key: (subprocess.CompletedProcess(["gpudiag", *argv], *got[key]), path)
        for key, (path, argv) in cases.items()
    }
