"""'Sure' only when every check had its evidence: timed steps judge the data wait only."""

from __future__ import annotations

from gpudiag.analyzers import analyze, unjudged, verdict_of
from gpudiag.analyzers.engine.finalize import with_gpu_idle, with_more
from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.model.catalogue import new_finding
from gpudiag.analyzers.model.results import Evidence, Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds
from tests.analyzers.scenario import Scenario

HEALTHY = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "data_wait": 0.03, "other": 0.02}


def test_healthy_verdict_with_few_stacks_names_the_checks_it_could_not_judge():
    sc = Scenario()
    sc.window(HEALTHY, ticks=100)  # 100 loop stack samples of the 150 needed
    sc.host(0.3).process(0.95)
    a = analyze(sc.tl)
    assert a.findings == ()
    v = verdict_of(list(a.findings), a.profile.samples, 200.0, Thresholds(), ("checkpoint", "GIL"))
    assert v["sure"] is False
    assert "not judged: checkpoint, GIL" in v["statement"]
    # analyze() itself names them (200 timed steps would have made it "sure" before)
    th = Thresholds()
    # the checks whose share's interval still straddles their threshold at 100 samples
    assert set(unjudged(a.profile, th)) >= {"checkpoint", "storage", "GIL"}
    assert a.verdict["sure"] is False


def test_enough_stacks_judge_all_but_the_compute_of_a_healthy_loop():
    """Enough stacks judge every check the stacks can; the model's compute against its work
    they cannot read, so "no bottleneck" stays unsure and says how to measure it."""
    sc = Scenario()
    for _ in range(5):
        sc.window(HEALTHY)
    sc.host(0.3).process(0.95)
    a = analyze(sc.tl)
    assert a.verdict["sure"] is False and a.verdict["finding"] is None
    statement = a.verdict["statement"]
    assert "not judged: the model's compute" in statement and "too close" not in statement


def test_findings_added_later_keep_the_checks_that_were_not_judged():
    """The multi-rank session adds its DIST findings after analyze(): the verdict given again
    must still name the checks that lacked their samples, never turn 'sure'."""
    sc = Scenario()
    sc.window(HEALTHY, ticks=100)
    sc.host(0.3).process(0.95)
    a = analyze(sc.tl)
    th = Thresholds()
    note = new_finding(
        "MEM001",
        th,
        impact=0.0,
        confidence=0.8,
        message="",
        evidence=(),
        recommendation=Recommendation("", ()),
        expected_speedup=1.0,
    )
    merged, v = with_more(list(a.findings), [note], a.verdict, a.profile, {"steps": 200.0}, th)
    assert [f.id for f in merged] == ["MEM001"]
    assert v["sure"] is False and "not judged:" in v["statement"]


def test_the_gpu_idle_is_added_once_to_a_host_cause_that_lacks_it():
    cp = CriticalPath(0.6, {}, 0.0, 0.5, 0.1, ("nvml",))
    rest = dict(
        impact=0.4,
        confidence=0.9,
        message="The loop spends 40% of its time in the job's own Python.",
        recommendation=Recommendation("", ()),
        expected_speedup=1.5,
    )
    bare = new_finding("HOST001", Thresholds(), evidence=(), **rest)
    said = new_finding(
        "HOST001", Thresholds(), evidence=(Evidence("gpu_idle_share", 0.6, "ratio"),), **rest
    )
    added = with_gpu_idle(bare, cp)
    assert [e.metric for e in added.evidence] == ["gpu_idle_share"] and "60%" in added.message
    assert with_gpu_idle(said, cp) is said  # its evidence says it already: not twice


def test_a_rank_finding_added_later_keeps_the_starved_sampler_in_the_verdict():
    """A multi-rank job's DIST findings are ranked in after the analysis: the verdict given
    again still counts the samples at the share a starved py-spy recorded."""
    from tests.analyzers.scenario import Scenario

    th = Thresholds()
    sc = Scenario(cpu_count=2)
    for _ in range(5):
        sc.window({"data_wait": 0.2, "forward": 0.4, "backward": 0.4}, ticks=60, asked_hz=100)
    a = analyze(sc.host(0.5).process(1.0).tl)
    note = new_finding(
        "MEM001",
        th,
        impact=0.0,
        confidence=0.8,
        message="",
        evidence=(),
        recommendation=Recommendation("", ()),
        expected_speedup=1.0,
    )
    _, v = with_more(list(a.findings), [note], a.verdict, a.profile, a.metrics, th)
    assert v["sure"] is False and "stack sampling fell behind" in v["statement"]


def test_a_server_whose_hooks_saw_requests_but_no_forward_says_so_not_to_load_the_hooks():
    """A tornado demo with no model under `gpudiag run`: the hooks timed 31,343 requests and no
    forward. "They need the in-process hooks" was wrong there: they were loaded; what is
    missing is a PyTorch model's forward. Without the hooks it still says to load them."""
    from gpudiag.analyzers.engine.finalize import blind_to_forwards

    verdict = {"finding": None, "sure": True, "statement": "no bottleneck crossed its threshold"}
    hooked = blind_to_forwards(
        verdict, "server", {"requests": 31343.0, "requests_in_flight_max": 4.0}
    )
    assert hooked["sure"] is False
    assert "no PyTorch model's forward" in hooked["statement"]
    assert "need the in-process hooks" not in hooked["statement"]
    for bare in ({}, {"requests": 900.0, "executions": 300.0}):  # none; Triton's counters
        said = blind_to_forwards(verdict, "server", bare)
        assert "they need the in-process hooks" in said["statement"] and said["sure"] is False
    assert blind_to_forwards(verdict, "server", {"forwards": 10.0}) == verdict
