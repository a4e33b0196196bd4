"""The windows recording's buffer: samples fold into timeline segments before they are written.

A recording in the windows format stores the segments of the live timeline rather than every
sample, so its size and the time to replay it grow with the number of segments (bounded: the
timeline doubles its segment length as the run grows), not with the number of samples. The
buffer buckets samples exactly as the live timeline does (same origin, same segment length)
and hands out complete segments; late samples for a segment already written make a second row
for it, which replay merges.
"""

from __future__ import annotations

from collections.abc import Callable

from gpudiag.analyzers.timeline.codec import Encoder
from gpudiag.analyzers.timeline.timeline import Timeline, segment_width_ns
from gpudiag.probes.base import Sample

BASE_NS = 1_000_000_000
MAX_SEGMENTS = 512  # the live timeline's default
LAG_NS = 5_000_000_000  # a segment is complete this long after its end (py-spy windows lag)
FLUSH_NS = 120_000_000_000  # at least this often (in sample time) everything is written


class SegmentBuffer:
    """Buckets samples into segments and returns rows to write.

    `width_ns` gives the live timeline's current segment length; without it the length
    follows the run's elapsed time as a timeline with no gaps would.
    """

    def __init__(self, width_ns: Callable[[], int] | None = None) -> None:
        self._width_ns = width_ns
        self._tl = Timeline(segment_s=BASE_NS / 1e9, max_segments=2**31)
        self._newest: int | None = None
        self._flushed_at: int | None = None
        self.encoder = Encoder()

    def add(self, samples: list[Sample]) -> list[dict]:
        """Fold samples in; the rows of the segments now complete."""
        rows: list[dict] = []
        tl = self._tl
        for s in samples:
            if tl.origin_ns is None:
                tl.origin_ns = self._flushed_at = s.t_ns
            if self._newest is None or s.t_ns > self._newest:
                self._newest = s.t_ns
        newest = self._newest  # set with the origin, by the first sample
        if tl.origin_ns is None or newest is None:
            return rows
        width = (
            self._width_ns()
            if self._width_ns is not None
            else segment_width_ns(newest - tl.origin_ns, BASE_NS, MAX_SEGMENTS)
        )
        if width != tl.segment_ns:
            rows += self.flush()
            tl.segment_ns = width
        tl.extend(samples)
        if newest - (self._flushed_at or 0) >= FLUSH_NS:
            return rows + self.flush()
        return rows + self._take(lambda end: end <= newest - LAG_NS)

    def flush(self) -> list[dict]:
        """The rows of every segment buffered, complete or not."""
        if self._newest is not None:
            self._flushed_at = self._newest
        return self._take(lambda end: True)

    def _take(self, done: Callable[[int], bool]) -> list[dict]:
        tl = self._tl
        return [
            {"segment": [tl.origin_ns, start, end - start], **self.encoder.encode(seg, start)}
            for start, end, seg in tl.take(done)
        ]
