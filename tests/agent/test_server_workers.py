"""Which GPU a server's process uses, read from the devices it holds open (procfs only)."""

from __future__ import annotations

import os

from gpudiag.agent.session.workers import gpu_devices


def _proc(tmp_path, pid: int, targets: list[str]) -> str:
    fds = tmp_path / str(pid) / "fd"
    fds.mkdir(parents=True)
    for i, target in enumerate(targets):
        os.symlink(target, fds / str(i))  # a link to a device that need not exist here
    return str(tmp_path)


def test_the_nvidia_devices_a_process_holds_are_its_gpus(tmp_path):
    proc = _proc(
        tmp_path,
        42,
        ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidia1", "/dev/nvidia3"],
    )
    assert gpu_devices(42, proc) == (1, 3)  # the control devices are no GPU


def test_a_process_without_a_gpu_or_gone_has_none(tmp_path):
    proc = _proc(tmp_path, 7, ["/dev/null", "socket:[123]", "/tmp/nvidia0"])
    assert gpu_devices(7, proc) == ()
    assert gpu_devices(8, proc) == ()  # no such process
