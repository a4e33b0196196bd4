"""Crafted input and bad option values (review adversarial-6, section 3): each is one line and
exit 2, or the output it should be; never an internal error."""

from __future__ import annotations

import pytest

from tests.conftest import gpudiag


@pytest.mark.parametrize(
    "argv, words",
    [
        # X08: a 5,000-digit value was "internal error: ValueError: Exceeds the limit"
        (["try", "--fix", "batch:factor=" + "9" * 5000, "--", "false"], "whole number"),
        # X09: passed, then killed the poller thread with an OverflowError and exited 0
        (["watch", "--interval", "1e300", "--duration", "1"], "--interval"),
        # X10: the recording replaced the job's log (the job's output lost)
        (
            ["run", "--tui", "--out", "{tmp}/c.json", "--record", "{tmp}/c.job.log", "--", "true"],
            "name the same file",
        ),
    ],
)
def test_one_line_and_exit_2(tmp_path, argv, words):
    res = gpudiag(*[a.format(tmp=tmp_path) for a in argv], timeout=120)
    assert res.returncode == 2, res.stderr[-400:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "internal error" not in lines[0]
    assert not (tmp_path / "c.job.log").exists()


def test_gpudiags_own_words_are_not_taken_for_secrets():
    """X07: "expected KEY=***" and "internal error: KeyError: ***" (the key a bug report
    needs): the sink's redaction rewrote gpudiag's own messages."""
    from gpudiag.text.redact import redact_text

    res = gpudiag("try", "--fix", "batch:=2", "--", "false", timeout=60)
    assert res.returncode == 2 and "expected name=value, got '=2'" in res.stderr
    res = gpudiag("try", timeout=60)
    assert "***" not in res.stderr and "NAME=VALUE" in res.stderr
    assert redact_text("internal error: KeyError: 'ts'") == "internal error: KeyError: 'ts'"
    assert redact_text("torch.TokenizerError: 'x'") == "torch.TokenizerError: 'x'"
    assert redact_text("KEY=abc --api-key s") == "KEY=*** --api-key ***"  # a job's still hidden


# ---- V19-V22: crafted, schema-valid reports and recordings ---------------------------------
FIXTURE = "tests/fixtures/h100/ckpt.jsonl.gz"


@pytest.fixture(scope="module")
def rich_report(tmp_path_factory):
    import json

    out = tmp_path_factory.mktemp("rich") / "rich.json"
    res = gpudiag("replay", FIXTURE, "--out", str(out), timeout=300)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(out.read_text())


MUTATIONS = [
    (("phases", "startup_top", 0, "share"), None),  # V19, V20
    (("phases", "startup_top", 0, "share"), "x"),
    (("cost", "idle"), {}),  # V19: cost.available without what it needs
    (("cost", "if_fixed", "expected_speedup"), ["x"]),
    (("right_size", "basis"), {}),
    (("environment", "gpus"), ["x"]),  # N39, V21
    (("findings", 0, "cost"), {"usd_per_day": "lots"}),
]


def _set(doc: dict, path: tuple, value: object) -> dict:
    import copy

    doc = copy.deepcopy(doc)
    d = doc
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value", MUTATIONS)
def test_a_crafted_report_is_one_line_never_an_internal_error(
    rich_report, tmp_path, capsys, path, value
):
    import json

    from gpudiag.agent.output.report import validate

    doc = _set(rich_report, path, value)
    validate(doc)  # schema-valid: only the types are wrong
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    from gpudiag.agent.cli.main import main

    for argv in (
        ["report", str(bad)],
        ["report", str(bad), "--format", "html"],
        ["report", str(bad), "--format", "markdown", "--trace", str(tmp_path / "t.json")],
        ["merge", str(bad), str(bad)],
        ["gate", str(bad), "--baseline", str(bad)],
    ):
        capsys.readouterr()
        code = main(argv)
        err = capsys.readouterr().err
        assert "internal error" not in err, (argv, err)
        assert code in (0, 1, 2, 3), (argv, code, err[-300:])


def test_a_crafted_windows_recording_is_one_line(tmp_path):
    """V22: `windows.gil[1] = [[]]` (TypeError in a merge) and a key number of -1 (the
    table's last entry, read as another key) gave internal errors in replay."""
    import gzip
    import json

    from gpudiag.agent.base.errors import UsageError
    from gpudiag.agent.output.recording import open_recording, read_recording
    from tests.agent.test_recording_windows import FIXTURES, record_windows

    src = tmp_path / "w.jsonl.gz"
    record_windows(read_recording(str(FIXTURES / "starved.jsonl.gz"))[1], src)
    lines = gzip.open(src, "rt").read().splitlines()
    objs = [json.loads(ln) for ln in lines]
    for change in ("gil", "key"):
        field = "windows" if change == "gil" else "series"
        row = next(i for i, o in enumerate(objs) if i and o.get(field))
        obj = json.loads(lines[row])
        if change == "gil":
            mode = next(iter(obj["windows"]))
            obj["windows"][mode][2] = [[]]
        else:
            obj["series"][0][0] = -1
        bad = tmp_path / f"{change}.jsonl.gz"
        with gzip.open(bad, "wt") as f:
            f.write("\n".join(lines[:row] + [json.dumps(obj)] + lines[row + 1 :]) + "\n")
        with pytest.raises(UsageError, match="not a timeline window"):
            open_recording(str(bad)).timeline()


CAPTURE = {
    "device": "cuda:0",
    "steps": [{"start_s": 0.0, "dur_s": 0.1, "busy_s": 0.05, "idle_s": 0.05}],
    "window_s": 1.0,
    "checks": [{"finding": "XFER001", "confirms": True, "statement": "s"}],
    "events": [{"name": "aten::mm", "ts": 0.0, "dur": 0.1}],
}


@pytest.mark.parametrize(
    "change, valid",
    [
        ({"checks": -1}, False),  # V19: html TypeError
        ({"checks": [{"finding": "XFER001", "statement": "s"}]}, False),  # N39: KeyError
        ({"start_s_run": [1]}, True),  # V19: the exports
        ({"start_s_run": "x", "events": [{"name": "no ts"}]}, True),  # V19, N47
    ],
)
def test_a_crafted_capture_is_one_line_never_an_internal_error(
    rich_report, tmp_path, capsys, change, valid
):
    """V19 and N39's capture shapes (`capture.checks = -1`, a check without `confirms`, a
    `start_s_run` that is a list or a string, events without `ts`): refused by the schema in
    one line, or rendered, in the text, html and trace renderers, merge and gate."""
    import json

    from gpudiag.agent.cli.main import main

    doc = _set(rich_report, ("capture",), {**CAPTURE, **change})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    for argv in (
        ["report", str(bad)],
        ["report", str(bad), "--format", "html"],
        ["report", str(bad), "--format", "markdown", "--trace", str(tmp_path / "t.json")],
        ["merge", str(bad), str(bad)],
        ["gate", str(bad), "--baseline", str(bad), "--out", str(tmp_path / "g.json")],
    ):
        capsys.readouterr()
        code = main(argv)
        err = capsys.readouterr().err
        assert "internal error" not in err, (argv, err)
        if valid:
            assert code in (0, 1, 3), (argv, code, err[-300:])
        else:
            assert code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
            assert "not a valid gpudiag report" in err and "capture/checks" in err
