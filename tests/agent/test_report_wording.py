"""How a finding reads in the text and markdown summaries: wrapped, the job's paths relative to
its folder, the DataLoader's speed-up basis in plain words, the evidence that only gave context
apart from the evidence the finding rests on."""

from __future__ import annotations

from gpudiag.agent.output.render.plain import (
    WIDTH,
    crossed,
    job_dir,
    plain_basis,
    shorten_paths,
    split_evidence,
    wrapped,
)


def ev(metric, value, threshold=None, comparison=None, setting=None):
    return {
        "metric": metric,
        "value": value,
        "unit": "ratio",
        "threshold": threshold,
        "comparison": comparison,
        "setting": setting,
        "source": "stacks",
    }


def test_the_loader_basis_reads_as_a_sentence():
    basis = (
        "loader rate with 1 workers on at most 1 of 2 physical cores against the rate the rest "
        "of the step allows (22% of it)"
    )
    assert plain_basis(basis) == (
        "1 loader worker on 1 of 2 physical cores; today loading keeps up with 22% of the rate "
        "the rest of the step allows"
    )
    assumed = plain_basis(
        "loader rate with 12 workers on at most 7 of 8 physical cores (assumed: 2 logical CPUs "
        "per core) against the rate the rest of the step allows (8% of it); capped by the GPU's "
        "busy time"
    )
    assert assumed.startswith("12 loader workers on 7 of 8 physical cores (assumed: 2 logical")
    assert assumed.endswith("; capped by the GPU's busy time")
    other = "a bound: x5.45 if loading cost nothing (the wait removed)"
    assert plain_basis(other) == other


def test_checks_under_their_level_are_context_and_floors_under_it_are_evidence():
    wait = ev("data_wait_share", 0.8, 0.1, ">=", "data_wait_warn")
    workers = ev("dataloader_workers", 0.0)
    free = ev("host_free_cores", 0.0, 0.5, "<", "min_free_cores")
    headroom = ev("vram_used", 0.2, 0.5, "<=", "mem_headroom_max")
    off_cpu = ev("loader_off_cpu_share", 0.002, 0.5, "<", "loader_wait_min")
    below_warn = ev("h2d_copy_share", 0.05, 0.1, "<", "h2d_copy_warn")
    assert all(crossed(e) for e in (wait, workers, free, headroom))
    assert not crossed(off_cpu) and not crossed(below_warn)
    rests, context = split_evidence([wait, off_cpu, workers, free])
    assert rests == [wait, workers, free] and context == [off_cpu]


def test_the_jobs_paths_are_shown_under_its_folder():
    doc = {
        "run": {"command": ["python", "/home/ann/proj/train.py", "--lr", "1"]},
        "findings": [],
    }
    root = job_dir(doc)
    assert root == "/home/ann/proj"
    text = "in Data.load (/home/ann/proj/data/load.py:12) and /usr/lib/python3/x.py:3"
    assert shorten_paths(text, root) == "in Data.load (data/load.py:12) and /usr/lib/python3/x.py:3"
    # no script on the command line: the folder the findings' paths share
    doc = {
        "run": {"command": ["python", "-m", "pkg.job"]},
        "findings": [
            {
                "message": "at /srv/app/pkg/job.py:29 and /srv/app/pkg/io.py:3",
                "recommendation": {"actions": []},
            }
        ],
    }
    assert job_dir(doc) == "/srv/app/pkg"
    assert job_dir({"run": {"command": ["python", "-m", "x"]}, "findings": []}) is None


def test_lines_wrap_at_the_width_and_keep_long_words_whole():
    text = "word " * 60 + "/a/very/long/path/" + "x" * 120 + ".py"
    lines = wrapped(text, "    ")
    assert len(lines) > 2 and all(ln.startswith("    ") for ln in lines)
    assert all(len(ln) <= WIDTH for ln in lines if "/a/very" not in ln)
    assert any("x" * 120 in ln for ln in lines)


def test_a_comparison_stays_with_its_setting():
    line = "· " + "x" * 88 + " = 5% (>= data_wait_warn 10%)"
    lines = wrapped(line, "    ")
    assert any("(>= data_wait_warn" in ln for ln in lines), lines
