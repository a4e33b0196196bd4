"""A bound on what a user's regular expression can cost (issue 38).

Frame rules come from `[[tool.gpudiag.rules]]` of a pyproject.toml that gpudiag reads without
being named, and Python's `re` backtracks: `(a+)+b`, `(a|a)*b` or `\\w*\\w*\\w*\\w*!` over a
long frame name runs for hours and hangs run, attach and replay. A user pattern is therefore
refused unless its cost is bounded: at most MAX_PATTERN_CHARS characters, no quantifier
inside a repeated group, no alternation inside a repeat, no backreference, and at most
MAX_VARIABLE_REPEATS quantifiers of variable length; and the text it is matched against is
cut to MAX_SUBJECT_CHARS. The worst case left is polynomial and small (two quantifiers over
512 characters: about 0.02 s, once per distinct frame).
"""

from __future__ import annotations

import re

try:  # Python 3.11+ (private modules of `re`, the parser the regex engine itself uses)
    from re import _constants as _c  # type: ignore[attr-defined]  # no stubs for re's parser
    from re import _parser as _sre  # type: ignore[attr-defined]  # no stubs for re's parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _c
    import sre_parse as _sre

MAX_PATTERN_CHARS = 200
MAX_VARIABLE_REPEATS = 2
MAX_SUBJECT_CHARS = 512

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT} | (
    {_c.POSSESSIVE_REPEAT} if hasattr(_c, "POSSESSIVE_REPEAT") else set()
)
_REFS = {_c.GROUPREF, _c.GROUPREF_EXISTS} | (
    {_c.GROUPREF_IGNORE} if hasattr(_c, "GROUPREF_IGNORE") else set()
)


class CostlyPattern(ValueError):
    """A pattern whose matching time is not bounded."""


def check_pattern(pattern: object, what: str) -> str:
    """`pattern` when it is a string whose matching cost is bounded; else ValueError
    (CostlyPattern, re.error as ValueError) with a readable reason."""
    if not isinstance(pattern, str):
        raise ValueError(f"{what} must be a string (a regular expression)")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise CostlyPattern(f"{what} is longer than {MAX_PATTERN_CHARS} characters")
    try:
        parsed = _sre.parse(pattern)
    except re.error as exc:
        raise ValueError(f"{what}: bad regular expression: {exc}") from None
    variable = _walk(list(parsed), in_repeat=False, what=what)
    if variable > MAX_VARIABLE_REPEATS:
        raise CostlyPattern(
            f"{what} has {variable} quantifiers of variable length (at most "
            f"{MAX_VARIABLE_REPEATS}: matching could take hours); split it over function, "
            "file and code"
        )
    return pattern


def _walk(items: list, in_repeat: bool, what: str) -> int:
    """The variable-length quantifiers in `items`; CostlyPattern on a nested one, an
    alternation inside a repeat or a backreference."""
    n = 0
    for op, av in items:
        if op in _REPEATS:
            lo, hi, sub = av
            if hi != lo and in_repeat:
                raise CostlyPattern(f"{what} repeats a quantifier (like `(a+)+`): it backtracks")
            n += hi != lo
            n += _walk(list(sub), in_repeat or hi > 1, what)
        elif op in _REFS:
            raise CostlyPattern(f"{what} uses a backreference")
        elif op == _c.BRANCH:
            if in_repeat:
                raise CostlyPattern(f"{what} repeats an alternation (like `(a|ab)*`)")
            n += sum(_walk(list(b), in_repeat, what) for b in av[1])
        elif op == _c.SUBPATTERN:
            n += _walk(list(av[-1]), in_repeat, what)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            n += _walk(list(av[1]), in_repeat, what)
        elif op == getattr(_c, "ATOMIC_GROUP", None):
            n += _walk(list(av), in_repeat, what)
    return n


def subject(text: str) -> str:
    """The text a user pattern is matched against, cut to MAX_SUBJECT_CHARS."""
    return text[:MAX_SUBJECT_CHARS]
