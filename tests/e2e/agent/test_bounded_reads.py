"""End to end: the files gpudiag reads go through one bounded reader: never from a device or a fifo,
never another user's dump or segment, a recording's lines bounded before they are parsed."""

from __future__ import annotations

import os
import subprocess
import time

from gpudiag.probes.stacks.pyspy_output import SourceLines
from tests.agent.test_write_targets import NOBODY, root_only


@root_only
def test_a_source_file_the_job_could_not_read_is_not_copied(tmp_path):
    """As root, a frame naming a root-only file copied it into the recording."""
    secret = tmp_path / "shadow.py"
    secret.write_text("root_password = 'hunter2'\n")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    job = subprocess.Popen(
        ["sleep", "30"],
        preexec_fn=lambda: (os.setgid(NOBODY), os.setuid(NOBODY)),
    )
    try:
        time.sleep(0.3)
        assert SourceLines().line(job.pid, f"f ({secret}:1)") == ""
        secret.chmod(0o644)
        assert SourceLines().line(job.pid, f"f ({secret}:1)") == "root_password = 'hunter2'"
    finally:
        job.kill()
        job.wait()
