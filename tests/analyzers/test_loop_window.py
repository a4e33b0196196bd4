"""The loop window of an inference job (forwards, no step, no request) from the hooks'
forwards: first to last; a warm-up forward or two followed by a pause is start-up; a loop
that pauses between bursts of forwards is still one loop; a Triton server's forwards are
not its span; the stack window in progress at the last forward is the loop's when its
samples are loop work."""

from __future__ import annotations

from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.measures.window import find_loop_window
from tests.analyzers.scenario import Scenario

S = 1_000_000_000


def _forwards(sc: Scenario, times_s: list[float]) -> Scenario:
    for t in times_s:
        sc._add_at(
            sc.t0 + int(t * S),
            "hooks",
            {"kind": "forward"},
            {"forward_time_s": 0.01, "forward_batch": 8.0, "forward_grad": 0.0},
        )
    return sc


def _loop(windows: int = 10) -> Scenario:
    sc = Scenario()
    for _ in range(windows):
        sc.window({"forward": 0.8, "other": 0.2})
    return sc


def _every(a: float, b: float, step: float) -> list[float]:
    return [a + i * step for i in range(int((b - a) / step))]


def _window(sc: Scenario):
    return find_loop_window(sc.tl, Classifier())


def test_an_inference_loop_spans_its_forwards():
    sc = _forwards(_loop(), _every(6.0, 26.0, 0.1))
    w = _window(sc)
    assert w.source == "in-process hooks (forwards)"
    assert w.start_ns == sc.t0 + 6 * S


def test_a_warm_up_forward_then_a_pause_is_start_up():
    """One forward (a model's sanity check), 10 s of set-up, then the loop: it starts at the
    first forward after the pause."""
    sc = _forwards(_loop(), [1.0, *_every(12.0, 28.0, 0.1)])
    assert _window(sc).start_ns == sc.t0 + 12 * S


def test_a_loop_that_pauses_between_bursts_is_one_loop():
    """100 forwards, a 6 s pause (reading the next file), 100 more: the first burst is no
    warm-up (half the forwards)."""
    sc = _forwards(_loop(), [*_every(2.0, 7.0, 0.05), *_every(13.0, 18.0, 0.05)])
    assert _window(sc).start_ns == sc.t0 + 2 * S


def test_a_triton_servers_forwards_are_not_its_span():
    sc = _forwards(_loop(), _every(6.0, 26.0, 0.1))
    sc._add_at(sc.t0 + 5 * S, "triton", {"model": "m", "version": "1"}, {"requests": 10.0})
    assert _window(sc).source != "in-process hooks (forwards)"


def test_too_few_forwards_leave_the_window_to_the_stacks():
    sc = _forwards(_loop(), [6.0, 20.0])
    assert _window(sc).source == "stacks"


def test_the_stack_window_in_progress_at_the_last_forward_is_the_loops_when_it_is_loop_work():
    """py-spy stamps a window when it ends: the one stamped at 21 s holds 18-21 s. The look
    stopped the job in its loop (its last window came seconds later): that window is the
    loop's; a job that left its loop (the next window its own shutdown work) ends at its
    last forward."""
    looping = Scenario()
    for _ in range(7):
        looping.window({"forward": 0.8, "other": 0.2})
    for _ in range(3):
        looping.window({"forward": 0.8, "other": 0.2}, ticks=0)  # stamped, no samples
    _forwards(looping, _every(3.0, 20.5, 0.1))
    assert _window(looping).end_ns == looping.t0 + 22 * S
    leaving = Scenario()
    for _ in range(6):
        leaving.window({"forward": 0.8, "other": 0.2})
    for _ in range(4):
        leaving.window({"other": 1.0})
    times = _every(3.0, 19.55, 0.1)  # the last at 19.4 s, in the window from 18 to 21 s
    _forwards(leaving, times)
    assert _window(leaving).end_ns == leaving.t0 + int(times[-1] * S)
