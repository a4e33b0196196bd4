"""Guards inside the job: the in-process hooks never break it (instrument(), a nested tensor batch,
a stale try fix in the environment, a forked child's steps kept apart from its parent's)."""

from __future__ import annotations

import json
import os
import sys

from tests.conftest import gpudiag


def _job(script: str, tmp_path, env: dict | None = None, under_run: bool = False):
    """Run `script` as a job (under `gpudiag run` when `under_run`); its completed process."""
    import os
    import subprocess

    env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-c", script]
    if under_run:
        out = str(tmp_path / "r.json")
        return gpudiag("run", "-q", "--out", out, "--", *cmd, env=env, cwd=tmp_path, timeout=180)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_instrument_never_breaks_the_job(tmp_path):
    """instrument() -> _install and the CUDA install were unguarded: a torch that does not
    look as the hooks expect raised into the user's script."""
    breaks = {
        "optimizer hook": "import torch.optim.optimizer as o\n"
        "del o.register_optimizer_step_post_hook",
        "cuda": "torch.cuda.is_available = lambda: True; del torch.cuda.synchronize",
    }
    for what, broken in breaks.items():
        script = (
            f"import torch\n{broken}\n"
            "from gpudiag.probes.hooks import instrument\ninstrument()\nprint('job ran')\n"
        )
        res = _job(script, tmp_path)
        assert res.returncode == 0 and "job ran" in res.stdout, (what, res.stderr)
        assert "not installed" in res.stderr


def test_a_nested_tensor_batch_does_not_crash_the_job(tmp_path):
    """The DataLoader wrapper read `.shape` unguarded: a nested-tensor loader crashed on its
    first batch under the default hooks."""
    script = (
        "import torch, warnings\nwarnings.simplefilter('ignore')\n"
        "from gpudiag.probes.hooks import instrument\ninstrument()\n"
        "nt = lambda b: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])\n"
        "odd = type('Odd', (), {'shape': property(lambda s: 1 / 0)})\n"
        "for collate in (nt, lambda b: {'x': odd()}, lambda b: [odd()]):\n"
        "    loader = torch.utils.data.DataLoader(range(4), batch_size=2, collate_fn=collate)\n"
        "    for batch in loader:\n"
        "        pass\n"
        "print('job ran')\n"
    )
    res = _job(script, tmp_path)
    assert res.returncode == 0 and "job ran" in res.stdout, res.stderr


def test_a_stale_try_fix_in_the_environment_changes_no_ordinary_run(tmp_path):
    """A GPUDIAG_FIX / GPUDIAG_TRY_STEPS left in the environment skipped the job's
    checkpoints in an ordinary `gpudiag run` (fixes loaded with every hook install)."""
    stale = {
        "GPUDIAG_FIX": json.dumps({"kind": "checkpoint", "values": {"every": 1000}}),
        "GPUDIAG_TRY_STEPS": str(tmp_path / "gone" / "steps"),
    }
    script = (
        "import os, torch\ntorch.save({'a': 1}, 'a.pt')\ntorch.save({'b': 2}, 'b.pt')\n"
        "print('saved now:', os.path.exists('a.pt'))\n"
    )
    res = _job(script, tmp_path, env=stale, under_run=True)
    assert res.returncode == 0, res.stderr
    assert "saved now: True" in res.stdout + res.stderr and (tmp_path / "a.pt").exists()
    assert "gpudiag try:" not in res.stderr
    res = _job(script.replace("'a.pt'", "'c.pt'"), tmp_path, env=stale)  # instrument()-less
    assert "saved now: True" in res.stdout


def test_steps_of_a_forked_child_are_not_merged_with_the_parents(tmp_path):
    """Step datagrams from a forked child were merged with the parent's (50.8 steps/s
    reported for 19.1 true)."""
    import subprocess
    from array import array

    from gpudiag.probes.base import Target
    from gpudiag.probes.inject.gpudiag_hooks import STEP_WIDTH, _Channel
    from gpudiag.probes.inprocess.channel import HookProbe

    probe = HookProbe()
    assert probe.open(Target(0)).available
    try:

        def rows(n: int, t0: float) -> array:
            return array("d", [v for i in range(n) for v in (t0 + i, 0.05, 0, 8, 0, 0, 0, 0, 0)])

        head = {"v": 2, "width": STEP_WIDTH}
        assert _Channel(probe.path).send({**head, "pid": 1}, rows(3, 1000.0))
        child = (
            "import os, sys\nfrom array import array\n"
            "from gpudiag.probes.inject.gpudiag_hooks import _Channel\n"
            "row = lambda i: (2000.0 + i, 0.02, 0, 8, 0, 0, 0, 0, 0)\n"
            "rows = array('d', [v for i in range(5) for v in row(i)])\n"
            f"ok = _Channel({probe.path!r}).send({{'v': 2, 'width': 9, 'pid': 1}}, rows)\n"
            "sys.exit(0 if ok else 1)\n"
        )
        assert subprocess.run([sys.executable, "-c", child], timeout=60).returncode == 0
        steps = [s for s in probe.sample() if s.labels.get("kind") == "step"]
        assert len(steps) == 3 and probe.other_steps == 5  # the child's, though it claims pid 1
    finally:
        probe.close()


def test_the_profiled_process_steps_win_over_a_child_that_sent_first(tmp_path):
    """Issue 53 N16: the first process that sent steps was kept: a forked child stepping
    faster sent first, and the report showed its 87 steps/s for the profiled parent's 19."""
    import subprocess
    from array import array

    from gpudiag.probes.base import Target
    from gpudiag.probes.inject.gpudiag_hooks import STEP_WIDTH, _Channel
    from gpudiag.probes.inprocess.channel import HookProbe

    probe = HookProbe()
    assert probe.open(Target(0)).available
    probe.profiled = os.getpid()  # as the session sets it: the process it profiles
    child = (
        "import sys\nfrom array import array\n"
        "from gpudiag.probes.inject.gpudiag_hooks import _Channel\n"
        "row = lambda i: (2000.0 + i, 0.01, 0, 8, 0, 0, 0, 0, 0)\n"
        "rows = array('d', [v for i in range(5) for v in row(i)])\n"
        f"sys.exit(0 if _Channel({probe.path!r}).send({{'v': 2, 'width': 9}}, rows) else 1)\n"
    )
    try:
        assert subprocess.run([sys.executable, "-c", child], timeout=60).returncode == 0
        first = [s for s in probe.sample() if s.labels.get("kind") == "step"]
        assert len(first) == 5  # none from the profiled process yet: the child's are the loop's
        rows = array("d", [v for i in range(3) for v in (1000.0 + i, 0.05, 0, 8, 0, 0, 0, 0, 0)])
        assert _Channel(probe.path).send({"v": 2, "width": STEP_WIDTH}, rows)
        assert subprocess.run([sys.executable, "-c", child], timeout=60).returncode == 0
        steps = [s for s in probe.sample() if s.labels.get("kind") == "step"]
        assert [s.values["step_time_s"] for s in steps] == [0.05] * 3
        assert probe.loop_pid == os.getpid() and probe.other_steps == 5
    finally:
        probe.close()


def test_run_says_why_the_hooks_could_not_be_made_and_leaves_no_folder(tmp_path):
    """Issue 53 N76: under a long TMPDIR `run` dropped the hooks without a status (no hooks
    probe in the report, steps/s missing) and left its gpudiag-XXXX folder behind."""
    long = tmp_path / ("d" * 60) / ("e" * 60)
    long.mkdir(parents=True)
    out = tmp_path / "r.json"
    env = {**os.environ, "TMPDIR": str(long)}
    cmd = [sys.executable, "-c", "import time; time.sleep(2)"]
    res = gpudiag("run", "-q", "--out", str(out), "--", *cmd, env=env, cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stderr
    hooks = [p for p in json.loads(out.read_text())["probes"] if p["name"] == "hooks"]
    assert len(hooks) == 1 and not hooks[0]["available"], hooks
    assert "cannot create the hooks' socket" in hooks[0]["reason"] and "TMPDIR" in hooks[0]["hint"]
    assert not [p for p in long.iterdir() if p.name.startswith("gpudiag-")]
