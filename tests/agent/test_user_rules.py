"""Users' rules from pyproject.toml: catastrophic patterns and wrongly typed fields refused in one
line, an implicit pyproject others may write (or another user's) ignored, matching bounded in
time."""

from __future__ import annotations

from pathlib import Path

FIXTURE = "tests/fixtures/h100/ckpt.jsonl.gz"


def _rules_file(tmp_path, rule: str) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.gpudiag]\n[[tool.gpudiag.rules]]\ncategory = "data_wait"\n{rule}\n'
    )


def test_wrongly_typed_rule_fields_are_a_usage_error(tmp_path, cli, monkeypatch):
    """`function = 5` gave 'internal error' (a TypeError from re)."""
    monkeypatch.chdir(tmp_path)  # in-process (refused before any replay): ./pyproject.toml
    fixture = str(Path(__file__).parents[2] / FIXTURE)
    for rule in ("function = 5", 'file = ["x"]', 'function = "x"\ndescription = 5'):
        _rules_file(tmp_path, rule)
        res = cli("replay", fixture)
        assert res.returncode == 2 and "internal error" not in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1 and "rule 1:" in res.stderr


def _implicit(tmp_path, mode: int, uid: int | None = None):
    import os

    from gpudiag.agent.base.config import load_settings

    pp = tmp_path / "pyproject.toml"
    pp.write_text("[tool.gpudiag.thresholds]\ndata_wait_warn = 0.9\n")
    pp.chmod(mode)
    if uid is not None:
        os.chown(pp, uid, -1)
    return load_settings(None, cwd=tmp_path)


def test_an_implicit_pyproject_others_may_write_is_ignored_in_one_line(tmp_path, capsys):
    """./pyproject.toml is read without being named: group- or world-writable, anyone could
    have set its thresholds and rules (a user's own, 0644, is read)."""
    assert _implicit(tmp_path, 0o644).thresholds.data_wait_warn == 0.9
    for mode, who in ((0o664, "its group"), (0o646, "others")):
        s = _implicit(tmp_path, mode)
        assert s.source is None and s.thresholds.data_wait_warn != 0.9
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"writable by {who}" in err and "ignoring" in err


def test_an_implicit_pyproject_of_another_user_is_ignored(tmp_path, capsys, monkeypatch):
    """Another user's ./pyproject.toml (a shared folder) is not read; root's is."""
    import os

    if os.geteuid() == 0:
        s = _implicit(tmp_path, 0o644, uid=4321)
    else:  # the file is ours: look at it as another, non-root user
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
        s = _implicit(tmp_path, 0o644)
    assert s.source is None and s.thresholds.data_wait_warn != 0.9
    assert "belongs to another user" in capsys.readouterr().err


def test_a_users_rule_is_matched_in_bounded_time():
    """What a rule that is allowed can still cost: two quantifiers over a huge frame name."""
    import threading
    import time

    from gpudiag.analyzers.measures.rules import parse_stack, rules_from_config

    ok = [r"save_ckpt$", r"torch/utils/data/.*\.py$", r"\w+\.\w+", r".*a.*b"]
    rules = rules_from_config([{"category": "data_wait", "function": p} for p in ok])
    stack = parse_stack("a" * 20_000 + " (/w/t.py:1)")
    box: list[bool] = []
    worker = threading.Thread(target=lambda: box.append(rules[-1].matches(stack, "")), daemon=True)
    t0 = time.perf_counter()
    worker.start()
    worker.join(10)  # unbounded, this ran for hours (a daemon thread: the test ends anyway)
    assert box == [False] and time.perf_counter() - t0 < 2.0
