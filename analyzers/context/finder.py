"""A finding unit's entry in the registry: its `find(ctx)` and the specs it makes, ordered by
what the specs declare (what each claims of the loop, what each reads), never by a list."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.model.catalogue import Spec
from gpudiag.analyzers.model.results import Finding

EVERY = "*"  # a read of everything the other finders make: run after all of them


@dataclass(frozen=True)
class Finder:
    """One unit's `find(ctx)` and the specs of the findings it makes."""

    name: str
    find: Callable[[Context], list[Finding]]
    makes: tuple[Spec, ...]

    @property
    def claims(self) -> frozenset[str]:
        """What the findings this finder makes claim of the loop."""
        return frozenset().union(*(s.claimed for s in self.makes))

    @property
    def reads(self) -> frozenset[str]:
        """The claims this finder reads (its findings' `reads`)."""
        return frozenset(r for s in self.makes for r in s.reads)


def runs_before(a: Finder, b: Finder) -> bool:
    """Whether `a` must run before `b`: `b` reads what `a` claims, or reads everything."""
    if a is b:
        return False
    if EVERY in b.reads:
        return EVERY not in a.reads
    return bool(a.claims & b.reads)


def in_order(finders: Iterable[Finder]) -> tuple[Finder, ...]:
    """The finders in an order that puts every finder after those whose claims it reads (by
    name among the ready ones, so the order is stable); a cycle in the declarations raises."""
    left = sorted(finders, key=lambda f: f.name)
    done: list[Finder] = []
    while left:
        ready = [f for f in left if not any(runs_before(g, f) for g in left)]
        if not ready:
            raise ValueError(f"finders' claims and reads form a cycle: {[f.name for f in left]}")
        done.append(ready[0])
        left.remove(ready[0])
    return tuple(done)
