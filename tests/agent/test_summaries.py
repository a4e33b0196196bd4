"""What `run`, `attach` and `report` print: parseable, explained, escaped, and honest about a
job that never got going."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from markdown_it import MarkdownIt

from gpudiag.agent.output.render.text import render_markdown, render_text
from gpudiag.agent.output.report import load_report, validate, write_report
from tests.agent.test_report import make_doc
from tests.conftest import gpudiag


def test_run_format_json_stdout_is_the_report_alone(tmp_path):
    out = tmp_path / "r.json"
    res = gpudiag(
        "run",
        "-q",
        "--format",
        "json",
        "--out",
        str(out),
        "--",
        sys.executable,
        "-c",
        "print('epoch 1 loss 0.5'); print('{not json')",
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # the job's prints do not end up in it
    assert doc == load_report(str(out))
    assert "epoch 1 loss 0.5" in res.stderr and "Report written to" in res.stderr


def test_run_format_markdown_keeps_the_job_output_apart(tmp_path):
    res = gpudiag(
        "run",
        "-q",
        "--format",
        "markdown",
        "--out",
        str(tmp_path / "r.json"),
        "--",
        sys.executable,
        "-c",
        "print('hello from ' + 'the job')",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("### gpudiag") and "hello from the job" not in res.stdout
    assert "hello from the job" in res.stderr


def test_format_help_says_where_the_job_output_goes(cli):
    for command in ("run", "attach", "report", "replay"):
        res = cli(command, "--help")
        text = " ".join(res.stdout.split())
        # report and replay also render the HTML page
        choices = "{text,markdown,json,html}" if command in ("report", "replay") else None
        choices = choices or "{text,markdown,json}"
        assert f"--format {choices}" in text
        described = text.rsplit(f"--format {choices}", 1)[1].split(" --")[0]
        assert "markdown" in described and "json" in described, command
    assert "job's own stdout is sent to stderr" in " ".join(cli("run", "--help").stdout.split())


def test_short_summary_keeps_the_evidence_line():
    text = render_text(make_doc(), verbose=False)  # what run and attach print
    assert "Why: data_wait_share = 60.0% (>= data_wait_warn 10.0%) [stacks]" in text
    assert "Evidence:" not in text  # the full list stays in `gpudiag report`


def test_markdown_escapes_names_from_the_users_code(tmp_path, cli):
    doc = make_doc()
    f = doc["findings"][0]
    f["message"] = "Most time is in SpectrogramDataset.__getitem__ (*slow* | [io])"
    f["recommendation"]["actions"].append("cache the output of __getitem__")
    f["location"] = "data.py:12:SpectrogramDataset.__getitem__"
    md = render_markdown(doc)
    html = MarkdownIt("gfm-like").render(md)
    assert "<strong>getitem</strong>" not in html and "<em>" not in html
    assert "SpectrogramDataset.__getitem__ (*slow* | [io])" in html
    assert "cache the output of __getitem__" in html
    assert "<code>data.py:12:SpectrogramDataset.__getitem__</code>" in html
    path = write_report(doc, tmp_path / "r.json")
    assert cli("report", str(path), "--format", "markdown").stdout == md


def test_job_that_crashes_at_once_says_so_with_its_stderr(tmp_path):
    out = tmp_path / "r.json"
    res = gpudiag(
        "run",
        "-q",
        "--out",
        str(out),
        "--",
        sys.executable,
        str(tmp_path / "nope.py"),
        cwd=tmp_path,
    )
    assert res.returncode == 2  # the job's exit code, passed through
    assert "No diagnosis: the job exited with code 2 after " in res.stdout
    assert "before its training loop started" in res.stdout
    assert "profile longer" not in res.stdout
    tail = res.stdout.split("Last lines of the job's stderr:")[1]
    assert "nope.py" in tail and "No such file or directory" in tail
    assert "No such file or directory" in res.stderr  # still shown live, too
    doc = load_report(str(out))
    validate(doc)
    assert any("nope.py" in ln for ln in doc["run"]["stderr_tail"])
    assert "before its training loop started" in render_markdown(doc)


def test_traceback_tail_is_the_last_lines(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(
        "import sys\nfor i in range(100):\n    print(f'noise {i}', file=sys.stderr)"
        "\nraise RuntimeError('CUDA out of memory (planted)')\n"
    )
    res = gpudiag("run", "-q", "--out", str(tmp_path / "r.json"), "--", sys.executable, str(script))
    assert res.returncode == 1
    tail = res.stdout.split("Last lines of the job's stderr:")[1].splitlines()
    assert any("RuntimeError: CUDA out of memory (planted)" in ln for ln in tail)
    assert not any("noise 10 " in ln + " " for ln in tail)  # only the last lines


def test_job_left_running_keeps_a_working_stderr(tmp_path):
    done = tmp_path / "done"
    script = (
        f"import sys, time\nfor i in range(40):\n    print('tick', i, file=sys.stderr, "
        f"flush=True)\n    time.sleep(0.1)\nopen({str(done)!r}, 'w').write('ok')\n"
    )
    res = gpudiag(
        "run",
        "-q",
        "--duration",
        "1",
        "--out",
        str(tmp_path / "r.json"),
        "--",
        sys.executable,
        "-c",
        script,
    )
    assert res.returncode == 0, res.stderr
    assert "keeps running" in res.stderr
    deadline = time.monotonic() + 20
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert done.exists()  # writing to stderr after gpudiag left did not break the job


def test_plain_attach_shows_the_hooks_as_information(tmp_path):
    out = tmp_path / "r.json"
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        res = gpudiag(
            "attach", str(job.pid), "-q", "--duration", "2", "--out", str(out), timeout=60
        )
    finally:
        job.kill()
        job.wait()
    assert res.returncode == 0, res.stderr
    assert "degraded" not in res.stdout
    assert "hooks info" in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("hooks:"))
    assert "from gpudiag.probes.hooks import instrument; instrument()" in line
    assert "steps/s" in line
    hooks = next(p for p in load_report(str(out))["probes"] if p["name"] == "hooks")
    assert hooks["available"] and hooks["info"] is True


def test_a_job_gone_during_a_slow_start_up_never_reached_its_loop():
    """On a busy box py-spy can catch the interpreter starting (a few samples, all "other")
    before a job that cannot open its script exits: still no loop, not "5 samples of 150"."""
    from gpudiag.agent.output.render.text import no_diagnosis_line

    doc = {
        "run": {"end_reason": "target_exited", "exit_code": 2, "duration_s": 0.9},
        "breakdown": {"samples": 5, "shares": {"other": 1.0, "forward": 0.0}},
        "thresholds": {"min_loop_samples": 150},
        "probes": [{"name": "stacks", "available": True}],
        "metrics": {"steps": None},
    }
    assert no_diagnosis_line(doc).endswith("before its training loop started.")
    doc["breakdown"]["shares"] = {"other": 0.4, "forward": 0.6}  # it was in its loop
    assert "with 5 loop samples (150 needed)" in no_diagnosis_line(doc)
