"""INFER003: most of the tokens a model's forwards compute are padding, from the attention
masks the in-process hooks counted: every forward of an inference loop or a server, a sampled
forward of a training job (its forward and backward both scale with the padded length)."""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.serving import forward_busy_share
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds

INFER003 = register(
    Spec(
        "INFER003",
        "Most of the tokens the model computes are padding",
        "gpu",
        False,
        None,  # a warning at most: what the model's time gives back is a hypothesis,
        claims=("loop_time",),
        doc=Doc(
            means=(
                "most of the tokens the model's forwards compute are padding: their attention "
                "masks (counted by the hooks: `model(**batch)`, a features dict, a BatchEncoding;"
                " on a GPU one forward in 4, read without a sync) show `pad_beyond_warn` (0.30) "
                "or more of the tokens padded past each batch's longest row "
                '(`padding="max_length"`), or `pad_share_warn` (0.50) or more padding at all '
                "(rows of unlike lengths in one batch), over `pad_min_forwards` forwards, in an "
                "inference loop or a server (every forward) or a training job (a forward every "
                "50 ms at most, by a pre-hook on the model; the share it costs is the step's "
                "forward and backward)"
            ),
            fix=(
                "`padding=True` (each batch to its longest row) instead of "
                '`padding="max_length"`, `DataCollatorWithPadding` for a dataset tokenized once '
                "(run_glue.py: `--pad_to_max_length False`); sort by length before batching "
                "(sentence-transformers' `encode()` does; in training Trainer's "
                '`group_by_length=True`, in transformers 5 `train_sampling_strategy="group_by_'
                'length"`)'
            ),
            measured=(
                Measured(
                    impact=(
                        "F x (1 - (L1/L0)^2): F the forwards' share of the work, L0 the padded "
                        "row length, L1 the length the fix leaves (each batch's longest; sorted "
                        "by length, the hooks' sorted batches of the last 4096 rows; without them"
                        " the real length, a bound)"
                    ),
                    speedup=(
                        "a hypothesis, unverified: the forwards' time in proportion to the row "
                        "length (the matrix products: 1 / (1 - F (1 - L1/L0))) or to its square "
                        "(attention, with the mean squared lengths), F as the stacks sample it "
                        "and as the hooks time it: the lowest of the four to the highest"
                    ),
                    checked=(
                        "x1.52-x2.05 / x1.62-x1.64; x1.78-x4.80 / x2.04-x2.08 (all-MiniLM-L6-v2, "
                        "CPU)"
                    ),
                ),
            ),
        ),
    )
)


HK = "hooks"


@dataclass(frozen=True)
class Padded:
    """The forwards' rows, in tokens a row (and squared): as padded, each batch's longest,
    real, and sorted by length (the hooks' summary of the last kept rows; None without)."""

    padded: float
    longest: float
    real: float
    share: float  # of the tokens computed, padding
    beyond: float  # of the tokens computed, padding past each batch's longest row
    padded_sq: float
    longest_sq: float
    sorted_len: float | None
    sorted_sq: float | None

    def to_longest(self, th: Thresholds) -> bool:
        """Whether the fix is padding each batch to its longest row (rows padded past it far
        enough), else sorting by length."""
        return self.beyond >= th.pad_beyond_warn

    def after(self, th: Thresholds) -> tuple[float, float]:
        """(row length, its square) the fix leaves: each batch's longest; sorted by length,
        the hooks' sorted batches, else the real length (a bound)."""
        if self.to_longest(th):
            return self.longest, self.longest_sq
        if self.sorted_len is not None and self.sorted_sq is not None:
            return self.sorted_len, self.sorted_sq
        return self.real, self.real * self.real


def padded(m: dict, th: Thresholds) -> Padded | None:
    """The forwards' padding, when enough forwards were counted and what the fix leaves out
    crosses its threshold."""
    keys = (
        "padded_length_mean",
        "longest_length_mean",
        "real_length_mean",
        "padding_share",
        "padding_beyond_longest_share",
        "padded_length_sq_mean",
        "longest_length_sq_mean",
    )
    # the masks are exact counts: `pad_min_forwards` of them, not serve_min_forwards' timings
    # (a 6-layer encoder at 580 ms a batch of 32 on one CPU thread made 31 in a 28 s look)
    if (
        any(m.get(k) is None for k in keys)
        or (m.get("padded_forwards") or 0.0) < th.pad_min_forwards
    ):
        return None
    v = [float(m[k]) for k in keys]
    p = Padded(
        padded=v[0],
        longest=v[1],
        real=v[2],
        share=v[3],
        beyond=v[4],
        padded_sq=v[5],
        longest_sq=v[6],
        sorted_len=m.get("sorted_length_mean"),
        sorted_sq=m.get("sorted_length_sq_mean"),
    )
    if p.to_longest(th):
        return p
    # rows of unlike lengths: padding at all crosses its threshold, and sorting removes enough
    if p.share < th.pad_share_warn or 1.0 - p.after(th)[0] / p.padded < th.pad_beyond_warn:
        return None
    return p


def _speedups(busy: tuple[float, float], p: Padded, th: Thresholds) -> tuple[float, float]:
    """(low, high): the forwards' time in proportion to their row length (the matrix
    products), and to its square (attention), cut to what the fix leaves; the low end with
    the lower of the forwards' two measured shares, the high end with the higher."""
    length, square = p.after(th)
    lin, quad = length / p.padded, square / p.padded_sq
    # rows of unlike lengths: the squares' mean can shrink less than the lengths' (sorted
    # batches keep a long tail), so either model may give the lower end
    ends = [1.0 / (1.0 - f * (1.0 - k)) for f in busy for k in (lin, quad)]
    return min(ends), max(ends)


def training_shares(c: Context) -> tuple[float, float] | None:
    """(lower, higher) of a training step's forward and backward share: as the stacks sample
    the loop thread, and as the hooks time the model's units on their sampled steps (None
    when neither gives one)."""
    stacks = c.shares.get("forward", 0.0) + c.shares.get("backward", 0.0)
    table = c.compute
    rows = table.unit_rows() if table is not None and table.timed_steps > 0 else ()
    hooks = sum(r.share for r in rows) if rows else stacks
    if max(stacks, hooks) <= 0:
        return None
    stacks = stacks or hooks
    return min(1.0, hooks, stacks), min(1.0, max(hooks, stacks))


def forward_shares(c: Context, kind: str) -> tuple[float, float] | None:
    """(lower, higher) of the forwards' share of the work as the hooks time it (Little's
    law: wall time, inflated where requests share too few cores) and as the stacks sample
    the loop or request threads (None when the hooks give none); a training step's forward
    and backward (training_shares)."""
    if kind == "training":
        return training_shares(c)
    hooks = forward_busy_share(c.metrics, kind)
    if not hooks:
        return None
    stacks = c.shares.get("forward") or hooks
    return min(1.0, hooks, stacks), min(1.0, max(hooks, stacks))


def _message(p: Padded, th: Thresholds, forwards: float, sampled: bool = False) -> str:
    head = (
        f"{p.share:.0%} of the tokens the model's forwards compute are padding: rows padded to "
        f"{p.padded:.0f} tokens on average, each batch's longest row {p.longest:.0f}, a row's "
        f"real tokens {p.real:.0f} (the attention masks of {forwards:.0f} "
        + ("training forwards, sampled)." if sampled else "forwards).")
    )
    sort = (
        f" Sorted by length and batched alike, the rows pad to {p.sorted_len:.0f}."
        if p.sorted_len is not None
        else ""
    )
    if p.to_longest(th):
        return head + (
            f" Padding each batch only to its longest row leaves out {p.beyond:.0%} of that "
            "work." + sort
        )
    return head + " The rows of a batch differ in length." + sort


def _actions(p: Padded, th: Thresholds, kind: str) -> tuple[str, ...]:
    to_longest = (
        f'tokenizer(..., padding=True) (each batch to its longest row) instead of padding="'
        f'max_length" (every row to {p.padded:.0f} tokens); keep truncation=True, max_length=N '
        "to cap long rows; gpudiag try --fix padding -- <the job> measures it",
        "a dataset tokenized once: leave the padding out of its map() and pad each batch "
        "with DataCollatorWithPadding(tokenizer) (Hugging Face's run_glue.py: "
        "--pad_to_max_length False)",
    )
    by_length = (
        "sort the texts by length, batch them in that order and put the outputs back in the "
        "input order (sentence-transformers' encode() does); a datasets.Dataset: "
        ".select(indices sorted by len(input_ids)) before Trainer.predict()/evaluate() "
        "(Trainer's group_by_length=True sorts its training batches only)",
    )
    if kind == "server":
        by_length = (
            "a request of one row needs no padding; a batching server: batch requests of "
            "like lengths together",
        )
    if kind == "training":  # a training set is mostly tokenized once, then collated
        to_longest = to_longest[::-1]
        by_length = (
            "batch rows of like lengths together: Trainer's group_by_length=True "
            "(--group_by_length in the example scripts; transformers 5: train_sampling_strategy="
            '"group_by_length"), or a sampler that draws each batch from rows of like lengths',
        )
    return to_longest + by_length if p.to_longest(th) else by_length + to_longest


def _evidence(p: Padded, th: Thresholds, m: dict, busy: float) -> tuple[Evidence, ...]:
    """The threshold crossed first: padding past the longest row, else padding at all."""
    beyond = th.evidence(
        "pad_beyond_warn", "padding_beyond_longest_share", round(p.beyond, 4), "ratio", ">=", HK
    )
    share = th.evidence("pad_share_warn", "padding_share", round(p.share, 4), "ratio", ">=", HK)
    crossed = (beyond, share) if p.to_longest(th) else (share, beyond)
    return crossed + (
        Evidence("padded_length_mean", round(p.padded, 1), "tokens", source=HK),
        Evidence("longest_length_mean", round(p.longest, 1), "tokens", source=HK),
        Evidence("real_length_mean", round(p.real, 1), "tokens", source=HK),
        Evidence(
            "sorted_length_mean",
            None if p.sorted_len is None else round(p.sorted_len, 1),
            "tokens",
            source=HK,
        ),
        th.evidence(
            "pad_min_forwards", "padded_forwards", m.get("padded_forwards"), "count", ">=", HK
        ),
        Evidence("forward_busy_share", round(busy, 4), "ratio", source=HK),
        Evidence("forward_batch_p50", m.get("forward_batch_p50"), "items", source=HK),
    )


def counted(m: dict, kind: str) -> tuple[float, bool]:
    """(the forwards whose masks were counted, whether they were sampled): a training job's
    forwards are sampled, not recorded."""
    if kind == "training":
        return m.get("padded_forwards") or 0.0, True
    return m.get("forwards") or 0.0, False


def infer003(c: Context) -> list[Finding]:
    """INFER003: the forwards compute mostly padding: rows padded past each batch's longest
    (`padding="max_length"`), or rows of unlike lengths batched together."""
    m, th = c.metrics, c.th
    if c.workload is None or c.workload.kind not in ("server", "inference", "training"):
        return []
    p = padded(m, th)
    shares = forward_shares(c, c.workload.kind) if p is not None else None
    if p is None or shares is None:
        return []
    busy = shares[1]
    work = "the forwards and backwards" if c.workload.kind == "training" else "the forwards"
    after = p.after(th)[0]
    low, high = _speedups(shares, p, th)
    fix = (
        "to each batch's longest row"
        if p.to_longest(th)
        else "sorted by their token length, the last rows batched alike"
        if p.sorted_len is not None
        else "sorted by length: the real length, a bound"
    )
    return [
        new_finding(
            "INFER003",
            th,
            confidence=0.9,
            impact=1.0 - 1.0 / high,
            message=_message(p, th, *counted(m, c.workload.kind)),
            evidence=_evidence(p, th, m, busy),
            recommendation=Recommendation(
                "Pad each batch to its longest row, not a fixed length"
                if p.to_longest(th)
                else "Batch rows of like lengths together",
                _actions(p, th, c.workload.kind),
            ),
            expected_speedup=round(high, 3),
            signals=(HK,),
            speedup_basis=f"a hypothesis, unverified: rows of {p.padded:.0f} tokens cut to "
            f"{after:.0f} ({fix}), {work} {shares[0]:.0%}-{busy:.0%} of the work (the "
            f"stacks' share and the hooks' timing); x{low:.2f} to "
            f"x{high:.2f}: their time in proportion to the row length (the matrix products) "
            "or to its square (attention)"
            + ("; gpudiag try measures it (fix kind padding)" if p.to_longest(th) else ""),
            speedup_kind="hypothesis",
            speedup_low=round(low, 3),
            # from outside only the tokenizer's padding="max_length" (sorting is the job's)
            fix={"kind": "padding", "values": {}} if p.to_longest(th) else None,
        )
    ]


def find(c: Context) -> list[Finding]:
    """INFER003, from the analysis context."""
    return infer003(c)


FINDER = Finder("padding", find, (INFER003,))
