"""INFER003: most of the tokens a model's forwards compute are padding, from the attention
masks the in-process hooks counted, in an inference loop or a server (a training job's
forwards are not recorded)."""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.engine.catalogue import new_finding
from gpudiag.analyzers.engine.context import Context
from gpudiag.analyzers.engine.results import Evidence, Finding, Recommendation
from gpudiag.analyzers.engine.thresholds import Thresholds
from gpudiag.analyzers.measures.serving import forward_busy_share

HK = "hooks"


@dataclass(frozen=True)
class Padded:
    """The forwards' row lengths, in tokens a row: as padded, each batch's longest, real."""

    padded: float
    longest: float
    real: float
    share: float  # of the tokens computed, padding
    beyond: float  # of the tokens computed, padding past each batch's longest row

    def target(self, th: Thresholds) -> float:
        """The row length the fix leaves: the batch's longest when the rows are padded past it
        far enough, else the real length (sorted by length: a bound)."""
        return self.longest if self.beyond >= th.pad_beyond_warn else self.real


def padded(m: dict, th: Thresholds) -> Padded | None:
    """The forwards' padding, when enough forwards were counted and it crosses a threshold."""
    keys = ("padded_length_mean", "longest_length_mean", "real_length_mean", "padding_share")
    if any(m.get(k) is None for k in keys) or (m.get("forwards") or 0.0) < th.serve_min_forwards:
        return None
    if (m.get("padded_forwards") or 0.0) < th.pad_min_forwards:
        return None
    p = Padded(
        padded=float(m["padded_length_mean"]),
        longest=float(m["longest_length_mean"]),
        real=float(m["real_length_mean"]),
        share=float(m["padding_share"]),
        beyond=float(m["padding_beyond_longest_share"]),
    )
    if p.beyond < th.pad_beyond_warn and p.share < th.pad_share_warn:
        return None
    return p


def _speedups(busy: float, now: float, after: float) -> tuple[float, float]:
    """(low, high): the forwards' time in proportion to their row length (the matrix
    products), and to its square (attention), rows of `now` tokens cut to `after`."""
    kept = after / now
    return 1.0 / (1.0 - busy * (1.0 - kept)), 1.0 / (1.0 - busy * (1.0 - kept * kept))


def _message(p: Padded, th: Thresholds, forwards: float) -> str:
    head = (
        f"{p.share:.0%} of the tokens the model's forwards compute are padding: rows padded to "
        f"{p.padded:.0f} tokens on average, each batch's longest row {p.longest:.0f}, a row's "
        f"real tokens {p.real:.0f} (the attention masks of {forwards:.0f} forwards)."
    )
    if p.beyond >= th.pad_beyond_warn:
        return head + (
            f" Padding each batch only to its longest row leaves out {p.beyond:.0%} of that "
            "work; sorting the rows by length before batching leaves out more."
        )
    return head + " The rows of a batch differ in length: sorted by length, they pad little."


def _actions(p: Padded, th: Thresholds, kind: str) -> tuple[str, ...]:
    to_longest = (
        f'tokenizer(..., padding=True) (each batch to its longest row) instead of padding="'
        f'max_length" (every row to {p.padded:.0f} tokens); keep truncation=True, max_length=N '
        "to cap long rows",
        "a dataset tokenized once: leave the padding out of its map() and pad each batch "
        "with DataCollatorWithPadding(tokenizer) (Hugging Face's run_glue.py: "
        "--pad_to_max_length False)",
    )
    by_length = (
        "sort the texts by length, batch them in that order and put the outputs back in the "
        "input order (sentence-transformers' encode() does); Trainer: group_by_length=True",
    )
    if kind == "server":
        by_length = (
            "a request of one row needs no padding; a batching server: batch requests of "
            "like lengths together",
        )
    return to_longest + by_length if p.beyond >= th.pad_beyond_warn else by_length + to_longest


def _evidence(p: Padded, th: Thresholds, m: dict, busy: float) -> tuple[Evidence, ...]:
    """The threshold crossed first: padding past the longest row, else padding at all."""
    beyond = Evidence(
        "padding_beyond_longest_share",
        round(p.beyond, 4),
        "ratio",
        th.pad_beyond_warn,
        ">=",
        "pad_beyond_warn",
        HK,
    )
    share = Evidence(
        "padding_share", round(p.share, 4), "ratio", th.pad_share_warn, ">=", "pad_share_warn", HK
    )
    crossed = (beyond, share) if p.beyond >= th.pad_beyond_warn else (share, beyond)
    return crossed + (
        Evidence("padded_length_mean", round(p.padded, 1), "tokens", source=HK),
        Evidence("longest_length_mean", round(p.longest, 1), "tokens", source=HK),
        Evidence("real_length_mean", round(p.real, 1), "tokens", source=HK),
        Evidence(
            "padded_forwards",
            m.get("padded_forwards"),
            "count",
            th.pad_min_forwards,
            ">=",
            "pad_min_forwards",
            HK,
        ),
        Evidence("forward_busy_share", round(busy, 4), "ratio", source=HK),
        Evidence("forward_batch_p50", m.get("forward_batch_p50"), "items", source=HK),
    )


def infer003(c: Context) -> list[Finding]:
    """INFER003: the forwards compute mostly padding: rows padded past each batch's longest
    (`padding="max_length"`), or rows of unlike lengths batched together."""
    m, th = c.metrics, c.th
    if c.workload is None or c.workload.kind not in ("server", "inference"):
        return []
    p = padded(m, th)
    busy = forward_busy_share(m, c.workload.kind)
    if p is None or not busy:
        return []
    busy = min(1.0, busy)
    after = p.target(th)
    low, high = _speedups(busy, p.padded, after)
    fix = "to each batch's longest row" if after == p.longest else "sorted by length"
    return [
        new_finding(
            "INFER003",
            th,
            confidence=0.9,
            impact=1.0 - 1.0 / high,
            message=_message(p, th, m.get("forwards") or 0.0),
            evidence=_evidence(p, th, m, busy),
            recommendation=Recommendation(
                "Pad each batch to its longest row, not a fixed length"
                if after == p.longest
                else "Batch rows of like lengths together",
                _actions(p, th, c.workload.kind),
            ),
            expected_speedup=round(high, 3),
            signals=(HK,),
            speedup_basis=f"a hypothesis, unverified: rows of {p.padded:.0f} tokens cut to "
            f"{after:.0f} ({fix}), the forwards {busy:.0%} of the work; from x{low:.2f} (their "
            f"time in proportion to the row length, as the matrix products) to x{high:.2f} "
            "(to its square, as attention)",
            speedup_kind="hypothesis",
            speedup_low=round(low, 3),
        )
    ]


def find(c: Context) -> list[Finding]:
    """INFER003, from the analysis context."""
    return infer003(c)
