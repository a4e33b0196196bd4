"""The timeline: bounded, time-sliced rollups of every series a run produced.

Samples fold into segments of `segment_s` seconds as they arrive. Each segment keeps running
statistics per series (count, sum, min, max, first and last time), stack counts per thread
with a cap on distinct stacks, and call episodes. When there are more than `max_segments`
segments, neighbours merge pairwise and the segment length doubles, so memory does not grow
with run length while any span of the run (the training loop, an hour, a day) can still be
selected and analysed on its own. The same samples in the same order give the same timeline,
so a live run and its replayed recording give the same findings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gpudiag.analyzers.timeline.rollup import (  # noqa: F401 (re-exported: the timeline's types)
    DISTRIBUTIONS,
    Rollup,
    ThreadKey,
    WindowTotals,
    segment_width_ns,
)
from gpudiag.probes.base import Sample

LabelKey = tuple[tuple[str, str], ...]
OTHER_STACKS = "(other stacks)"
_INTERN_MAX = 200_000


class Aggregate:
    """Series rollups, stack counts and call episodes over one span of time; queryable."""

    def __init__(
        self, max_series: int = 4000, max_threads: int = 256, max_stacks_per_thread: int = 4000
    ) -> None:
        self.max_series = max_series
        self.max_threads = max_threads
        self.max_stacks_per_thread = max_stacks_per_thread
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.series: dict[tuple[str, str, LabelKey], Rollup] = {}
        self.stacks: dict[ThreadKey, dict[tuple[str, str], float]] = {}
        self.episodes: dict[tuple[int, str, str], list[float]] = {}
        self.windows: dict[str, WindowTotals] = {}
        self.worker_pids: set[int] = set()
        self.dropped = 0

    # ---- ingest -------------------------------------------------------------------------
    def _span(self, t: int) -> None:
        self.start_ns = t if self.start_ns is None else min(self.start_ns, t)
        self.end_ns = t if self.end_ns is None else max(self.end_ns, t)

    def add_value(self, key: tuple[str, str, LabelKey], t: int, value: float) -> None:
        """Fold one value of one series in."""
        roll = self.series.get(key)
        if roll is None:
            if len(self.series) >= self.max_series:
                self.dropped += 1
                return
            roll = self.series[key] = Rollup(buckets={} if key[1] in DISTRIBUTIONS else None)
        roll.add(t, value)

    def add_window(self, mode: str, values: dict) -> None:
        """Fold one py-spy window's totals in."""
        w = self.windows.setdefault(mode, WindowTotals())
        w.windows += 1
        w.ticks += values.get("ticks") or 0.0
        w.duration_s += values.get("duration_s") or 0.0
        w.errors += values.get("errors") or 0.0
        w.rate_hz = values.get("rate_hz") or w.rate_hz
        w.expected_ticks += (values.get("duration_s") or 0.0) * (values.get("rate_hz") or 0.0)

    def add_episode(self, key: tuple[int, str, str], episodes: float, count: float) -> None:
        """Fold one call-episode count in."""
        ep = self.episodes.get(key)
        if ep is None:
            if len(self.episodes) >= self.max_stacks_per_thread:
                self.dropped += 1
                return
            ep = self.episodes[key] = [0.0, 0.0]
        ep[0] += episodes
        ep[1] += count

    def add_stack(self, tkey: ThreadKey, skey: tuple[str, str], count: float) -> None:
        """Fold one stack count of one thread in."""
        table = self.stacks.get(tkey)
        if table is None:
            if len(self.stacks) >= self.max_threads:
                tkey = ThreadKey(tkey.mode, tkey.role, 0, "(other threads)")
                table = self.stacks.setdefault(tkey, {})
            else:
                table = self.stacks[tkey] = {}
        if skey not in table and len(table) >= self.max_stacks_per_thread:
            skey = (OTHER_STACKS, "")
        table[skey] = table.get(skey, 0.0) + count

    def merge(self, other: Aggregate) -> None:
        """Fold another aggregate in (same caps)."""
        if other.start_ns is not None:
            self._span(other.start_ns)
        if other.end_ns is not None:
            self._span(other.end_ns)
        for key, roll in other.series.items():
            mine = self.series.get(key)
            if mine is None:
                if len(self.series) >= self.max_series:
                    self.dropped += 1
                    continue
                self.series[key] = roll.copy()
            else:
                mine.merge(roll)
        for tkey, table in other.stacks.items():
            for skey, n in table.items():
                self.add_stack(tkey, skey, n)
        for ekey, (episodes, count) in other.episodes.items():
            self.add_episode(ekey, episodes, count)
        for mode, w in other.windows.items():
            self.windows.setdefault(mode, WindowTotals()).merge(w)
        for pid in other.worker_pids:
            if len(self.worker_pids) < 4096:
                self.worker_pids.add(pid)
        self.dropped += other.dropped

    def absorb(self, other: Aggregate) -> None:
        """Take an empty aggregate's place with another's content (no copies: `other` must
        not be used afterwards)."""
        self.start_ns, self.end_ns = other.start_ns, other.end_ns
        self.series, self.stacks, self.episodes = other.series, other.stacks, other.episodes
        self.windows, self.worker_pids, self.dropped = (
            other.windows,
            other.worker_pids,
            other.dropped,
        )

    # ---- queries ------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        """Seconds between the first and the last sample."""
        if self.start_ns is None or self.end_ns is None:
            return 0.0
        return (self.end_ns - self.start_ns) / 1e9

    def rollup(self, probe: str, name: str, **labels: str) -> Rollup | None:
        """The rollup of one series, labels matched exactly."""
        return self.series.get((probe, name, tuple(sorted(labels.items()))))

    def mean(self, probe: str, name: str, **labels: str) -> float | None:
        """Mean of one series, or None when it was never sampled."""
        r = self.rollup(probe, name, **labels)
        return r.mean if r else None

    def maximum(self, probe: str, name: str, **labels: str) -> float | None:
        """Maximum of one series, or None when it was never sampled."""
        r = self.rollup(probe, name, **labels)
        return r.maximum if r and r.count else None

    def matching(self, probe: str, name: str, **labels: str) -> list[tuple[dict, Rollup]]:
        """Every series of a field whose labels include the given ones."""
        out = []
        for (p, n, lk), r in self.series.items():
            if p != probe or n != name:
                continue
            d = dict(lk)
            if all(d.get(k) == v for k, v in labels.items()):
                out.append((d, r))
        return out

    def threads(self, mode: str = "all", role: str = "target") -> list[ThreadKey]:
        """The threads with stacks in one mode and role."""
        return [k for k in self.stacks if k.mode == mode and k.role == role]


class Timeline:
    """A run's samples as time segments. `window()` merges a span of them; any other
    attribute (series, stacks, rollup(), mean(), threads()...) reads the whole run."""

    def __init__(
        self,
        max_series: int = 4000,
        max_threads: int = 256,
        max_stacks_per_thread: int = 4000,
        skip_steps: int = 0,
        segment_s: float = 1.0,
        max_segments: int = 512,
    ) -> None:
        self.caps = (max_series, max_threads, max_stacks_per_thread)
        self.skip_steps = skip_steps  # warm-up: the hooks' first steps are left out
        self.segment_ns = int(segment_s * 1e9)
        self.max_segments = max(2, max_segments)
        self.origin_ns: int | None = None
        self.segments: dict[int, Aggregate] = {}
        self.samples_seen = 0
        self._merged: Aggregate | None = None
        self._intern: dict = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.whole(), name)

    def _new(self) -> Aggregate:
        return Aggregate(*self.caps)

    def _i(self, obj):
        """One shared object per distinct key or stack string (segments repeat them)."""
        got = self._intern.get(obj)
        if got is None:
            if len(self._intern) < _INTERN_MAX:
                self._intern[obj] = obj
            return obj
        return got

    def _segment(self, t: int) -> Aggregate:
        if self.origin_ns is None:
            self.origin_ns = t
        idx = (t - self.origin_ns) // self.segment_ns
        seg = self.segments.get(idx)
        if seg is None:
            if len(self.segments) >= self.max_segments:
                self._coarsen()
                return self._segment(t)
            seg = self.segments[idx] = self._new()
        return seg

    def _coarsen(self) -> None:
        """Merge neighbouring segments pairwise; the segment length doubles."""
        merged: dict[int, Aggregate] = {}
        for idx in sorted(self.segments):
            seg = self.segments[idx]
            into = merged.get(idx // 2)
            if into is None:
                merged[idx // 2] = seg
            else:
                into.merge(seg)
        self.segments = merged
        self.segment_ns *= 2

    # ---- ingest -------------------------------------------------------------------------
    def add(self, sample: Sample) -> None:
        """Fold one sample in."""
        self.samples_seen += 1
        self._merged = None
        t = sample.t_ns
        seg = self._segment(t)
        seg._span(t)
        lab = sample.labels
        if sample.probe == "stacks" and lab.get("kind") != "source":  # a line's text: a series
            self._add_stack(seg, lab, sample.values)
            return
        if self.skip_steps and sample.probe == "hooks" and lab.get("kind") == "step":
            self.skip_steps -= 1
            return
        lk = self._i(tuple(sorted(lab.items())))
        for name, value in sample.values.items():
            if value is None or not math.isfinite(value):  # NaN would poison every mean
                continue
            seg.add_value(self._i((sample.probe, name, lk)), t, float(value))

    def extend(self, samples: Iterable[Any]) -> None:
        """Fold many samples in, in order."""
        for s in samples:
            self.add(s)

    def add_segment(self, origin_ns: int, start_ns: int, width_ns: int, agg: Aggregate) -> None:
        """Fold in a segment recorded by another timeline with the same origin (a windows
        recording): the timeline first coarsens to at least the segment's width, as the
        recording one had, so replaying the segments gives the live timeline's segments."""
        self._merged = None
        if self.origin_ns is None:
            self.origin_ns = origin_ns
        while self.segment_ns < width_ns:
            self._coarsen()
        seg = self._segment(start_ns)
        if not seg.series and not seg.stacks and not seg.episodes and seg.start_ns is None:
            seg.absorb(agg)
        else:
            seg.merge(agg)

    def _add_stack(self, seg: Aggregate, lab: dict, values: dict) -> None:
        kind = lab.get("kind", "stack")
        mode = lab.get("mode", "all")
        if kind == "window":
            seg.add_window(mode, values)
            return
        if kind == "episode":
            key = self._i((int(lab.get("tid", "0")), lab.get("thread", ""), lab.get("anchor", "")))
            seg.add_episode(key, values.get("episodes") or 0.0, values.get("count") or 0.0)
            return
        role = lab.get("role", "target")
        if role == "worker":
            pid = int(lab.get("pid", "0"))
            if pid not in seg.worker_pids and len(seg.worker_pids) < 4096:
                seg.worker_pids.add(pid)
            tkey = ThreadKey(mode, role, 0, lab.get("thread", ""))
        else:
            tkey = ThreadKey(mode, role, int(lab.get("tid", "0")), lab.get("thread", ""))
        skey = self._i((lab.get("stack", ""), lab.get("code", "")))
        seg.add_stack(self._i(tkey), skey, values.get("count") or 0.0)

    def snapshot(self) -> Timeline:
        """A copy later samples do not change: a live view analyses it without holding the
        lock the probes' ingest takes (copying costs a merge of each segment, not an analysis)."""
        out = Timeline.__new__(Timeline)
        out.__dict__.update(self.__dict__)
        out.segments = {}
        for idx, seg in self.segments.items():
            copy = self._new()
            copy.merge(seg)
            out.segments[idx] = copy
        out._merged = None
        out._intern = {}
        return out

    # ---- spans --------------------------------------------------------------------------
    def spans(self) -> list[tuple[int, int, Aggregate]]:
        """(start_ns, end_ns, aggregate) of every segment, in time order."""
        if self.origin_ns is None:
            return []
        return [
            (
                self.origin_ns + i * self.segment_ns,
                self.origin_ns + (i + 1) * self.segment_ns,
                self.segments[i],
            )
            for i in sorted(self.segments)
        ]

    def take(self, done: Any) -> list[tuple[int, int, Aggregate]]:
        """Remove and return the segments (start_ns, end_ns, aggregate) whose end `done`
        accepts, in time order (a recording's buffer hands them to the file)."""
        out = []
        origin = self.origin_ns or 0  # set once there is a segment to take
        for start, end, seg in self.spans():
            if done(end):
                del self.segments[(start - origin) // self.segment_ns]
                out.append((start, end, seg))
        if out:
            self._merged = None
        return out

    def window(self, start_ns: int | None, end_ns: int | None) -> Aggregate:
        """The samples between two times, merged (segments whose middle lies inside)."""
        out = self._new()
        for a, b, seg in self.spans():
            mid = (a + b) // 2
            if (start_ns is None or mid >= start_ns) and (end_ns is None or mid <= end_ns):
                out.merge(seg)
        return out

    def window_totals(self, mode: str = "all") -> WindowTotals | None:
        """py-spy window totals of one mode over the run, without merging every segment's
        stacks (cheap enough for a progress line)."""
        out = None
        for seg in self.segments.values():
            w = seg.windows.get(mode)
            if w is not None:
                out = out or WindowTotals()
                out.merge(w)
        return out

    def whole(self) -> Aggregate:
        """The whole run as one aggregate (cached until the next sample)."""
        if self._merged is None:
            whole = self._new()
            for _, _, seg in self.spans():
                whole.merge(seg)
            self._merged = whole
        return self._merged
