"""Timeline segments as compact JSON-ready rows, and back.

A recording in the windows format holds the timeline's segments instead of every sample
(see agent/output/recording.py). Keys and strings repeat across segments (series labels, stack
text), so each file carries a table of them: an `Encoder` gives each new key a number the
first time it is written and lists it in that row's `new` entries; a `Decoder` reading the
rows in order rebuilds the same table. Pure data: nothing here reads or writes files.
"""

from __future__ import annotations

from typing import Any

from gpudiag.analyzers.timeline.rollup import Rollup, ThreadKey, WindowTotals
from gpudiag.analyzers.timeline.timeline import Aggregate

MAX_TABLE = 100_000  # entries; past this the table starts again (a row says so)


class Encoder:
    """Turns aggregates into rows, numbering keys and strings once per file."""

    def __init__(self, max_table: int = MAX_TABLE) -> None:
        self._ids: dict[tuple, int] = {}
        self._new: list[list] = []
        self._max = max_table

    def reset(self) -> None:
        """Forget the table (a new file starts: it must define its keys again)."""
        self._ids.clear()
        self._new.clear()

    def _id(self, entry: tuple) -> int:
        got = self._ids.get(entry)
        if got is None:
            got = self._ids[entry] = len(self._ids)
            self._new.append(_entry_json(entry))
        return got

    def encode(self, agg: Aggregate, base_ns: int = 0) -> dict:
        """The JSON-ready form of one aggregate (with the table entries it introduced); its
        times are written relative to `base_ns` (shorter numbers)."""
        restart = len(self._ids) > self._max  # a run whose stacks keep changing: stay bounded
        if restart:
            self.reset()
        series: list[list] = []
        for (probe, name, labels), r in agg.series.items():
            if not r.count:
                continue
            kid = self._id(("k", probe, name, labels))
            buckets = [x for b, n in r.buckets.items() for x in (b, n)] if r.buckets else None
            series.append(
                [kid, r.count, r.total, r.minimum, r.maximum, r.last, _rel(r.first_ns, base_ns)]
                + [_rel(r.last_ns, base_ns)]
                + ([buckets] if r.buckets is not None else [])
            )
        stacks = []
        for tkey, table in agg.stacks.items():
            tid = self._id(("t", tkey.mode, tkey.role, tkey.tid, tkey.thread))
            flat: list = []
            for (stack, code), n in table.items():
                flat += (self._id(("s", stack)), self._id(("s", code)), n)
            stacks.append([tid, flat])
        episodes = [
            [tid, self._id(("s", thread)), self._id(("s", anchor)), ep, count]
            for (tid, thread, anchor), (ep, count) in agg.episodes.items()
        ]
        row = {
            "span": [_rel(agg.start_ns, base_ns), _rel(agg.end_ns, base_ns)],
            "series": series,
            "stacks": stacks,
            "episodes": episodes,
            "windows": {
                mode: [w.windows, w.ticks, w.duration_s, w.errors, w.rate_hz, w.expected_ticks]
                for mode, w in agg.windows.items()
            },
            "workers": sorted(agg.worker_pids),
            "dropped": agg.dropped,
            "new": self._new[:],
        }
        if restart:
            row["restart"] = True
        self._new.clear()
        return row


def _rel(t: int | None, base: int) -> int | None:
    return None if t is None else t - base


def _abs(t: Any, base: int) -> int | None:
    return None if t is None else int(t) + base


def _entry_json(entry: tuple) -> list:
    if entry[0] == "k":
        _, probe, name, labels = entry
        return ["k", probe, name, [list(p) for p in labels]]
    return list(entry)


class TableFull(ValueError):
    """A file defines more distinct keys, threads and stacks than the reader accepts."""


class _Table:
    """The decoder's table, looked up by an entry's number: a whole number from 0 (a negative
    one would count from the end, a float or a bool pass for one), KeyError otherwise."""

    def __init__(self, entries: list) -> None:
        self.entries = entries

    def __getitem__(self, i: object) -> Any:
        if type(i) is not int or not 0 <= i < len(self.entries):
            raise KeyError(f"no table entry {i!r}")
        return self.entries[i]


class Decoder:
    """Rebuilds aggregates from the rows of one file, in the order they were written (at
    most `max_entries` distinct keys, threads and stacks: TableFull past them)."""

    def __init__(self, max_entries: int | None = None) -> None:
        self._table: list = []
        self.max_entries = max_entries

    def reset(self) -> None:
        """Forget the table (the next file defines its own)."""
        self._table.clear()

    def _learn(self, entries: list) -> None:
        if self.max_entries is not None and len(self._table) + len(entries) > self.max_entries:
            raise TableFull(f"more than {self.max_entries} distinct keys, threads and stacks")
        for e in entries:
            tag = e[0]
            if tag == "k":
                self._table.append((str(e[1]), str(e[2]), tuple((str(k), str(v)) for k, v in e[3])))
            elif tag == "t":
                self._table.append(ThreadKey(str(e[1]), str(e[2]), int(e[3]), str(e[4])))
            elif tag == "s":
                self._table.append(str(e[1]))
            else:
                raise ValueError(f"unknown table entry {tag!r}")

    def decode(
        self, row: dict, caps: tuple[int, int, int] = (4000, 256, 4000), base_ns: int = 0
    ) -> Aggregate:
        """The aggregate of one row, its times relative to `base_ns` (ValueError, KeyError,
        TypeError or IndexError when the row is malformed)."""
        if row.get("restart"):
            self.reset()
        self._learn(row.get("new") or [])
        t = _Table(self._table)
        agg = Aggregate(*caps)
        start, end = row["span"]
        agg.start_ns, agg.end_ns = _abs(start, base_ns), _abs(end, base_ns)
        for item in row["series"]:
            kid, count, total, lo, hi, last, first_ns, last_ns = item[:8]
            r = Rollup(
                int(count),
                float(total),
                float(lo),
                float(hi),
                None if last is None else float(last),
                None if first_ns is None else int(first_ns) + base_ns,
                None if last_ns is None else int(last_ns) + base_ns,
            )
            if len(item) > 8:
                flat = item[8] or []
                r.buckets = {int(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
            agg.series[t[kid]] = r
        for tid, flat in row["stacks"]:
            table = agg.stacks[t[tid]] = {}
            for i in range(0, len(flat), 3):
                table[(t[flat[i]], t[flat[i + 1]])] = float(flat[i + 2])
        for tid, thread, anchor, ep, count in row["episodes"]:
            agg.episodes[(int(tid), t[thread], t[anchor])] = [float(ep), float(count)]
        for mode, (n, ticks, dur, errors, rate, *more) in row["windows"].items():
            expected = more[0] if more else dur * rate  # older files: at the last rate
            agg.windows[str(mode)] = WindowTotals(
                int(n), int(ticks), float(dur), int(errors), float(rate), float(expected)
            )
        agg.worker_pids = {int(p) for p in row.get("workers", [])}
        agg.dropped = int(row.get("dropped", 0))
        return agg
