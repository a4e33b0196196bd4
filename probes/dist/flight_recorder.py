"""PyTorch's NCCL flight recorder: the dump files each rank writes on a watchdog timeout
(`TORCH_NCCL_DUMP_ON_TIMEOUT=1`), read into one summary per rank for DIST002.

Each rank writes `${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}${rank}` (default prefix
`/tmp/nccl_trace_rank_`): a dict with `version`, `pg_config` and `entries`, one entry per
collective with `collective_seq_id`, `profiling_name` (e.g. `nccl:all_reduce`), `state`
(`scheduled`, `started`, `completed`) and `process_group` (see
torch/distributed/flight_recorder/components/loader.py). PyTorch writes it with pickle; this
reader refuses every class and function a pickle names (only plain data loads, nothing is
imported or called), and also reads the JSON form (`_dump_nccl_trace_json`). Never raises:
an unreadable dump is skipped.
"""

from __future__ import annotations

import io
from typing import NoReturn
import json
import os
import pickle
from dataclasses import dataclass

from gpudiag.probes.files import read_regular

DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
PREFIX_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class RecorderRank:
    """One rank's dump, summarised: the last collective it entered and the last it completed
    (collective_seq_id, profiling_name) in its default process group."""

    rank: int
    last_entered: tuple[int, str] | None = None
    last_completed: tuple[int, str] | None = None
    pending: int = 0  # entries scheduled or started, not completed
    source: str = ""


class _DataOnly(pickle.Unpickler):
    """Plain data only: any class or function named in the pickle is refused."""

    def find_class(self, module: str, name: str) -> NoReturn:  # noqa: D102
        raise pickle.UnpicklingError(f"refused {module}.{name}")


def load_dump(data: bytes) -> dict | None:
    """A dump's dict from its bytes (JSON or data-only pickle); None when unreadable."""
    try:
        if data[:1] in (b"{", b" ", b"\n"):
            doc = json.loads(data)
        else:
            doc = _DataOnly(io.BytesIO(data)).load()
    except Exception:
        return None
    return doc if isinstance(doc, dict) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def summarise(doc: dict, rank: int, source: str = "") -> RecorderRank | None:
    """The last entered and completed collective of the first process group in the dump."""
    entries = doc.get("entries")
    if not isinstance(entries, list):
        return None
    group = None
    entered = completed = None
    pending = 0
    for e in entries:
        if not isinstance(e, dict):
            continue
        seq = _int(e.get("collective_seq_id"))
        if seq is None or seq == 0:
            continue  # p2p or not a collective
        pg = e.get("process_group")
        pg = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(pg)
        group = pg if group is None else group
        if pg != group:
            continue
        name = str(e.get("profiling_name") or "collective")[:64]
        state = str(e.get("state") or "")
        if state in ("scheduled", "started", "completed") and (
            entered is None or seq >= entered[0]
        ):
            entered = (seq, name)
        if state == "completed":
            if completed is None or seq >= completed[0]:
                completed = (seq, name)
        elif state in ("scheduled", "started"):
            pending += 1
    if entered is None:
        return None
    return RecorderRank(rank, entered, completed, pending, source)


def read_dumps(
    prefix: str | None,
    ranks: list[int],
    since: float = 0.0,
    owners: set[int] | frozenset[int] | None = None,
) -> dict[int, RecorderRank]:
    """The dumps `prefix + rank` written at or after `since` (epoch seconds), summarised:
    through the one bounded reader, regular files of at most MAX_BYTES owned by one of
    `owners` (the ranks' users; by default gpudiag's own), never a FIFO (a planted one at
    the default prefix must not hang the report) nor another user's file."""
    out: dict[int, RecorderRank] = {}
    base = prefix or DEFAULT_PREFIX
    allowed = owners if owners is not None else {os.geteuid()}
    for rank in ranks:
        path = f"{base}{rank}"
        try:
            data = read_regular(path, MAX_BYTES, owners=allowed, since=since)
        except OSError:  # FileRefused too: not regular, another user's, old or too large
            continue
        doc = load_dump(data)
        got = summarise(doc, rank, path) if doc is not None else None
        if got is not None:
            out[rank] = got
    return out
