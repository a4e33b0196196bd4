"""Per-rank GPUs on a multi-GPU box (fake NVML with two devices): each rank's device found from
its CUDA context in NVML's process list (else LOCAL_RANK/CUDA_VISIBLE_DEVICES), its figures in
the rank rows, and a straggler slowed by its throttled GPU named as such."""

from __future__ import annotations

from gpudiag.agent.output.render.ranks import rank_lines
from gpudiag.agent.session.ranks.gpus import rank_device
from gpudiag.agent.session.ranks.rankset import RankSet
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import Sample, Target
from gpudiag.probes.dist.ranks import RankInfo
from gpudiag.probes.inprocess.channel import HookProbe
from tests.probes.fake_nvml import FakeGpu, const
from tests.probes.test_gpu_probe import probe_with, tick

PIDS = (2_000_001, 2_000_002)  # no such processes: NVML's process list alone places them


def hook_samples(collective_s: float, n: int = 30) -> list[Sample]:
    out = []
    for i in range(n):
        t = 10**12 + int(i * 0.1e9)
        out.append(Sample("hooks", t, {"kind": "step"}, {"step_time_s": 0.1}))
        c = {"collective_s": collective_s, "collectives": 1.0, "seq": float(i)}
        out.append(Sample("hooks", t, {"kind": "collective_step"}, c))
    return out


def two_rank_job(throttled: bool) -> RankSet:
    slow = {"hw_thermal": const(0.8)} if throttled else {}
    probe, clock, _ = probe_with(
        FakeGpu(uuid="GPU-a", job_pids=[PIDS[0]]),
        FakeGpu(uuid="GPU-b", job_pids=[PIDS[1]], throttle=slow, sm_clock=const(1100)),
    )
    assert probe.open(Target(PIDS[0])).available
    infos = [RankInfo(r, r, 2, PIDS[r], "h", None, "run:x") for r in (0, 1)]
    rs = RankSet(infos, infos[0], HookProbe())
    probe.extra_pids |= {PIDS[1]}  # what setup_ranks does: rank 1 is not rank 0's child
    tl = Timeline()
    for _ in range(5):
        tl.extend(tick(probe, clock))
    rs.gpu_probe, rs.main_timeline = probe, lambda: tl
    # rank 1 makes rank 0 wait 60 ms of every 100 ms step in collectives (hooks measured)
    rs.timelines[0].extend(hook_samples(0.06))
    rs.timelines[1].extend(hook_samples(0.005))
    return rs


def test_each_rank_gets_its_own_gpu_rows_from_nvmls_process_list():
    rs = two_rank_job(throttled=True)
    assert rs.gpu_probe.pid_devices == {PIDS[0]: 0, PIDS[1]: 1}
    _, section = rs.section(Thresholds())
    r0, r1 = section["ranks"]
    assert (r0["gpu"], r1["gpu"]) == ("0", "1") and r1["gpu_basis"] == "nvml"
    assert r0["gpu_stats"]["util_gpu"] == 0.95
    assert r1["gpu_stats"]["throttle_hw_thermal"] > 0.7 and r1["gpu_stats"]["sm_clock_mhz"] == 1100
    assert r0["gpu_stats"].get("throttle_hw_thermal", 0.0) == 0.0
    text = "\n".join(rank_lines({"ranks": section["ranks"], "distributed": section["distributed"]}))
    assert "1100/1980" in text and "hw_thermal 8" in text


def test_a_straggler_on_a_throttled_gpu_is_named_with_its_gpu():
    found, section = two_rank_job(throttled=True).section(Thresholds())
    f = next(f for f in found if f.id == "DIST001")
    assert "rank 1" in f.message and "its GPU 1 is throttled (hw_thermal" in f.message, f.message
    assert any(e.setting == "throttle_warn" for e in f.evidence)


def test_an_unthrottled_straggler_gpu_is_not_blamed():
    found, _ = two_rank_job(throttled=False).section(Thresholds())
    f = next(f for f in found if f.id == "DIST001")
    assert "throttled" not in f.message


def test_without_nvml_a_ranks_gpu_comes_from_its_environment():
    info = RankInfo(1, 1, 2, 77, "h", "3", "run:x")  # CUDA_VISIBLE_DEVICES=2,3 LOCAL_RANK=1
    assert rank_device(info, {}) == ("3", "env")
    assert rank_device(info, {77: 0}) == ("0", "nvml")


def test_the_tui_rank_rows_show_each_ranks_gpu_and_its_throttling():
    from gpudiag.tui.widgets import rank_rows

    _, section = two_rank_job(throttled=True).section(Thresholds())
    rows: list[tuple[str, list[str]]] = []
    rank_rows(section, lambda label, parts: rows.append((label, parts)))
    text = " | ".join(" ".join(p) for _, p in rows)
    assert "GPU 0 util 95%" in text and "GPU 1 util 95% hw_thermal 8" in text, text


def test_the_measured_share_survives_lost_datagrams():
    # the step events of rank 0 arrive for a third of the steps only (datagrams dropped on a
    # busy box); its collective rows carry their step's length, so its share stays 60%
    rs = two_rank_job(throttled=False)
    tl = Timeline()
    for i, s in enumerate(hook_samples(0.06)):
        if s.labels["kind"] == "collective_step":
            s.values["collective_step_s"] = 0.1
        if s.labels["kind"] == "collective_step" or i % 6 == 0:
            tl.extend([s])
    rs.timelines[0] = tl
    r0 = next(s for s in rs.stats(Thresholds()) if s.rank == 0)
    assert abs(r0.collective_share_hooks - 0.6) < 0.01
