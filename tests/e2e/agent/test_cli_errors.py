"""End to end: bad input: one clear line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import assert_one_line_error, gpudiag


def test_attach_to_missing_pid(cli):
    assert_one_line_error(cli("attach", "4194000"), "no process with pid 4194000")


def test_attach_to_a_pid_that_is_not_a_number(cli):
    assert_one_line_error(cli("attach", "train.py"), "PID must be a number")


def test_attach_to_a_process_that_is_not_python():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        assert_one_line_error(
            gpudiag("attach", str(sleeper.pid), "--duration", "2"), "not a Python process"
        )
    finally:
        sleeper.kill()
        sleeper.wait()


def test_attach_without_ptrace_permission(tmp_path):
    if (
        shutil.which("setpriv") is None
        or not hasattr(__import__("os"), "geteuid")
        or __import__("os").geteuid() != 0
    ):
        pytest.skip("needs root and setpriv to run gpudiag as an unprivileged user")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        res = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                sys.executable,
                "-m",
                "gpudiag.agent.cli.main",
                "attach",
                str(job.pid),
                "--duration",
                "2",
                "--out",
                str(tmp_path / "r.json"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        if "No module named" in res.stderr or "Permission denied: '" in res.stderr:
            pytest.skip("the unprivileged user cannot read this Python environment")
        assert_one_line_error(res, "permission", "ptrace")
    finally:
        job.kill()
        job.wait()


def test_report_of_corrupt_file(cli, tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text('{"schema_version": "1.0", "tool": ')
    assert_one_line_error(cli("report", str(bad)), "not a gpudiag report", "invalid JSON")


def test_report_of_wrongly_typed_file(cli, tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text(
        json.dumps({"schema_version": "1.0", "tool": {"name": "gpudiag"}, "findings": "none"})
    )
    assert_one_line_error(cli("report", str(bad)), "not a valid gpudiag report")
    other = tmp_path / "list.json"
    other.write_text("[1, 2, 3]")
    assert_one_line_error(cli("report", str(other)), "not a gpudiag report")
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    assert_one_line_error(cli("report", str(binary)), "not a gpudiag report")


def test_report_of_missing_file(cli, tmp_path):
    assert_one_line_error(cli("report", str(tmp_path / "nope.json")), "not found")


def test_unknown_option(cli):
    assert_one_line_error(cli("attach", "1", "--frobnicate"), "unrecognized arguments")
    assert_one_line_error(cli("explode"), "invalid choice")


def test_command_that_cannot_start():
    assert_one_line_error(gpudiag("run", "--", "/no/such/trainer"), "cannot start")


def test_run_without_a_command(cli):
    assert_one_line_error(cli("run"), "needs a command")


@pytest.mark.parametrize(
    "args,word",
    [
        (["--duration", "-3"], "more than 0"),
        (["--duration", "soon"], "expected seconds"),
        (["--set", "no_such_threshold=1"], "unknown threshold"),
        (["--set", "data_wait_warn=lots"], "needs a number"),
        (["--out", "/no/such/dir/r.json"], "does not exist"),
        (["--metrics-port", "70000"], "0..65535"),
        (["--metrics-port", "http"], "expected a TCP port"),
    ],
)
def test_bad_profiling_options(cli, args, word):
    assert_one_line_error(cli("run", *args, "--", sys.executable, "-c", "pass"), word)


def test_bad_config_file(cli, tmp_path):
    cfg = tmp_path / "gpudiag.toml"
    cfg.write_text("[thresholds\n")
    assert_one_line_error(cli("run", "--config", str(cfg), "--", "true"), "not valid TOML")
    cfg.write_text('[[rules]]\ncategory = "teleport"\nfile = "x"\n')
    assert_one_line_error(cli("run", "--config", str(cfg), "--", "true"), "category must be one of")
