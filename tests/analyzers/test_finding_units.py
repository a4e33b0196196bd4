"""A finding is one unit: its spec, its documentation and `find(ctx)`; precedence is declared
in the specs (what a finding claims of the loop, what its finder reads), never read from
another finding's id, and the registry's order follows from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpudiag.analyzers.context.finder import Finder, in_order, runs_before
from gpudiag.analyzers.engine.registry import FINDERS, SECOND_PASSES, UNITS
from gpudiag.analyzers.model.catalogue import CATALOGUE, Spec, register

FINDINGS = Path(__file__).resolve().parents[2] / "analyzers" / "findings"
ID = re.compile(r"^[A-Z]+\d{3}$")


def _ids_in(node: ast.AST) -> list[str]:
    """Finding-id string constants in a comparison operand (a name, a tuple or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and ID.match(node.value):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [i for e in node.elts for i in _ids_in(e)]
    return []


def id_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, id) for every finding id a module compares something with."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                out += [(node.lineno, i) for i in _ids_in(operand)]
    return out


def test_no_finding_id_is_compared_inside_findings():
    found = {
        f"{p.name}:{line}: {fid}"
        for p in sorted(FINDINGS.glob("*.py"))
        for line, fid in id_comparisons(p.read_text())
    }
    assert found == set()


def test_the_id_comparison_check_finds_one():
    src = 'if any(f.id == "EVAL001" for f in found) or f.id in ("A001", x):\n    pass\n'
    assert sorted(id_comparisons(src)) == [(1, "A001"), (1, "EVAL001")]


def test_every_spec_is_made_by_one_finder_or_a_second_pass():
    made = [s.id for f in FINDERS for s in f.makes]
    assert len(made) == len(set(made))
    second = {fid for fid, s in CATALOGUE.items() if s.category == "distributed"}
    assert set(made) | second == set(CATALOGUE)
    assert len(SECOND_PASSES) == 3 and len(UNITS) == len(FINDERS)


def test_every_claim_read_is_claimed_by_some_spec():
    claimed = set().union(*(s.claimed for s in CATALOGUE.values()))
    read = {r for s in CATALOGUE.values() for r in s.reads} - {"*"}
    assert read <= claimed, read - claimed


def test_the_registry_runs_each_finder_after_what_it_reads():
    for i, f in enumerate(FINDERS):
        assert not any(runs_before(g, f) for g in FINDERS[i + 1 :]), f.name
    assert FINDERS[-1].name == "idle_spend"  # reads "*": the money view of every cause


def _finder(name: str, claims: tuple = (), reads: tuple = ()) -> Finder:
    s = Spec(f"T{name.upper()}001", name, "host", False, claims=claims, reads=reads)
    return Finder(name, lambda c: [], (s,))


def test_the_order_follows_the_declarations_not_the_names():
    a, b = _finder("a", reads=("x",)), _finder("b", claims=("x",))
    assert [f.name for f in in_order([a, b])] == ["b", "a"]
    assert [f.name for f in in_order([b, a])] == ["b", "a"]
    every = _finder("c", reads=("*",))
    assert in_order([every, a, b])[-1] is every


def test_a_cycle_in_the_declarations_is_refused():
    a = _finder("a", claims=("x",), reads=("y",))
    b = _finder("b", claims=("y",), reads=("x",))
    with pytest.raises(ValueError, match="cycle"):
        in_order([a, b])


def test_an_id_registered_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        register(Spec("CKPT001", "again", "host", True))
