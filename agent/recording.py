"""Recordings: every sample of a run as gzip JSON Lines, replayable through the analyzers.

Line 1 is a header (format, version, environment, the run); then one sample per line; the
last line, when the session ended cleanly, is a footer with the probes' status, the errors
and how the run ended. A recording cut short (agent killed) still replays.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpudiag.agent.errors import UsageError
from gpudiag.probes.base import ProbeStatus, Sample

FORMAT = "gpudiag-recording"
FORMAT_VERSION = 1


class Recorder:
    """Appends samples to a gzip JSON Lines file; safe to call from several threads."""

    def __init__(self, path: str, header: dict) -> None:
        try:
            self._f = gzip.open(path, "wt", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write recording {path}: {exc.strerror}") from None
        self.path = path
        self._lock = threading.Lock()
        self._write({"format": FORMAT, "version": FORMAT_VERSION, **header})

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def write(self, samples: list[Sample]) -> None:
        """Append samples."""
        with self._lock:
            if self._f.closed:
                return
            for s in samples:
                self._write(s.to_dict())

    def close(self, footer: dict | None = None) -> None:
        """Write the footer (if given) and close the file."""
        with self._lock:
            if self._f.closed:
                return
            if footer is not None:
                self._write({"footer": True, **footer})
            self._f.close()


@dataclass
class Recording:
    """A recording read back: its header, samples and footer (None when cut short)."""

    header: dict
    samples: list[Sample] = field(default_factory=list)
    footer: dict | None = None

    @property
    def probes(self) -> list[ProbeStatus]:
        """The probes' status as recorded (empty when the footer is missing)."""
        return [ProbeStatus(p["name"], p["available"], p.get("reason"), p.get("hint"),
                            bool(p.get("info")))
                for p in (self.footer or {}).get("probes", [])]


def iter_lines(path: str) -> Iterator[dict]:
    """Decoded JSON objects of a recording, one per line; UsageError when it is not one."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    raise UsageError(f"{path}: line {n} is not JSON; not a gpudiag "
                                     "recording") from None
                if not isinstance(obj, dict):
                    raise UsageError(f"{path}: line {n} is not a JSON object")
                yield obj
    except FileNotFoundError:
        raise UsageError(f"recording not found: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a recording") from None
    except (gzip.BadGzipFile, EOFError, UnicodeDecodeError, OSError) as exc:
        if isinstance(exc, EOFError):
            return  # cut short while writing: keep what was complete
        raise UsageError(f"{path} is not a gpudiag recording (not gzip JSON Lines)") from None


def read_recording(path: str) -> Recording:
    """Read a whole recording, checking its header."""
    lines = iter_lines(path)
    header = next(lines, None)
    if header is None or header.get("format") != FORMAT:
        raise UsageError(f"{path} is not a gpudiag recording (no header)")
    if header.get("version") != FORMAT_VERSION:
        raise UsageError(f"{path} is recording format {header.get('version')!r}; this "
                         f"gpudiag reads {FORMAT_VERSION}")
    rec = Recording(header)
    for n, obj in enumerate(lines, 2):
        if obj.get("footer"):
            rec.footer = obj
            continue
        try:
            rec.samples.append(Sample.from_dict(obj))
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"{path}: line {n} is not a sample") from None
    return rec
