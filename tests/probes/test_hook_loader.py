"""attach --hooks, without a job: the script the job runs, gdb's command line, the checks
before injecting, the handshake on the channel and the words of the report."""

from __future__ import annotations

import sys
import types

import pytest

from gpudiag.agent.cli.parser import build_parser
from gpudiag.agent.fleet.metrics import probe_up
from gpudiag.agent.session import hookload
from gpudiag.probes.base import Target
from gpudiag.probes.inject import gpudiag_attach
from gpudiag.probes.inprocess import loader
from gpudiag.probes.inprocess.channel import LOADED, HookProbe
from gpudiag.probes.inprocess.loader import Loaded


def _run_script(script: str, monkeypatch, install) -> dict:
    """Run the job's script as PyRun_SimpleString does (in a __main__-like namespace)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "gpudiag_attach", types.SimpleNamespace(install=install))
    namespace: dict = {"__name__": "__main__"}
    exec(compile(script, "<gpudiag>", "exec"), namespace)  # noqa: S102 (our own script)
    return namespace


def test_the_script_binds_no_name_in_the_jobs_main_and_calls_install(monkeypatch):
    calls = []
    script = loader.script_text("/opt/x'y/é", "/run/gpudiag-0/agent-1.sock", "abc")
    assert script.isascii() and len(script.splitlines()) == 5
    ns = _run_script(script, monkeypatch, lambda *a: calls.append(a))
    assert calls == [("/run/gpudiag-0/agent-1.sock", "abc")]
    assert set(ns) == {"__name__", "__builtins__"}
    assert "/opt/x'y/é" in sys.path


def test_the_script_swallows_whatever_install_raises(monkeypatch):
    def boom(*_):
        raise KeyboardInterrupt

    script = loader.script_text("/nowhere", "/s.sock", "n")
    assert set(_run_script(script, monkeypatch, boom)) == {"__name__", "__builtins__"}


def test_gdbs_command_writes_the_script_byte_for_byte_in_one_page():
    script = loader.script_text('/a b/"q"\\', "/s.sock", "n") + "é"
    argv = loader.gdb_command(123, script)
    assert argv[:4] == ["gdb", "-p", "123", "-batch"] and "-nx" in argv
    write = next(a for a in argv if a.startswith("set {char["))
    size = len(script.encode()) + 1
    assert write.startswith(f'set {{char[{size}]}} $gd = "')
    literal = write.split(" = ", 1)[1]
    assert "\n" not in literal and '\\"q\\"' in literal and "\\303\\251" in literal
    assert any("Py_AddPendingCall((void *) PyRun_SimpleString, $gd)" in a for a in argv)
    with pytest.raises(ValueError):
        loader.gdb_command(1, "x" * 5000)


@pytest.mark.parametrize(
    ("scope", "cap", "words"),
    [
        ("0", False, None),
        ("1", True, None),
        ("1", False, "ptrace_scope is 1"),
        ("2", False, "ptrace_scope is 2"),
        ("3", True, "ptrace_scope is 3"),
    ],
)
def test_ptrace_scope_is_read_before_injecting(monkeypatch, scope, cap, words):
    monkeypatch.setattr(loader, "_ptrace_scope", lambda: scope + "\n")
    monkeypatch.setattr(loader, "_has_cap_ptrace", lambda: cap)
    got = loader.ptrace_problem()
    assert (got is None) if words is None else (words in got)


def test_no_yama_allows_ptrace(monkeypatch):
    def absent():
        raise FileNotFoundError

    monkeypatch.setattr(loader, "_ptrace_scope", absent)
    assert loader.ptrace_problem() is None


def _no_pyinjector(monkeypatch):
    monkeypatch.setattr(loader.injector, "missing", lambda: "pyinjector is not installed")


def test_gdb_and_pyinjector_missing_say_so_with_the_fix(monkeypatch):
    _no_pyinjector(monkeypatch)
    monkeypatch.setattr(loader, "ptrace_problem", lambda: None)
    monkeypatch.setattr(loader, "python_version", lambda pid: (3, 11))
    monkeypatch.setattr(loader.shutil, "which", lambda name: None)
    got = loader.load(42, "pass\n", "/unused")
    assert got.how is None and "gdb is not installed" in got.reason
    assert got.reason.startswith("neither pyinjector nor gdb can load them")
    assert "pyinjector is not installed" in got.reason and "Python 3.11" in got.reason
    assert "apt-get install gdb" in got.hint and "pip install pyinjector" in got.hint
    st = hookload._status("hooks", [got], {}, 10, ranks=False)
    assert st.reason.startswith("--hooks: not loaded (pid 42: neither pyinjector nor gdb")
    assert "\n" not in st.reason + (st.hint or "")  # one line, and its fix


def test_pyinjector_missing_and_gdb_unable_to_call_say_both(monkeypatch):
    _no_pyinjector(monkeypatch)
    monkeypatch.setattr(loader, "ptrace_problem", lambda: None)
    monkeypatch.setattr(loader, "python_version", lambda pid: (3, 11))
    monkeypatch.setattr(loader.shutil, "which", lambda name: "/usr/bin/gdb")
    said = loader.XSTATE_ERROR + ": Input/output error."
    monkeypatch.setattr(loader, "gdb_cannot_call", lambda gdb: said)
    got = loader.load(42, "pass\n", "/unused")
    assert got.reason.startswith("neither pyinjector nor gdb can load them")
    assert "pyinjector is not installed" in got.reason and said in got.reason
    assert got.hint == loader.XSTATE_HINT and "pip install pyinjector" in got.hint


def test_pyinjector_is_used_on_310_to_313_where_it_is_installed(monkeypatch):
    monkeypatch.setattr(loader, "ptrace_problem", lambda: None)
    monkeypatch.setattr(loader, "python_version", lambda pid: (3, 12))
    monkeypatch.setattr(loader.injector, "missing", lambda: None)
    monkeypatch.setattr(loader, "_gdb", lambda *a: pytest.fail("gdb used"))
    monkeypatch.setattr(loader.injector, "inject", lambda pid, script: (True, ""))
    assert loader.load(42, "pass\n", "/unused").how == "pyinjector (Python 3.12)"
    monkeypatch.setattr(loader.injector, "inject", lambda pid, script: (False, "ptrace: EPERM"))
    got = loader.load(42, "pass\n", "/unused")
    assert got.how is None and got.reason.endswith("ptrace: EPERM") and "ptrace" in got.hint


def test_a_job_of_another_user_is_refused_before_its_version_is_read(monkeypatch):
    """Issue 53: root never runs (nor reads the version of) another user's job for --hooks:
    its hooks would send to no gpudiag of theirs anyway."""
    monkeypatch.setattr(loader, "ptrace_problem", lambda: None)
    monkeypatch.setattr(loader, "other_user", lambda pid: 1001)
    monkeypatch.setattr(loader, "python_version", lambda pid: pytest.fail("version read"))
    got = loader.load(42, "pass\n", "/unused")
    assert got.how is None and "runs as uid 1001" in got.reason and "job's user" in got.hint


def test_this_process_is_of_this_user():
    import os

    assert loader.other_user(os.getpid()) is None


def test_old_python_and_no_ptrace_are_refused_before_any_tool_runs(monkeypatch):
    monkeypatch.setattr(loader.injector, "inject", lambda *a: pytest.fail("injected"))
    monkeypatch.setattr(loader, "ptrace_problem", lambda: None)
    monkeypatch.setattr(loader, "python_version", lambda pid: (3, 9))
    assert "needs 3.10+" in loader.load(42, "pass\n", "/unused").reason
    monkeypatch.setattr(loader, "ptrace_problem", lambda: "Yama's ptrace_scope is 3")
    got = loader.load(42, "pass\n", "/unused")
    assert got.reason.startswith("no ptrace permission") and "CAP_SYS_PTRACE" in got.hint


def test_remote_debugging_switched_off_is_refused_on_314(monkeypatch):
    monkeypatch.setattr(loader, "ptrace_problem", lambda: None)
    monkeypatch.setattr(loader, "python_version", lambda pid: (3, 14))
    monkeypatch.setattr(loader, "remote_debug_disabled", lambda pid: True)
    got = loader.load(42, "pass\n", "/unused")
    assert "disabled remote debugging" in got.reason


def _probe(tmp_path) -> HookProbe:
    probe = HookProbe(str(tmp_path / "rt" / "agent-1.sock"), optional=True)
    assert probe.open(Target(0)).available
    return probe


def test_the_hello_with_this_attachs_nonce_is_the_handshake(tmp_path):
    probe = _probe(tmp_path)
    try:
        probe.nonce = "n1"
        gpudiag_attach._hello(probe.path, "stale", {"reused": False})
        gpudiag_attach._hello(probe.path, "n1", {"reused": True, "torch": False, "x": [1]})
        import os

        got = probe.await_hello([os.getpid()], 2.0)
        assert got == {os.getpid(): {"reused": True, "torch": False, "nonce": "n1"}}
        assert probe.messages == 2 and probe.sample() == []
    finally:
        probe.close()


def test_no_hello_is_waited_for_a_bounded_time(tmp_path):
    probe = _probe(tmp_path)
    try:
        probe.nonce = "n"
        assert probe.await_hello([1], 0.2) == {}
    finally:
        probe.close()


def test_the_report_says_how_the_hooks_got_in_or_why_not():
    ok = Loaded(1, how="gdb (Python 3.11)")
    hello = {"reused": True, "torch": False, "channel": True}
    st = hookload._status("hooks", [ok], {1: hello}, 10, ranks=False)
    assert st.available and st.info and st.reason.startswith(LOADED)
    assert "pid 1 by gdb (Python 3.11)" in st.reason and "reused" in st.reason
    assert "torch not imported yet" in st.reason
    bad = Loaded(2, reason="gdb is not installed", hint="install gdb")
    st = hookload._status("hooks", [ok, bad], {}, 10, ranks=True)
    assert "not loaded in every process" in st.reason and "gdb is not installed" in st.reason
    assert "no answer in 10 s" in st.reason and "DDP's communication hook" in st.reason
    assert "install gdb" in st.hint


def test_a_loaded_hooks_status_counts_as_up_once_steps_are_timed():
    probe = {"name": "hooks", "available": True, "info": True, "reason": LOADED + " (pid 1)"}
    assert probe_up(probe, {"metrics": {"steps_per_second": 3.0}})
    off = dict(probe, reason="not connected (optional)")
    assert not probe_up(off, {"metrics": {"steps_per_second": 3.0}})


def test_a_channel_folder_not_private_is_refused_before_anything_is_loaded(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")  # planted where the socket goes
    probe = HookProbe(str(tmp_path / "link" / "agent-1.sock"), optional=True)
    monkeypatch.setattr(hookload, "load", lambda *a: pytest.fail("loaded despite the refusal"))
    st = probe.open(Target(0))
    assert not st.available and "is a link" in st.reason
    assert hookload.load_hooks(probe, [1]) is probe.refused


def test_hooks_is_opt_in_on_attach_only():
    from gpudiag.agent.commands.attach import AttachOptions
    from gpudiag.agent.commands.run import RunOptions

    parser = build_parser()
    attach = AttachOptions.from_args(parser.parse_args(["attach", "1"]))
    assert not attach.sampling().load_hooks
    hooked = AttachOptions.from_args(parser.parse_args(["attach", "1", "--hooks"]))
    assert hooked.sampling().load_hooks and hooked.sampling().attached
    run = RunOptions.from_args(parser.parse_args(["run", "--", "python", "x.py"]))
    assert not run.session().load_hooks and not run.session().attached


def test_the_hooks_help_and_hint_name_the_loaders_in_the_order_tried():
    """pyinjector is tried before gdb on 3.10-3.13 (test_pyinjector_is_used_on_310_to_313...):
    the --hooks help and the optional hooks status said gdb alone."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "attach" in a.choices)
    (hooks,) = [a for a in sub.choices["attach"]._actions if "--hooks" in a.option_strings]
    probe = HookProbe(optional=True)
    assert probe.open(Target(0)).available
    try:
        hint = probe.final_status().hint or ""
    finally:
        probe.close()
    for text in (hooks.help or "", hint):
        assert "pyinjector" in text and text.index("pyinjector") < text.index("gdb"), text
        assert "sys.remote_exec on 3.14+" in text


def test_a_job_in_the_middle_of_a_fork_is_refused(monkeypatch):
    monkeypatch.setattr(loader, "forking", lambda pid: True)
    monkeypatch.setattr(loader, "python_version", lambda pid: pytest.fail("went on"))
    got = loader.load(42, "pass\n", "/unused")
    assert "middle of a fork" in got.reason and "again" in got.hint


def test_this_process_is_not_forking():
    import os

    assert not loader.forking(os.getpid())


def _gdb_said(stdout: str, stderr: str = "") -> types.SimpleNamespace:
    return types.SimpleNamespace(returncode=0, stdout=stdout, stderr=stderr)


def test_gdbs_source_line_noise_is_not_its_error():
    res = _gdb_said("", "167\t../sysdeps/unix/sysv/linux/fstatat64.c: No such file.\nInvalid cast.")
    assert loader._gdb_error(res) == "Invalid cast."
