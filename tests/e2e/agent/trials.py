"""What the `gpudiag try` tests share: a snippet run as an arm of a trial runs it (the try hooks
installed, the step log in a private folder beside the job's), and `gpudiag try` of a short
job (one short round of each arm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpudiag.probes.inprocess.channel import INJECT_DIR
from tests.conftest import gpudiag

HOOKED = "import torch, gpudiag_fixes\ngpudiag_fixes.install(torch)\n"
SHORT = ("--rounds", "1", "--seconds", "1.5", "--warmup", "0.5")  # one short round of each arm


def hooked(body: str) -> str:
    """`body` (indented as a test writes it) after the try hooks are installed."""
    return HOOKED + textwrap.dedent(body)


def steps_log(tmp_path: Path) -> Path:
    """The arm's step log: in a private folder beside the job's, not in it (made here)."""
    folder = tmp_path.parent / f"{tmp_path.name}-try"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / "steps"


def arm_env(fix: dict | None, steps: Path, guard: dict | None = None) -> dict[str, str]:
    """The environment the hooks of an arm read: the fix, the step log, the guard."""
    env = dict(os.environ, GPUDIAG_TRY_STEPS=str(steps), PYTHONPATH=INJECT_DIR)
    env.pop("GPUDIAG_FIX", None)
    if fix is not None:
        env["GPUDIAG_FIX"] = json.dumps(fix)
    if guard is not None:
        env["GPUDIAG_TRY_GUARD"] = json.dumps(guard)
    return env


def in_job(
    fix: dict | None,
    body: str,
    tmp_path: Path,
    guard: dict | None = None,
    script: str | None = None,
) -> tuple[subprocess.CompletedProcess, str]:
    """Run `body` (or `script` by runpy, as its own file) in a fresh interpreter with the try
    hooks installed as an arm would have them; (the completed process, the step log's text)."""
    steps = steps_log(tmp_path)
    if script is not None:
        (tmp_path / "job.py").write_text(textwrap.dedent(script))
        code = HOOKED + "import runpy\nrunpy.run_path('job.py', run_name='__main__')\n"
    else:
        code = hooked(body)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=arm_env(fix, steps, guard),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return out, steps.read_text() if steps.exists() else ""


def try_job(
    out: Path,
    *cmd: str,
    fix: str | None = None,
    first: tuple[str, ...] = (),
    arms: tuple[str, ...] = SHORT,
    timeout: float = 300,
    **kw: object,
) -> subprocess.CompletedProcess:
    """`gpudiag try` of `cmd` (with `--fix fix`, or `first` options such as a diagnosis' length),
    its arms as `arms` says (one short round of each by default); its trials written to `out`."""
    named = ("--fix", fix) if fix else ()
    return gpudiag(
        "try", *named, *first, *arms, "--out", str(out), "--", *cmd, timeout=timeout, **kw
    )
