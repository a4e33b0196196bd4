"""gpudiag try: the verdict, the in-process fixes (CPU, GPU-only ones with their flags), the
command line, and small jobs end to end (a fix applied, a crash under a fix as a result)."""

from __future__ import annotations

import json
import sys

import pytest

from gpudiag.agent.commands.tryfix import parse_fix
from gpudiag.agent.session.trial import (
    Work,
    change_line,
    check_fix,
    items_rate_after,
    items_window,
    rate_after,
    work_rate,
)
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.stats.trials import judge

TH = Thresholds()


def test_judge_held_missed_slower_failed():
    base, fast = [2.0, 2.1, 1.9], [4.0, 4.2, 3.9]
    assert judge(base, fast, 2.0, TH).verdict == "held"
    assert judge(base, fast, 6.0, TH).verdict == "missed"
    assert judge(base, [1.0, 1.1, 0.9], 2.0, TH).verdict == "slower"
    assert judge([], fast, 2.0, TH).verdict == "failed"
    assert judge(base, fast, None, TH).verdict == "no prediction"
    res = judge(base, fast, 2.0, TH)
    assert res.interval[0] <= res.measured <= res.interval[1]
    assert "trial_tolerance" in res.reason


def test_rate_after_uses_only_the_window():
    times = [0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 10.0]
    rate, n = rate_after(times, 1.0, 3.0)
    assert n == 4 and rate == pytest.approx(1.0)


def test_parse_fix_and_numerics_opt_in():
    fix = parse_fix("dataloader:num_workers=6,persistent_workers=true")
    assert fix == {"kind": "dataloader", "values": {"num_workers": 6, "persistent_workers": True}}
    assert check_fix(fix, False) is None
    assert "allow-numerics" in check_fix({"kind": "tf32", "values": {}}, False)
    assert check_fix({"kind": "tf32", "values": {}}, True) is None
    assert "unknown" in check_fix({"kind": "magic", "values": {}}, True)
    assert "--allow-compile" in check_fix({"kind": "compile", "values": {}}, True)
    assert check_fix({"kind": "compile", "values": {}}, False, True) is None


def test_every_fix_the_findings_and_docs_name_can_be_tried():
    """The commands gpudiag prints or documents pass `try`'s checks: the verdict's and
    INFER002's "gpudiag try --fix batch:factor=8" was refused ("unknown value 'factor'"), and
    so was `try --from` a report carrying INFER002's batch fix."""
    for text in ("batch:factor=8", "batch:factor=4", "checkpoint:every=3", "load_once"):
        assert check_fix(parse_fix(text), False) is None, text
    assert check_fix({"kind": "batch", "values": {"factor": 8}}, False) is None
    assert "from 2 to 1024" in check_fix(parse_fix("batch:factor=1"), False)


def test_change_line_names_the_finding_location():
    fix = {"kind": "dataloader", "values": {"num_workers": 6, "persistent_workers": True}}
    assert change_line(fix, "train.py:42:main") == (
        "train.py:42: DataLoader(..., num_workers=6, persistent_workers=True)"
    )


def test_items_rate_after_counts_items_not_forwards():
    fwd = [(0.0, 8.0), (1.0, 8.0), (2.0, 8.0), (3.0, 4.0), (10.0, 8.0)]
    assert items_rate_after(fwd, 0.0, 3.0) == (20.0 / 3.0, 4)
    assert items_rate_after(fwd, 2.5, 1.0) == (None, 1)


def test_an_inference_arm_is_timed_over_the_first_arms_items():
    """The first arm's window is items 16 to 28 (the forward ending at 1.0 s to the one at
    3.0 s); another arm is timed from the forward that reaches 16 to the one that reaches 28,
    whatever its batches (a larger one ends past it: the items done are counted)."""
    fwd = [(0.0, 8.0), (1.0, 8.0), (2.0, 8.0), (3.0, 4.0), (10.0, 8.0)]
    assert items_window(fwd, 0.5, 3.0) == Work(16.0, 12.0)
    assert items_window(fwd, 2.5, 1.0) is None
    other = [(0.0, 16.0), (0.5, 16.0), (0.7, 16.0)]
    assert work_rate(other, Work(16.0, 12.0)) == (32.0, 2, True)  # 16 -> 32 in 0.5 s
    assert work_rate(other[:2], Work(16.0, 20.0)) == (None, 2, False)  # not there yet
    assert work_rate([(1.0, 4.0), (1.0, 40.0)], Work(2.0, 10.0)) == (None, 2, True)


def test_bad_fix_and_numerics_are_one_line_exit_2(cli):
    r = cli("try", "--fix", "magic:x=1", "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown fix kind" in r.stderr
    r = cli("try", "--fix", "tf32", "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and "--allow-numerics" in r.stderr


def test_trials_in_report_summary_html_and_tui():
    """A report with `trials` validates; the summary, HTML page and TUI detail show them."""
    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.commands.replay import replay_report
    from gpudiag.agent.output.render.html import render_html
    from gpudiag.agent.output.render.text import render_text
    from gpudiag.agent.output.report import validate
    from gpudiag.text.trials import with_trials
    from gpudiag.tui.screens import finding_text
    from tests.agent.test_html_report import H100

    doc = replay_report(str(H100 / "starved.jsonl.gz"), load_settings(None, None))
    data = next(f for f in doc["findings"] if f["id"] == "DATA001")
    assert data["fix"]["kind"] == "dataloader" and data["fix"]["values"]["num_workers"] > 0
    doc["trials"] = [
        {
            "finding": "DATA001",
            "fix": data["fix"],
            "predicted": 2.0,
            "measured": 1.8,
            "interval": [1.6, 2.1],
            "rounds": 3,
            "verdict": "held",
            "reason": "r",
            "change": "train.py:42: DataLoader(..., num_workers=6)",
        }
    ]
    validate(doc)
    assert "x1.80 [1.60, 2.10] over 3 rounds" in render_text(doc)
    assert "train.py:42: DataLoader(..., num_workers=6)" in render_html(doc)
    shown = next(f for f in with_trials(doc) if f["id"] == "DATA001")
    assert "x1.80" in str(finding_text(shown))


@pytest.mark.parametrize(
    "recording,fid,kind", [("fp32", "GPU003", "tf32"), ("ckpt", "CKPT001", "checkpoint")]
)
def test_findings_carry_their_fix_as_data(recording, fid, kind):
    """Real H100 recordings: the finding's fix is in the report as kind and values."""
    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.commands.replay import replay_report
    from tests.agent.test_html_report import H100

    doc = replay_report(str(H100 / f"{recording}.jsonl.gz"), load_settings(None, None))
    f = next(f for f in doc["findings"] if f["id"] == fid)
    assert f["fix"]["kind"] == kind
    if kind == "checkpoint":
        assert f["fix"]["values"]["every"] >= 2
    assert check_fix(f["fix"], True, True) is None  # `try --from` takes it as it is


def test_every_fix_a_finding_carries_passes_trys_checks():
    """Each fix as data the analyzers write (read from their source: kind and value names)
    passes `try`'s checks with a value of its kind, so `try --from REPORT` never refuses one."""
    import re
    from pathlib import Path

    import gpudiag.analyzers.findings as findings

    text = "".join(p.read_text() for p in Path(findings.__file__).parent.glob("*.py"))
    found = re.findall(r'"kind": "(\w+)", "values": \{([^}]*)\}', text)
    assert len(found) >= 6, found
    for kind, body in found:
        names = re.findall(r'"(\w+)":', body)
        values = {n: True if n in ("persistent_workers", "fused") else 2 for n in names}
        assert check_fix({"kind": kind, "values": values}, True, True) is None, (kind, values)


def test_a_candidate_fix_is_planned_with_no_prediction(capsys):
    """A report's finding whose fix the model is unsure of (DATA001 on a box with no idle
    core) is tried, said so, and judged without a prediction (its bound is not one)."""
    from gpudiag.agent.commands.tryfix import _plans_of_report

    fix = {"kind": "dataloader", "values": {"num_workers": 2}, "candidate": "no idle core"}
    doc = {"findings": [{"id": "DATA001", "fix": fix, "expected_speedup": 2.5}]}
    (plan,) = _plans_of_report(doc, ["python", "job.py"], None)
    assert plan.fix == fix and plan.predicted is None
    assert "candidate fix the model is unsure of: no idle core" in capsys.readouterr().err


def test_a_sure_fix_is_planned_with_its_prediction(capsys):
    """A finding whose fix the model is sure of is tried against its predicted speed-up (the
    low end of its range too); a finding with no fix is said and left out; `--finding`
    keeps one finding's fix."""
    from gpudiag.agent.commands.tryfix import _plans_of_report

    fix = {"kind": "dataloader", "values": {"num_workers": 2}}
    doc = {
        "findings": [
            {"id": "HOST001", "recommendation": {"actions": ["move it out of the loop"]}},
            {"id": "DATA001", "fix": fix, "expected_speedup": 2.5, "speedup_low": 1.8},
            {"id": "CKPT001", "fix": {"kind": "checkpoint", "values": {"every": 4}}},
        ]
    }
    data, ckpt = _plans_of_report(doc, ["python", "job.py"], None)
    assert data.fix == fix and data.finding == "DATA001"
    assert data.predicted == 2.5 and data.predicted_low == 1.8
    assert ckpt.finding == "CKPT001" and ckpt.predicted is None
    err = capsys.readouterr().err
    assert "HOST001: no fix applicable from outside; change the code: move it out" in err
    assert "candidate" not in err
    (only,) = _plans_of_report(doc, ["python", "job.py"], "CKPT001")
    assert only.finding == "CKPT001"


@pytest.mark.parametrize(
    "text, words",
    [
        ("checkpoint:every=0", "every must be a whole number from 1"),
        ("checkpoint:every=nan", "every must be a whole number"),
        ("checkpoint:every=2.5", "every must be a whole number"),
        ("dataloader:num_workers=-1", "num_workers must be a whole number from 0"),
        ("dataloader:num_workers=true", "num_workers must be a whole number"),
        ("dataloader:pin_memory=3", "pin_memory must be true or false"),
        ("dataloader:workers=2", "unknown value 'workers'"),
        ("cudnn_benchmark:x=1", "unknown value 'x' (known: none)"),
    ],
)
def test_bad_fix_values_are_one_line_and_exit_2(cli, text, words):
    """A fix value the job would refuse or misread (every=0 divided by zero inside the job,
    every=nan raised there) is refused before any arm runs."""
    r = cli("try", "--fix", text, "--", "python", "job.py")
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_a_hypothesis_holds_when_its_range_meets_the_measured_interval():
    th = Thresholds()
    base, fixed = [10.0, 10.2, 9.9], [11.0, 11.3, 10.8]  # about x1.1
    assert judge(base, fixed, 1.45, th).verdict == "missed"  # the high end alone
    held = judge(base, fixed, 1.45, th, predicted_low=1.0)
    assert held.verdict == "held" and "x1.00-x1.45" in held.reason
    assert judge(base, fixed, 3.0, th, predicted_low=2.0).verdict == "missed"


def test_a_floor_holds_when_the_fix_gives_at_least_it():
    """INFER004's x1.59 is the loading alone ("at least"): a fix measured at x2.05 (the cold
    forwards gone too) meets it; one measured well under it misses it."""
    th = Thresholds()
    base, fixed = [66.1, 66.9, 66.0], [134.2, 135.7, 135.5]  # the held-out job's arms
    assert judge(base, fixed, 1.59, th).verdict == "missed"  # as a point
    held = judge(base, fixed, 1.59, th, floor=True)
    assert held.verdict == "held" and "at least x1.59" in held.reason
    assert judge(base, [70.0, 71.0, 69.5], 1.59, th, floor=True).verdict == "missed"


def test_a_floor_reads_at_least_and_then_measured():
    from gpudiag.agent.commands.tryfix import measured_into
    from gpudiag.text.formatting import speedup_text

    f = {"id": "INFER004", "speedup_kind": "floor", "expected_speedup": 1.59}
    assert speedup_text(f) == "at least ×1.59"
    measured_into([f], [{"finding": "INFER004", "measured": 2.05, "verdict": "held"}])
    assert speedup_text(f) == "×2.05 measured by try (at least ×1.59)"


def test_a_measured_hypothesis_is_shown_measured_not_unverified():
    from gpudiag.agent.commands.tryfix import measured_into
    from gpudiag.text.formatting import speedup_text

    f = {"id": "INFER001", "speedup_kind": "hypothesis", "speedup_low": 1.1}
    f["expected_speedup"] = 1.19
    assert speedup_text(f) == "×1.10-×1.19, unverified"
    measured_into([f], [{"finding": "INFER001", "measured": 1.62, "verdict": "missed"}])
    assert speedup_text(f) == "×1.62 measured by try (×1.10-×1.19)"
    g = dict(f, measured_speedup=None)
    measured_into([g], [{"finding": "INFER001", "measured": None, "verdict": "failed"}])
    assert "unverified" in speedup_text(g)


def test_the_verdict_and_trial_line_say_what_try_measured_of_a_hypothesis():
    from gpudiag.agent.commands.tryfix import verdict_measured
    from gpudiag.text.trials import summary_line

    v = {"finding": "INFER001", "sure": False, "statement": "INFER001 seen; unverified"}
    t = {"finding": "INFER001", "fix": {"kind": "inference_mode", "values": {}}}
    t |= {"measured": 1.5, "interval": [1.3, 1.7], "verdict": "missed", "rounds": 3}
    t |= {"predicted": 1.19, "predicted_low": 1.1}
    assert verdict_measured(v, [t])["statement"].endswith("measured x1.50 [1.30, 1.70] (missed)")
    assert verdict_measured(v, [dict(t, finding="SERVE001")]) == v
    assert "predicted x1.10-x1.19: missed" in summary_line(t)


def test_try_keeps_its_diagnosis_in_memory_and_never_reads_the_report_back(tmp_path, monkeypatch):
    """V26: another user swapped a report of theirs in at --out after the diagnosis (a shared
    folder without the sticky bit), and root's try showed that verdict and tried its fix."""
    from gpudiag.agent.commands import run, tryfix

    computed = {"verdict": {"statement": "computed"}, "findings": []}
    planted = {"verdict": {"statement": "PLANTED"}, "findings": []}
    out = tmp_path / "diag.json"

    def fake_run(opts, on_launch=None, on_report=None) -> int:
        assert on_report is not None
        on_report(computed)
        out.write_text(json.dumps(planted))  # the swap, after the report was written
        return 0

    monkeypatch.setattr(run, "main", fake_run)
    args = tryfix.TryOptions(diagnose_seconds=1.0, out=str(out))
    assert tryfix.diagnose_first(["true"], args) == computed
    # run --try: the run's own report, not the file at --out
    seen: list = []
    monkeypatch.setattr(tryfix, "main", lambda a: seen.append(tryfix._diagnosis(["x"], a)) or 0)
    tryfix.run_then_try(str(out), ["x"], 0, computed)
    assert seen == [computed]
