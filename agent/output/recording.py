"""Recordings: a run's data as gzip JSON Lines, replayable through the analyzers.

Line 1 is a header (format, version, layout, environment, the run); then the data; the last
line, when the session ended cleanly, is a footer with the probes' status, the errors and how
the run ended. A recording cut short (agent killed) still replays.

Two layouts. `windows` (the default, version 2) holds the live timeline's segments, one per
line, each written once it is complete (and everything at least every 2 minutes): its size
and replay time grow with the number of segments, which the timeline bounds by doubling
their length as the run grows, so a day replays in seconds and the analysis is the live
run's. `samples` (version 1)
holds every sample, one per line: for probe bug reports; it grows with the run.

Size is bounded by rotation: when the file passes half of `max_bytes` (compressed), it is
renamed to FILE.1 (replacing an older FILE.1) and a new FILE starts with the same header and
the next segment number. FILE.1 and FILE together hold the newest half to all of `max_bytes`;
older samples are dropped. Replay reads FILE.1 (when it is this run's previous segment) and
then FILE, line by line as a stream.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeGuard

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import bounded_lines, create_stream, open_regular, parse_json
from gpudiag.agent.output.segment_buffer import SegmentBuffer
from gpudiag.analyzers.timeline.codec import Decoder, TableFull
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import ProbeStatus, Sample
from gpudiag.text.redact import redact_argv

FORMAT = "gpudiag-recording"
FORMAT_VERSION = 2  # windows; samples recordings are version 1
LAYOUTS = ("windows", "samples")
DEFAULT_MAX_BYTES = 1024 * 1024 * 1024  # 1 GiB on disk, FILE and FILE.1 together
# what replay accepts (module settings: tests lower them): one line, the whole file
# decompressed, and the distinct keys/threads/stacks a file's windows may define
MAX_LINE_BYTES = 64 * 1024 * 1024
MAX_UNZIPPED_BYTES = 64 * 1024 * 1024 * 1024
MAX_TABLE_ENTRIES = 2_000_000
# counted before a line is parsed: its items (commas, objects, lists: a day's window holds a
# few thousand), and the empty lines of a file (a writer leaves none: a flood is refused)
MAX_LINE_ITEMS = 2_000_000
MAX_BLANK_LINES = 10_000
# and their number against the file's size: a gzip of items repeated is small, so a few KiB
# of `{},{},...` lines cost seconds each to parse (issue 53 R6a: 31 KB replayed for 20 s).
# What gpudiag writes holds at most about 17 items per gzip byte (a windows recording of a job
# whose values never change; samples recordings 2-3): past MAX_LINE_ITEMS, a file may hold
# MAX_ITEMS_PER_BYTE items per byte read so far, so replay's work grows with the file's size
MAX_ITEMS_PER_BYTE = 64


class Recorder:
    """Appends samples to a gzip JSON Lines file; safe to call from several threads.

    `max_bytes` bounds the recording on disk (see the module's note on rotation); None keeps
    everything in one file. `layout` is "windows" or "samples" (see the module's note);
    `width_ns` gives the live timeline's segment length, so that the windows written are
    the live run's.
    """

    def __init__(
        self,
        path: str,
        header: dict,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        layout: str = "windows",
        width_ns: Callable[[], int] | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise UsageError(f"unknown recording layout {layout!r}: use one of {LAYOUTS}")
        self.path = path
        self.max_bytes = max_bytes
        self.segment = 0
        self.rotations = 0
        self.failed: str | None = None  # why writing stopped (disk full): the run goes on
        header = dict(header)
        if isinstance(header.get("run"), dict):  # secrets never reach a recording
            header["run"] = {**header["run"], "command": redact_argv(header["run"].get("command"))}
        self._buffer = SegmentBuffer(width_ns) if layout == "windows" else None
        self._header = {
            "format": FORMAT,
            "version": FORMAT_VERSION if layout == "windows" else 1,
            "layout": layout,
            "recording_id": uuid.uuid4().hex,
            **header,
        }
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        self._raw = create_stream(self.path, "recording")  # private; a planted link is replaced
        self._f = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6)
        if self._buffer is not None:
            self._buffer.encoder.reset()  # each file defines the keys it uses
        self._write({**self._header, "segment": self.segment})

    def _write(self, obj: dict) -> None:
        self._f.write((json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8"))

    def _rotate(self) -> None:
        self._f.close()
        self._raw.close()
        os.replace(self.path, self.path + ".1")
        self.segment += 1
        self.rotations += 1
        self._open()

    def write(self, samples: list[Sample]) -> None:
        """Append samples (rotating when the file has grown past its share of max_bytes)."""
        with self._lock:
            if self._f.closed:
                return
            try:
                if self._buffer is not None:
                    for row in self._buffer.add(samples):
                        self._write(row)
                else:
                    for s in samples:
                        self._write(s.to_dict())
                if self.max_bytes is not None and self._raw.tell() >= self.max_bytes // 2:
                    self._rotate()
            except (OSError, UsageError) as exc:  # never let a full disk stop the sampling
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.failed = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        for f in (self._f, self._raw):
            try:
                f.close()
            except OSError:
                pass

    def close(self, footer: dict | None = None) -> None:
        """Write the footer (if given) and close the file."""
        with self._lock:
            if self._f.closed:
                return
            try:
                if self._buffer is not None:
                    for row in self._buffer.flush():
                        self._write(row)
                if footer is not None:
                    self._write(
                        {
                            "footer": True,
                            "segments": self.segment + 1,
                            "rotations": self.rotations,
                            **footer,
                        }
                    )
                self._f.close()
                self._raw.close()
            except OSError as exc:
                self._fail(exc)


@dataclass
class Recording:
    """A recording opened for reading: its header; samples stream from `samples()`, and the
    footer (None when cut short) is known once they have all been read."""

    header: dict
    path: str = ""
    footer: dict | None = None
    previous: str | None = None  # FILE.1 when it holds this run's previous segment

    @property
    def probes(self) -> list[ProbeStatus]:
        """The probes' status as recorded (empty when the footer is missing)."""
        return [
            ProbeStatus(
                p["name"], p["available"], p.get("reason"), p.get("hint"), bool(p.get("info"))
            )
            for p in (self.footer or {}).get("probes", [])
        ]

    @property
    def layout(self) -> str:
        """ "windows" (timeline segments) or "samples" (every sample)."""
        return str(self.header.get("layout") or "samples")

    def _rows(self) -> Iterator[tuple[str, int, dict]]:
        files = ([self.previous] if self.previous else []) + [self.path]
        for path in files:
            lines = iter_lines(path)
            next(lines, None)  # the header
            for n, obj in enumerate(lines, 2):
                if obj.get("footer"):
                    self.footer = checked_footer(obj, f"{path}: line {n}")
                    continue
                yield path, n, obj

    def samples(self) -> Iterator[Sample]:
        """Every sample, oldest first, read line by line (the previous segment first); a
        windows recording has none (UsageError)."""
        if self.layout != "samples":
            raise UsageError(f"{self.path} holds timeline windows, not samples")
        for path, n, obj in self._rows():
            yield sample_of(obj, f"{path}: line {n}")

    def timeline(self, tl: Timeline | None = None) -> Timeline:
        """The run's timeline (folded into `tl` when given), read from the file as a stream
        (either layout)."""
        tl = Timeline() if tl is None else tl
        if self.layout == "samples":
            tl.extend(self.samples())
            return tl
        decoder = Decoder(max_entries=MAX_TABLE_ENTRIES)
        current = None
        for path, n, obj in self._rows():
            if path != current:
                decoder.reset()  # each file defines its own keys
                current = path
            try:
                origin, start, width = (int(x) for x in obj["segment"])
                agg = decoder.decode(obj, tl.caps, start)
                if width <= 0:
                    raise UsageError(f"{path}: line {n} has a window of {width} ns")
                tl.add_segment(origin, start, width, agg)  # (merging checks the values too)
            except TableFull as exc:
                raise UsageError(f"{path}: line {n}: {exc}") from None
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError):
                raise UsageError(f"{path}: line {n} is not a timeline window") from None
        return tl


MAX_T_NS = 2**63 - 1


def sample_of(obj: dict, where: str) -> Sample:
    """A recorded sample, its types checked (a number or None per value, text labels);
    UsageError naming the line when it is not one: nothing malformed reaches the analyzers."""
    probe, t_ns = obj.get("probe"), obj.get("t_ns")
    labels, values = obj.get("labels", {}), obj.get("values", {})
    if (
        not isinstance(probe, str)
        or not _is_number(t_ns)
        or not 0 <= t_ns <= MAX_T_NS
        or not isinstance(labels, dict)
        or not isinstance(values, dict)
        or not all(isinstance(v, (str, int, float)) for v in labels.values())
    ):
        raise UsageError(f"{where} is not a sample")
    for name, v in values.items():  # NaN is a value probes write (json's NaN): kept as is
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise UsageError(f"{where}: value {str(name)[:40]!r} is not a number")
    return Sample(
        probe,
        int(t_ns),
        {str(k): str(v) for k, v in labels.items()},
        {str(k): (None if v is None else float(v)) for k, v in values.items()},
    )


def _is_number(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def checked_footer(obj: dict, where: str) -> dict:
    """The footer with its types checked; UsageError when malformed."""
    probes, errors = obj.get("probes", []), obj.get("errors", [])
    ok = (
        isinstance(probes, list)
        and all(
            isinstance(p, dict)
            and isinstance(p.get("name"), str)
            and isinstance(p.get("available"), bool)
            and all(isinstance(p.get(k), (str, type(None))) for k in ("reason", "hint"))
            for p in probes
        )
        and isinstance(errors, list)
        and all(isinstance(e, dict) for e in errors)
        and all(obj.get(k) is None or _is_number(obj[k]) for k in ("start", "end"))
        and (obj.get("exit_code") is None or type(obj["exit_code"]) is int)
        and isinstance(obj.get("environment", {}), (dict, type(None)))
        and isinstance(obj.get("agent"), (dict, type(None)))
    )
    if not ok:
        raise UsageError(f"{where}: the recording's footer is malformed")
    return obj


def iter_lines(path: str) -> Iterator[dict]:
    """Decoded JSON objects of a recording, one per line; UsageError when it is not one, or
    past the bounds on line length and decompressed size (MAX_LINE_BYTES, MAX_UNZIPPED_BYTES),
    items in a line (MAX_LINE_ITEMS), items per byte of the file (MAX_ITEMS_PER_BYTE) or empty
    lines (MAX_BLANK_LINES), checked before parsing.
    """
    raw = open_regular(path, "recording")
    try:
        with raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
            lines = bounded_lines(f, MAX_LINE_BYTES, MAX_UNZIPPED_BYTES, path)
            blank = items = 0
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    blank += 1
                    if blank > MAX_BLANK_LINES:
                        raise UsageError(f"{path}: more than {MAX_BLANK_LINES} empty lines")
                    continue
                count = line.count(b",") + line.count(b"{") + line.count(b"[")
                if count > MAX_LINE_ITEMS:
                    raise UsageError(f"{path}: line {n} holds more than {MAX_LINE_ITEMS} items")
                items += count
                _check_density(items, raw.tell(), f"{path}: line {n}")
                try:
                    obj = parse_json(line, f"{path}: line {n}", allow_nonfinite=True)
                except UsageError as exc:
                    if "invalid JSON" in str(exc) or "UTF-8" in str(exc):
                        raise UsageError(
                            f"{path}: line {n} is not JSON; not a gpudiag recording"
                        ) from None
                    raise
                if not isinstance(obj, dict):
                    raise UsageError(f"{path}: line {n} is not a JSON object")
                yield obj
    except (gzip.BadGzipFile, EOFError, OSError, zlib.error) as exc:
        if isinstance(exc, EOFError):
            return  # cut short while writing: keep what was complete
        raise UsageError(f"{path} is not a gpudiag recording (not gzip JSON Lines)") from None


def _check_density(items: int, gzip_bytes: int, where: str) -> None:
    """UsageError when the lines so far hold more items than their gzip bytes allow."""
    if items > MAX_LINE_ITEMS + MAX_ITEMS_PER_BYTE * gzip_bytes:
        raise UsageError(
            f"{where}: {items} items in {gzip_bytes} bytes of gzip, more than "
            f"{MAX_ITEMS_PER_BYTE} per byte: not a recording gpudiag wrote"
        )


def _header(path: str) -> dict:
    header = next(iter_lines(path), None)
    if header is None or header.get("format") != FORMAT:
        raise UsageError(f"{path} is not a gpudiag recording (no header)")
    if header.get("version") not in (1, FORMAT_VERSION):
        raise UsageError(
            f"{path} is recording format {header.get('version')!r}; this "
            f"gpudiag reads 1 and {FORMAT_VERSION}"
        )
    run = header.get("run", {})
    command = run.get("command") if isinstance(run, dict) else None
    if (
        not isinstance(run, dict)
        or not isinstance(header.get("environment", {}), dict)
        or type(header.get("segment", 0)) is not int
        or header.get("layout") not in (None, "windows", "samples")
        or not (run.get("pid") is None or type(run["pid"]) is int)
        or not (
            command is None
            or (isinstance(command, list) and all(isinstance(c, str) for c in command))
        )
    ):
        raise UsageError(f"{path}: the recording's header is malformed")
    return header


def _same_owner(path: str, older: str) -> bool:
    """Whether the older segment `FILE.1` exists and belongs to FILE's owner (one another
    user planted beside a recording in a shared folder is never merged into it)."""
    try:
        return os.stat(older).st_uid == os.stat(path).st_uid
    except OSError:
        return False


def open_recording(path: str) -> Recording:
    """Open a recording, checking its header; its samples are read later, as a stream."""
    header = _header(path)
    rec = Recording(header, path)
    segment = int(header.get("segment") or 0)
    older = path + ".1"
    if segment > 0 and _same_owner(path, older):
        try:
            prev = _header(older)
        except UsageError:
            prev = {}
        if (
            prev.get("recording_id") == header.get("recording_id")
            and int(prev.get("segment") or 0) == segment - 1
        ):
            rec.previous = older
    return rec


def read_recording(path: str) -> tuple[Recording, list[Sample]]:
    """Read a whole recording into memory (small ones: tests, tools); replay streams instead."""
    rec = open_recording(path)
    return rec, list(rec.samples())
