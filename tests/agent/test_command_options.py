"""Options typed at the command (issue 50): each command reads the parsed arguments once into
a frozen options object, nothing below agent/commands sees an argparse Namespace, and
`run --help` lists its options in groups. In-process: the parser and `main(argv)` are
called here, no subprocess."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from gpudiag.agent.cli.commands import BY_NAME, COMMANDS
from gpudiag.agent.cli.main import main
from gpudiag.agent.cli.parser import build_parser, parse_args
from gpudiag.agent.output.render.formats import FORMATS, SUMMARIES

AGENT = Path(__file__).resolve().parents[2] / "agent"
BELOW_COMMANDS = ("base", "output", "fleet", "session")  # tests/test_layering.py's floors

# each command's shortest valid command line, and the options it must give
MINIMAL: dict[str, tuple[list[str], dict]] = {
    "run": (["run", "--", "python", "x.py"], {"cmd": ("--", "python", "x.py")}),
    "attach": (["attach", "1"], {"pid": "1"}),
    "watch": (["watch"], {}),
    "try": (["try", "--", "python", "x.py"], {"cmd": ("--", "python", "x.py")}),
    "report": (["report", "r.json"], {"file": "r.json"}),
    "replay": (["replay", "r.jsonl.gz"], {"file": "r.jsonl.gz"}),
    "schema": (["schema"], {}),
    "thresholds": (["thresholds"], {}),
    "gate": (
        ["gate", "--baseline", "b.json", "c.json"],
        {"baseline": "b.json"} | {"reports": ("c.json",)},
    ),
    "top": (["top"], {}),
    "demo": (["demo"], {}),
    "merge": (["merge", "a.json", "b.json"], {"reports": ("a.json", "b.json")}),
    "mcp": (
        ["mcp", "--reports", "r", "--allow-try", "--http", "127.0.0.1:8765"],
        {"reports": "r", "allow_try": True, "http": "127.0.0.1:8765"},
    ),
}


def subparser(name: str) -> argparse.ArgumentParser:
    """The parser of one command."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def options_of(argv: list[str]):
    """The typed options of a command line, as `main` makes them."""
    ns = parse_args(build_parser(), argv)
    return BY_NAME[ns.command].options.from_args(ns)


def test_every_command_is_in_the_table():
    assert set(MINIMAL) == {c.name for c in COMMANDS}


@pytest.mark.parametrize("name", list(MINIMAL))
def test_every_commands_options_are_one_frozen_object(name):
    opts = options_of(MINIMAL[name][0])
    assert dataclasses.is_dataclass(opts) and type(opts).__dataclass_params__.frozen  # type: ignore[attr-defined]
    for f in dataclasses.fields(opts)[:1]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(opts, f.name, None)
    for f in dataclasses.fields(opts):
        assert not isinstance(getattr(opts, f.name), list), f"{name}.{f.name} is a list"


@pytest.mark.parametrize("name", list(MINIMAL))
def test_every_parsed_argument_lands_in_the_options(name):
    """The parser's arguments and the options' fields are the same names: none is dropped
    on the way, none is read from a Namespace further down."""
    parser = subparser(name)
    dests = {a.dest for a in parser._actions if a.dest != "help"} | set(parser._defaults)
    if name == "gate":
        dests.add("cmd")  # what follows `--`, set by parse_args()
    fields = {f.name for f in dataclasses.fields(BY_NAME[name].options)}
    assert dests == fields


@pytest.mark.parametrize("name", list(MINIMAL))
def test_the_options_defaults_are_the_command_lines(name):
    """An options object made in code (as `try` makes run's) is the one the command line
    gives: the defaults do not drift apart."""
    argv, required = MINIMAL[name]
    assert options_of(argv) == BY_NAME[name].options(**required)


def test_try_diagnoses_through_the_run_options_run_would_parse(tmp_path, monkeypatch):
    """`try` with nothing named runs `run --until-sure` by calling it with typed options,
    the same options the command line `run -q --until-sure ...` gives."""
    from gpudiag.agent.commands import run, tryfix

    seen = []

    def fake_main(opts, on_launch=None, on_report=None):
        seen.append(opts)
        return 0

    monkeypatch.setattr(run, "main", fake_main)
    out = str(tmp_path / "d.json")
    with pytest.raises(Exception, match="made no report"):
        tryfix.diagnose_first(["python", "x.py"], tryfix.TryOptions(out=out, diagnose_seconds=7))
    argv = ["run", "-q", "--until-sure", "--duration", "7", "--out", out, "--", "python", "x.py"]
    (given,) = seen
    assert given == options_of(argv) and given.command == ["python", "x.py"]


def test_run_try_hands_try_typed_options(monkeypatch, tmp_path):
    from gpudiag.agent.commands import run, tryfix

    tried = []
    computed = {"findings": [], "verdict": {"finding": None}}

    def fake_run_job(opts, command, settings, on_report=None):
        assert on_report is not None
        on_report(computed)  # the report as run computed it: try never reads the file back
        return 5

    monkeypatch.setattr(run, "run_job", fake_run_job)
    monkeypatch.setattr(tryfix, "main", lambda opts: tried.append(opts) or 0)
    out = str(tmp_path / "r.json")
    assert main(["run", "--try", "--out", out, "--", "python", "x.py"]) == 5  # the job's code
    (opts,) = tried
    assert opts == tryfix.TryOptions(cmd=("python", "x.py"), out=out, diagnosis=computed)


@pytest.mark.parametrize("name", ["run", "attach", "watch"])
def test_help_lists_the_options_in_groups(name):
    groups = {g.title: {a.dest for a in g._group_actions} for g in subparser(name)._action_groups}
    for title, dest in [
        ("stop", "duration"),
        ("sampling", "rate"),
        ("thresholds and prices", "overrides"),
        ("output", "quiet"),
        ("fleet", "metrics_port"),
    ]:
        assert dest in groups.get(title, set()), (name, title, dest)
    if name != "watch":
        assert {"capture_steps", "speedscope", "trace"} <= groups["evidence"]
        assert {"format", "out", "record"} <= groups["output"]


def test_run_help_shows_the_groups(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for title in ("stop:", "sampling:", "output:", "evidence:", "fleet:"):
        assert f"\n{title}\n" in text


def test_format_choices_come_from_the_formats_registry():
    for name in ("report", "replay"):
        (fmt,) = [a for a in subparser(name)._actions if a.dest == "format"]
        assert tuple(fmt.choices) == tuple(FORMATS)
    for name in ("run", "attach", "merge"):
        (fmt,) = [a for a in subparser(name)._actions if a.dest == "format"]
        assert tuple(fmt.choices) == SUMMARIES
    assert "html" in FORMATS and "html" not in SUMMARIES  # a page, not a job's summary


@pytest.mark.parametrize(
    "argv, said",
    [
        (["run", "--format", "html", "--", "python", "x.py"], "invalid choice: 'html'"),
        (["run", "--rate", "0", "--", "python", "x.py"], "must be 1..1000 Hz"),
        (["run"], "run needs a command after --"),
        (["try"], "try needs a command after --"),
        (["attach", "x"], "PID must be a number"),
        (["watch", "--metrics-port", "70000"], "must be 0..65535"),
    ],
)
def test_bad_arguments_are_one_line_in_process(argv, said, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and err.count("\n") == 1


def _namespace_uses(path: Path) -> list[str]:
    """Where one module imports argparse or names a Namespace."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            out.append(f"{path.name}:{node.lineno}: import argparse")
        elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
            out.append(f"{path.name}:{node.lineno}: from argparse")
        elif isinstance(node, ast.Attribute | ast.Name) and "Namespace" in (
            getattr(node, "attr", None) or getattr(node, "id", "")
        ):
            out.append(f"{path.name}:{node.lineno}: Namespace")
    return out


def test_nothing_below_the_commands_sees_a_namespace():
    """base, output, fleet and session take typed options: none imports argparse or names
    an argparse Namespace (the commands convert theirs)."""
    found = [
        use
        for floor in BELOW_COMMANDS
        for path in sorted((AGENT / floor).rglob("*.py"))
        for use in _namespace_uses(path)
    ]
    assert not found, found


def test_the_namespace_check_sees_one():
    """The check above is not vacuous: it finds a Namespace where one is used."""
    assert _namespace_uses(AGENT / "cli" / "parser.py")
    assert _namespace_uses(AGENT / "commands" / "run.py")
