"""gpudiag try for any call site (issue 55): `--fix thin:MODULE.FUNCTION:every=N` and
`skip:MODULE.FUNCTION` in the trial's fixed arm, the LOOP001/BLOCK001 findings that carry the
command, and the guard that refuses an arm that would write over the job's outputs."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudiag.agent.commands.tryfix import parse_fix
from gpudiag.agent.session.trial import check_fix, job_folders, read_refused
from gpudiag.analyzers.measures.accounting import Site, call_target
from gpudiag.analyzers.model.results import Location
from gpudiag.probes.inject import gpudiag_callsite
from tests.e2e.agent.trials import in_job, try_job

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


@pytest.mark.parametrize(
    "text,fix",
    [
        (
            "thin:train.push:every=10",
            {"kind": "thin", "target": "train.push", "values": {"every": 10}},
        ),
        ("skip:gc.collect", {"kind": "skip", "target": "gc.collect", "values": {}}),
        (
            "thin:train.main.<locals>.push:every=5",
            {"kind": "thin", "target": "train.main.<locals>.push", "values": {"every": 5}},
        ),
    ],
)
def test_a_call_site_fix_parses_and_passes_the_checks(text, fix):
    assert parse_fix(text) == fix
    assert check_fix(fix, False) is None


@pytest.mark.parametrize(
    "text,words",
    [
        ("thin:train.push", "needs every=N"),
        ("thin:push:every=3", "expected thin:MODULE.FUNCTION:every=N"),
        ("thin:train.push:every=1", "every must be a whole number from 2"),
        ("thin:train.push:every=x", "every must be a whole number"),
        ("skip:train.push:every=2", "unknown value 'every'"),
        ("skip:train.push;rm -rf", "expected skip:MODULE.FUNCTION"),
        ("thin::every=3", "thin needs the function"),
    ],
)
def test_bad_call_site_fixes_are_one_line_and_exit_2(cli, text, words):
    r = cli("try", "--fix", text, "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


LOOP = """
m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)
def run(cb, n=12):
    got = []
    for i in range(n):
        m(torch.zeros(1, 2)).sum().backward(); o.step()
        got.append(cb(i))
    return got
"""


def test_thin_runs_a_callback_every_nth_call_though_the_loop_held_it_before_the_patch(tmp_path):
    """The script's function is defined after the hooks load and handed to the loop as a
    callback: patched in place at the first forward, every reference takes the trial's path;
    the calls between return the last result."""
    out, steps = in_job(
        {"kind": "thin", "target": "__main__.push", "values": {"every": 3}},
        LOOP
        + """
ran = []
def push(step):
    ran.append(step)
    return step * 10
print(run(push), ran)
""",
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    got, ran = out.stdout.strip().rsplit("] [", 1)
    assert got == "[0, 0, 0, 30, 30, 30, 60, 60, 60, 90, 90, 90"  # patched before the 1st call
    assert ran == "0, 3, 6, 9]"
    assert "# applied: __main__.push runs once every 3 calls" in steps


@pytest.mark.skip(
    reason="flaky: the heap scan looks for a nested function at most every RETRY_S, on a forward "
    "or a step, and this 12-step loop can call it first (failed on its own branch too)"
)
def test_skip_never_runs_a_nested_function_found_by_its_file_and_qualified_name(tmp_path):
    """`job.main.<locals>.push`: no attribute reaches it; the heap scan finds it by its file's
    stem and qualified name. Its calls return None."""
    out, _ = in_job(
        {"kind": "skip", "target": "job.main.<locals>.push", "values": {}},
        "",
        tmp_path,
        script="import torch\n"
        + LOOP
        + """
def main():
    ran = []
    def push(step):
        ran.append(step)
        return step
    print(run(push), ran)
main()
""",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[" + ", ".join(["None"] * 12) + "] []"


def test_thin_a_builtin_replaces_it_on_its_module(tmp_path):
    out, steps = in_job(
        {"kind": "thin", "target": "builtins.print", "values": {"every": 4}},
        LOOP + "run(lambda i: print(i))\n",
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "4", "8"]  # patched at once: the 1st of every 4


def test_a_target_never_found_is_said_not_applied(monkeypatch):
    notes: list[str] = []
    site = gpudiag_callsite.CallSite("nowhere_module.nothing", 2, notes.append)
    assert not site.look()
    site.first_look = time.monotonic() - 10
    site.next_look = 0.0
    site.tick()
    assert notes and notes[-1].startswith("# not applied: no function nowhere_module.nothing")


def test_a_generator_function_is_not_patched():
    def gen():
        yield 1

    site = gpudiag_callsite.CallSite("x.gen", 2, lambda line: None)
    assert "generator" in (site.patch_function(gen) or "")


def _old(path: Path, text: str, since: float) -> None:
    path.write_text(text)
    os.utime(path, (since - 3600, since - 3600))


def test_the_guard_refuses_a_write_over_a_file_the_job_had_before_the_trial(tmp_path):
    since = time.time()
    _old(tmp_path / "results.json", "old", since)
    _old(tmp_path / "ckpt.pt", "old", since)
    body = """
import os
open("new.txt", "w").write("mine")            # a new file: the trial's own
open("results.json").read()                   # reading is fine
for what, call in (
    ("open", lambda: open("results.json", "w")),
    ("append", lambda: open("results.json", "a")),
    ("os.open", lambda: os.open("results.json", os.O_WRONLY | os.O_TRUNC)),
    ("save", lambda: torch.save({}, "ckpt.pt")),
    ("replace", lambda: os.replace("new.txt", "ckpt.pt")),
):
    try:
        call()
        print(what, "wrote")
    except PermissionError:
        print(what, "refused")
"""
    out, steps = in_job(None, body, tmp_path, {"since": since, "folders": [str(tmp_path)]})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:5] == [
        f"{w} refused" for w in ("open", "append", "os.open", "save", "replace")
    ]
    assert (tmp_path / "results.json").read_text() == "old"
    assert (tmp_path / "ckpt.pt").read_text() == "old"
    assert (tmp_path / "new.txt").read_text() == "mine"
    assert "trials never write over the job's outputs" in steps
    path = tmp_path.parent / f"{tmp_path.name}-try" / "steps"
    assert "results.json" in (read_refused(str(path)) or "")


def test_the_guard_leaves_files_outside_the_jobs_folders_and_dot_folders(tmp_path):
    since = time.time()
    (tmp_path / ".cache").mkdir()
    _old(tmp_path / ".cache" / "x.lock", "", since)
    _old(tmp_path / ".cache" / "data", "", since)
    out, steps = in_job(
        None,
        'open(".cache/data", "w").write("ok"); print("ok")\n',
        tmp_path,
        {"since": since, "folders": [str(tmp_path / "elsewhere")]},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "# refused" not in steps


def test_job_folders_are_its_working_folder_and_the_folders_its_arguments_name(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "train.py").write_text("")
    got = job_folders(
        ["python", "train.py", "--output_dir=out", "--log", str(tmp_path / "logs" / "x.txt")],
        str(tmp_path / "out"),
    )
    assert str(tmp_path / "out") in got
    assert str(tmp_path / "out") == got[0] or str(tmp_path) not in got


def test_call_target_names_the_helper_the_loop_calls_or_the_call_it_makes_inline():
    loop = ("/w/train.py", "train")
    helper = Site(
        Location("/w/train.py", 70, "push_metrics"),
        "urllib.request.urlopen",
        "network",
        "urllib",
        0.5,
    )
    assert call_target(helper, loop) == "train.push_metrics"
    inline = Site(Location("/w/train.py", 40, "train"), "logging.debug", "logging", "logging", 0.5)
    assert call_target(inline, loop) == "logging.debug"
    gc_line = Site(
        Location("/w/train.py", 41, "train"), "gc.collect()", "gc", "gc", 0.5, "gc.collect()"
    )
    assert call_target(gc_line, loop) == "gc.collect"
    commit = Site(
        Location("/w/train.py", 42, "train"), "conn.commit()", "commit", "db", 0.5, "conn.commit()"
    )
    assert call_target(commit, loop) is None  # a C object's method: no name reaches it


def test_block001_and_loop001_carry_the_try_command_that_measures_them():
    from tests.analyzers.test_unexplained import run

    for family, fid, target in (
        ("post", "BLOCK001", "train.push_metrics"),
        ("json", "LOOP001", "train.report"),
        ("gc", "LOOP001", "gc.collect"),
    ):
        f = run({family: 0.5}).findings[0]
        assert f.id == fid and f.fix["kind"] == "thin" and f.fix["target"] == target
        every = f.fix["values"]["every"]
        assert check_fix(f.fix, False) is None
        assert (
            f"gpudiag try --fix thin:{target}:every={every} -- <the job>"
            in (f.recommendation.actions[-1])
        )


def test_try_thins_a_planted_per_step_metric_end_to_end(tmp_path):
    """The window_metric job's rolling AUC run every 50th time in the fixed arm: applied, and
    both arms timed (the figure itself is benchmarks/callsite_trial.py's)."""
    out = tmp_path / "trials.json"
    r = try_job(
        out,
        *(sys.executable, str(WORKLOADS / "window_metric.py"), "--seconds", "60"),
        fix="thin:window_metric.rolling_auc:every=50",
    )
    assert r.returncode == 0, r.stderr
    trial = json.loads(out.read_text())["trials"][0]
    assert trial["applied"].startswith("window_metric.rolling_auc runs once every 50 calls")
    assert trial["baseline_steps_per_s"] and trial["fixed_steps_per_s"]
    assert "fix thin window_metric.rolling_auc(every=50)" in r.stdout


def test_try_refuses_a_job_that_would_write_over_its_outputs(tmp_path):
    """A job that rewrites results.json (there before the trial) every step: the first arm is
    refused with the reason, no other arm runs, the file is as it was, exit 1."""
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            """
            import json, sys, torch
            m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)
            for i in range(100000):
                m(torch.zeros(1, 2)).sum().backward(); o.step()
                with open(sys.argv[1], "w") as f:
                    json.dump({"step": i}, f)
            """
        )
    )
    results = tmp_path / "results.json"
    _old(results, "precious", time.time())
    out = tmp_path / "trials.json"
    r = try_job(
        out,
        *(sys.executable, str(job), str(results)),
        fix="skip:job.nothing",
        arms=("--rounds", "2", "--seconds", "1", "--warmup", "0.5"),
        cwd=str(tmp_path),
    )
    trial = json.loads(out.read_text())["trials"][0]
    assert r.returncode == 1 and trial["verdict"] == "refused", r.stderr
    assert str(results) in trial["reason"] and "never write over" in trial["reason"]
    assert r.stderr.count("round ") == 1  # no arm after the refused one
    assert results.read_text() == "precious"


def test_the_settings_fix_holds_the_switches_off_though_the_job_turns_them_on(tmp_path):
    """DEBUG001's trial: deterministic algorithms and anomaly detection kept off, cuDNN's
    deterministic flag set back at each optimizer step."""
    out, steps = in_job(
        {
            "kind": "settings",
            "values": {"deterministic": False, "anomaly": False, "cudnn_deterministic": False},
        },
        LOOP
        + """
torch.use_deterministic_algorithms(True)
torch.autograd.set_detect_anomaly(True)
torch.backends.cudnn.deterministic = True
run(lambda i: None, 2)
print(torch.are_deterministic_algorithms_enabled(), torch.is_anomaly_enabled(),
      torch.backends.cudnn.deterministic)
""",
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]
    assert "# applied: torch settings held" in steps
