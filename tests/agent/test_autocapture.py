"""gpudiag asks for a capture by itself, once, when the top GPU finding rests on NVML alone."""

from __future__ import annotations

from types import SimpleNamespace

from gpudiag.agent.session.autocapture import AUTO_CAPTURE_STEPS, AutoCapture, nvml_only_verdict


def analysis(*findings) -> SimpleNamespace:
    return SimpleNamespace(
        findings=[SimpleNamespace(id=i, severity=s, signals=sig) for i, s, sig in findings]
    )


def test_only_a_gpu_finding_on_nvml_signals_asks_for_a_capture():
    assert nvml_only_verdict(analysis(("GPU003", "error", ("nvml gpm",)))) == "GPU003"
    assert nvml_only_verdict(analysis(("GPU001", "warning", ("nvml utilization",)))) == "GPU001"
    # the stacks back it up already, or it is not about the GPU, or it is only a note
    assert (
        nvml_only_verdict(analysis(("GPU001", "warning", ("nvml utilization", "stacks")))) is None
    )
    assert nvml_only_verdict(analysis(("DATA001", "error", ("nvml utilization",)))) is None
    assert nvml_only_verdict(analysis(("MEM001", "note", ("nvml memory",)))) is None
    assert nvml_only_verdict(analysis()) is None


class FakeSession:
    def __init__(self, verdict, messages=3, gpu=True, capture_steps=None):
        self.capture_steps = capture_steps
        self.probes = [SimpleNamespace(name="hooks", messages=messages, captures=True)]
        self.statuses = {"gpu": SimpleNamespace(available=gpu)}
        self.verdict = verdict
        self.asked: list[int] = []
        self.logged: list[str] = []

    def snapshot(self):
        return analysis(self.verdict)

    def request_capture(self, steps):
        self.asked.append(steps)
        return f"capture of {steps} steps asked for"

    def log(self, line):
        self.logged.append(line)


def test_asks_once_when_due_and_never_again():
    now = [0.0]
    s = FakeSession(("GPU003", "error", ("nvml gpm",)))
    auto = AutoCapture(s, clock=lambda: now[0])
    assert auto.tick() is None  # too early: the loop has not shown its verdict yet
    now[0] = 25.0
    assert "GPU003 rests on NVML alone" in auto.tick()
    now[0] = 100.0
    assert auto.tick() is None
    assert s.asked == [AUTO_CAPTURE_STEPS] and len(s.logged) == 1


def test_no_capture_without_hooks_gpu_or_with_a_host_verdict():
    now = [25.0]
    for s in (
        FakeSession(("GPU003", "error", ("nvml gpm",)), messages=0),
        FakeSession(("DATA001", "error", ("stacks",))),
        FakeSession(("GPU003", "error", ("nvml gpm",)), gpu=False),
    ):
        auto = AutoCapture(s, clock=lambda: now[0])
        auto.next_check = 0.0
        assert auto.tick() is None and s.asked == []


def test_attach_capture_steps_is_asked_as_soon_as_the_job_connects():
    s = FakeSession(("DATA001", "error", ("stacks",)), messages=0, capture_steps=7)
    auto = AutoCapture(s, clock=lambda: 0.0)
    assert auto.tick() is None  # the job's hooks have not connected yet
    s.probes[0].messages = 1
    assert auto.tick() == "capture of 7 steps asked for"
    assert s.asked == [7] and s.capture_steps is None
    assert auto.tick() is None and s.asked == [7]
