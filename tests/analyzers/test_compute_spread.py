"""COMP001's modelled speed-up spans the step (issue 55): a cause shown at several places
(a checkpoint on every block) is modelled at every one of them, whatever its share, and a
place with twins doing the same work without the reason (a float64 block among float32 ones)
gives back its time over theirs, the casts it forces inside it counted."""

from __future__ import annotations

from gpudiag.analyzers.findings.compute import find, reasons, spread
from gpudiag.analyzers.measures.compute import Attainable, ComputeTable, Row
from gpudiag.analyzers.model.thresholds import Thresholds


def unit(name: str, t: float, fwd: float, bwd: float, dtype: str = "float32") -> Row:
    """A unit of `t` seconds of a 1 s step with `fwd` and `bwd` FLOPs (bytes 0)."""
    return Row(name, "unit", t / 3, 2 * t / 3, t, fwd, bwd, 0.0, 8, 100, dtype, 1, t / 2)


def table(*rows: Row) -> ComputeTable:
    att = Attainable(1e9, 1e9, "float32", "calibration")
    return ComputeTable(tuple(rows), 1.0, 5, 2, "Net", "float32", att, "cpu")


class Ctx:
    """What the finder reads: the table, the thresholds and the loop's loading share."""

    class profile:  # noqa: N801 (the context's field)
        @staticmethod
        def share(category: str) -> float:
            return 0.0

    def __init__(self, t: ComputeTable) -> None:
        self.compute, self.th = t, Thresholds()


def test_a_checkpoint_on_every_block_is_modelled_at_every_block():
    # four checkpointed blocks (backward 3x the forward's FLOPs), one under comp_share_warn
    rows = [unit(f"blocks.{i}", s, 1e6, 3e6) for i, s in enumerate((0.25, 0.2, 0.2, 0.1))]
    t = table(*rows, unit("head", 0.05, 1e5, 2e5))
    action = reasons(rows[0], t, Thresholds())[0][1]
    assert abs(spread(action, t, Thresholds()) - 0.75 * 0.25) < 1e-9
    (f,) = find(Ctx(t))  # type: ignore[arg-type]
    assert abs(f.impact - 0.75 * 0.25) < 1e-9  # not the blocks above 15% alone (0.65 x 0.25)


def test_a_float64_block_gives_back_its_time_over_its_float32_twins():
    twins = [unit(f"blocks.{i}", 0.1, 1e6, 2e6) for i in (0, 2, 3)]
    slow = unit("blocks.1", 0.4, 1e6, 2e6, dtype="float64")  # 4x its twins' time
    (f,) = find(Ctx(table(twins[0], slow, *twins[1:])))  # type: ignore[arg-type]
    assert "blocks.1" in f.title and "float64" in f.message
    assert abs(f.impact - 0.4 * 0.75) < 1e-9  # its excess over the twins, above half its time


def test_without_twins_the_reasons_model_stands():
    slow = unit("blocks.1", 0.4, 1e6, 2e6, dtype="float64")
    other = unit("head", 0.1, 5e5, 1e6)
    (f,) = find(Ctx(table(slow, other)))  # type: ignore[arg-type]
    assert abs(f.impact - 0.4 * 0.5) < 1e-9
