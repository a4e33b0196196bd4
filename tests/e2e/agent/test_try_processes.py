"""`gpudiag try` ends the job it launched, never the pid a report names."""

from __future__ import annotations

import subprocess
import sys

from tests.agent.test_write_targets import FIXTURE


def test_try_ends_the_job_it_launched_not_the_pid_a_report_names(tmp_path, monkeypatch):
    """`try` re-read the report it wrote and killed the PID it named: in a shared folder
    another user chose which process root killed."""
    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.commands import run, tryfix
    from gpudiag.agent.commands.replay import replay_report
    from gpudiag.agent.output.report import write_report

    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    victim, job = subprocess.Popen(sleep), subprocess.Popen(sleep)
    doc = replay_report(str(FIXTURE), load_settings(None))
    doc["run"]["pid"] = victim.pid  # what a planted or rewritten report names

    def fake_run(opts, on_launch, on_report):
        on_launch(job.pid)
        write_report(doc, opts.out)
        on_report(doc)  # run hands try the report as computed
        return 0

    monkeypatch.setattr(run, "main", fake_run)
    args = tryfix.TryOptions(out=str(tmp_path / "d.json"), diagnose_seconds=1.0)
    try:
        tryfix.diagnose_first(["python", "x.py"], args)
        assert job.wait(timeout=15) is not None
        assert victim.poll() is None, "the PID the report named was killed"
    finally:
        for p in (victim, job):
            p.kill()
            p.wait()
