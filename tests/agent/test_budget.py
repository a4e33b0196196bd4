"""The agent's cost budget: the governor lowers and restores sampling rates from measured cost."""

from __future__ import annotations

import pytest

from gpudiag.agent.session.budget import Budget, Governor, default_cpu_budget
from gpudiag.probes.base import Probe


class FakeProbe(Probe):
    """An adaptive probe whose rates follow the level, like the stack probe's."""

    name, adaptive = "stacks", True

    def __init__(self) -> None:
        self.level = 1.0
        self.shed = 0

    def set_level(self, level: float) -> None:
        self.level = level

    def rates(self) -> dict[str, float]:
        return {"stacks_loop_hz": max(10.0, round(100 * self.level))}

    def shed_memory(self) -> None:
        self.shed += 1


class World:
    """Fake time and a CPU cost proportional to the probe's rate (plus a fixed part)."""

    def __init__(self, probe: FakeProbe, per_hz: float, fixed: float = 0.002) -> None:
        self.t = 0.0
        self.cpu = 0.0
        self.probe, self.per_hz, self.fixed = probe, per_hz, fixed
        self.rss = 50 * 2**20

    def advance(self, seconds: float) -> None:
        rate = self.probe.rates()["stacks_loop_hz"]
        self.cpu += seconds * (self.fixed + rate * self.per_hz)
        self.t += seconds


def governed(per_hz: float) -> tuple[Governor, FakeProbe, World]:
    probe = FakeProbe()
    world = World(probe, per_hz)
    gov = Governor(
        Budget(0.03, 150 * 2**20),
        [probe],
        period_s=3.0,
        clock=lambda: world.t,
        cpu_reader=lambda: world.cpu,
        rss_reader=lambda: world.rss,
    )
    gov._t0 = gov._prev_t = 0.0
    return gov, probe, world


def run(gov: Governor, world: World, seconds: float) -> float:
    """Advance in governor periods; return the cost over the last half."""
    half_cpu = half_t = None
    steps = int(seconds / gov.period_s)
    for i in range(steps):
        world.advance(gov.period_s)
        gov.step()
        if i == steps // 2:
            half_cpu, half_t = world.cpu, world.t
    return (world.cpu - half_cpu) / (world.t - half_t)


def test_an_expensive_job_gets_lower_rates_within_the_budget():
    # 0.6 ms of py-spy per sample at 100 Hz = 6% of a core: twice the budget
    gov, probe, world = governed(per_hz=0.0006)
    cost = run(gov, world, 120)
    assert cost <= 0.03
    assert 20 <= probe.rates()["stacks_loop_hz"] <= 50
    s = gov.summary()
    assert s["cpu_budget_cores"] == 0.03 and s["cpu_cores"] <= 0.035
    loop = s["rates"]["stacks_loop_hz"]
    assert loop["max"] == 100 and loop["min"] < 50 and loop["min"] <= loop["mean"] <= 100
    assert s["periods_over_budget"] >= 1


def test_a_cheap_job_keeps_the_configured_rates():
    gov, probe, world = governed(per_hz=0.0001)  # 1% of a core at 100 Hz
    run(gov, world, 60)
    assert probe.rates()["stacks_loop_hz"] == 100 and gov.adjustments == 0


def test_rates_come_back_when_the_job_gets_cheaper():
    gov, probe, world = governed(per_hz=0.0012)
    run(gov, world, 60)
    low = probe.rates()["stacks_loop_hz"]
    world.per_hz = 0.0001  # the job's threads went away
    run(gov, world, 120)
    assert probe.rates()["stacks_loop_hz"] > 2 * low


def test_over_the_memory_budget_caches_are_dropped_and_it_is_reported():
    gov, probe, world = governed(per_hz=0.0001)
    world.rss = 200 * 2**20
    run(gov, world, 12)
    assert probe.shed >= 1
    s = gov.summary()
    assert s["rss_over_budget"] is True and s["peak_rss_bytes"] == 200 * 2**20


def test_the_level_is_kept_within_bounds():
    gov, probe, _ = governed(per_hz=0.0001)
    gov.set_level(-1.0)
    assert probe.level == pytest.approx(0.05)
    gov.set_level(5.0)
    assert probe.level == 1.0


class FloorProbe(FakeProbe):
    """The stack probe's rates: 100 Hz at level 1, never below 5 Hz."""

    def rates(self) -> dict[str, float]:
        return {"stacks_loop_hz": max(5.0, round(100 * self.level))}


def looked(startup_s: float, loop_s: float, verdict_samples: int) -> tuple[float, Governor, World]:
    """A look at a busy job (100 Hz would cost 8% of a core): `startup_s` of a `run`'s start-up
    (stacks twice as dear) and then `loop_s` of the loop; the loop samples taken in the loop."""
    probe = FloorProbe()
    world = World(probe, per_hz=0.0008)
    loop = 0.0
    gov = Governor(
        Budget(0.03, 150 * 2**20),
        [probe],
        period_s=1.0,
        verdict_samples=verdict_samples,
        loop_samples=lambda: loop,  # as the session counts them: inside the loop window
        clock=lambda: world.t,
        cpu_reader=lambda: world.cpu,
        rss_reader=lambda: world.rss,
    )
    gov._t0 = gov._prev_t = 0.0
    gov.set_level(0.03 * 0.7 * 0.7 / 0.08)  # a first guess below the budget
    for i in range(int(startup_s + loop_s)):
        in_loop = i >= startup_s
        world.per_hz = 0.0008 if in_loop else 0.0016
        rate = probe.rates()["stacks_loop_hz"]
        loop += rate if in_loop else 0.0
        world.advance(1.0)
        gov.step()
    return loop, gov, world


def test_run_and_attach_get_comparable_loop_samples():
    # the same 15 s of loop, seen from its start-up (`run`) and attached to (`attach`)
    run_loop, _, _ = looked(startup_s=10, loop_s=15, verdict_samples=150)
    attach_loop, _, _ = looked(startup_s=0, loop_s=15, verdict_samples=150)
    assert run_loop >= 0.85 * attach_loop, (run_loop, attach_loop)
    # without the verdict-first phase the start-up's cost is paid back out of the loop
    old_run, _, _ = looked(startup_s=10, loop_s=15, verdict_samples=0)
    assert old_run < 0.85 * attach_loop


def test_the_budget_buys_the_verdicts_samples_first():
    # a 15 s look at a busy job reaches the samples a verdict needs (150 of the loop thread)
    loop, gov, _ = looked(startup_s=0, loop_s=15, verdict_samples=150)
    assert loop >= 150
    old, _, _ = looked(startup_s=0, loop_s=15, verdict_samples=0)
    assert old < loop
    assert gov.summary()["verdict_samples"] == 150


def test_once_the_verdict_is_sure_sampling_tapers_within_the_budget():
    loop, gov, world = looked(startup_s=0, loop_s=60, verdict_samples=150)
    s = gov.summary()
    assert s["verdict_samples_at_s"] is not None and s["verdict_samples_at_s"] < 15
    assert world.cpu / world.t <= 0.03  # a 60 s look still averages inside the budget
    loop_hz = s["rates"]["stacks_loop_hz"]
    assert loop_hz["last"] <= 0.95 * loop_hz["max"]  # tapered after the verdict's samples


def test_a_probe_added_while_running_gets_the_goal_and_level_the_first_got():
    """A late rank's stack probe is added after the governor is built: it used to start with
    no CPU goal and at full rate, whatever the budget had set the others to."""
    gov, probe, world = governed(per_hz=0.0006)
    run(gov, world, 120)
    assert gov.level < 1.0  # the expensive job was turned down
    late = FakeProbe()
    gov.adopt(late)
    assert late.level == gov.level
    assert late.cpu_goal == pytest.approx(probe.cpu_goal) and late.cpu_goal is not None


def test_a_loop_mostly_in_user_code_counts_its_samples_for_the_verdict():
    """An inference loop that tokenises inline (HOST001): no stack window is mostly loop
    work, so there is no loop window and the analyzers take the whole run. The governor
    must count those samples too, or --until-sure never stops (measured: a sure HOST001 on
    2,397 samples ran to its 70 s --duration)."""
    from gpudiag.agent.session.budget import loop_window_samples
    from gpudiag.analyzers import analyze
    from gpudiag.analyzers.measures.rules import Classifier
    from tests.analyzers.scenario import Scenario

    sc = Scenario()
    for _ in range(3):
        sc.window({"other": 0.85, "forward": 0.15}, ticks=100)
    got = loop_window_samples(sc.tl, Classifier(()))
    assert got == analyze(sc.tl).profile.samples == 300


@pytest.mark.parametrize(
    "cores, budget", [(None, 0.03), (1, 0.03), (2, 0.03), (4, 0.06), (16, 0.24), (64, 0.5)]
)
def test_the_default_budget_is_a_share_of_the_box(cores, budget):
    # 3% of one core starved py-spy on a 16-core H100 box (47 stack samples in 22 s)
    assert default_cpu_budget(cores) == budget


class PacedProbe(FakeProbe):
    """A probe at its lowest rates that rests between windows (the stacks of a job with
    1,500 threads under watch): what it costs during a rest says nothing of a higher rate."""

    def __init__(self) -> None:
        super().__init__()
        self.resting = True

    def paced(self) -> bool:
        return self.resting


def test_the_level_is_never_raised_while_a_probe_is_paced():
    probe = PacedProbe()
    world = World(probe, per_hz=0.0)  # a rest costs nothing: the governor sees room
    gov = Governor(
        Budget(0.03, 150 * 2**20),
        [probe],
        clock=lambda: world.t,
        cpu_reader=lambda: world.cpu,
        rss_reader=lambda: world.rss,
    )
    gov._t0 = gov._prev_t = 0.0
    gov.set_level(0.05)
    run(gov, world, 60)
    assert probe.level == pytest.approx(0.05) and gov.adjustments == 0
    probe.resting = False  # back to its rates: the room is used again
    run(gov, world, 60)
    assert probe.level > 0.05 and gov.adjustments > 0
