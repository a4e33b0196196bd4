"""End to end: gpudiag's own frames (its DataLoader wrapper `_install.<locals>.__next__`) stay out
of the stacks, locations and exports, and out of the job's printed tracebacks (issue 26, item 5)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from gpudiag.probes.inprocess.channel import injection_env

JOB = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Broken(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            raise ValueError("bad sample " + str(i))

    from torch.utils.data import dataloader
    print(dataloader._BaseDataLoaderIter.__next__.__qualname__, flush=True)
    for batch in DataLoader(Broken(), batch_size=2):
        pass
    """
)


def test_the_jobs_traceback_has_no_gpudiag_frame(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = injection_env({"PATH": "/usr/bin:/bin"}, str(tmp_path / "no-agent.sock"))
    res = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    assert res.returncode == 1
    err = res.stderr
    assert "ValueError: bad sample 0" in err and "Traceback" in err, err[-3000:]
    assert res.stdout.strip() == "_install.<locals>.__next__"  # the hooks wrap DataLoader
    assert re.search(r'job\.py", line \d+, in <module>', err), err[-3000:]  # the user's loop
    assert "dataloader.py" in err and "__getitem__" in err  # torch's and the user's frames
    assert "gpudiag_hooks.py" not in err and "gpudiag" not in err.lower(), err[-3000:]
