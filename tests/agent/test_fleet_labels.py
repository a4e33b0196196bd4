"""Fleet labels read from a job's environment are bounded; the ptrace hint never
recommends setcap."""

from __future__ import annotations


def test_job_labels_from_the_jobs_environment_are_bounded():
    """A 5,000-character POD_NAME (or one holding escapes) went into every metric's labels."""
    from gpudiag.agent.fleet.identity import identity_from

    env = {
        "POD_NAME": "p" * 5000,
        "POD_NAMESPACE": "ns\x1b]0;x\x07\nfake",
        "SLURM_JOB_ID": "9" * 999,
    }
    ids = identity_from(1, ["python", "x" * 9000], "", env, "u", "h")
    assert len(ids["pod"]) <= 253 and len(ids["slurm_job_id"]) <= 253
    assert ids["namespace"] == "ns fake" and len(ids["command"]) <= 1024


def test_the_ptrace_hint_never_recommends_setcap():
    """`setcap cap_sys_ptrace+ep` on py-spy lets every local user read root's processes."""
    from gpudiag.probes.stacks.pyspy import PTRACE_HINT, diagnose_py_spy_error

    _, hint = diagnose_py_spy_error("Permission denied (os error 13)", 1)
    assert "setcap" not in PTRACE_HINT and "setcap" not in (hint or "")
    assert "ptrace_scope" in PTRACE_HINT
