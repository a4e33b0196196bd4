"""End to end: what `run`, `attach` and `report` print: parseable, explained, escaped, and honest
about a job that never got going."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from gpudiag.agent.output.render.text import render_markdown
from gpudiag.agent.output.report import load_report, validate
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
