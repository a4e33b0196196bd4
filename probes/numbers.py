"""The one parser of numbers gpudiag takes from outside (config files, reports, a job's step
log, the hooks' datagrams): every such number goes through `finite_number`, which refuses
NaN and the infinities in any spelling ("nan", "NaN%", "inf", "-Infinity", 1e400, a float
that overflows), booleans and whatever is not a number.
"""

from __future__ import annotations

import math

MAX_TEXT = 64  # a number's text: longer is not a number someone meant


def finite_number(value: object, percent: bool = False) -> float:
    """A finite float from an int, a float or its text (with `percent`, a trailing '%' is
    allowed and divides by 100); ValueError otherwise, NaN and infinities included."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, int):
        v = float(value)  # OverflowError for a huge int is a ValueError-like refusal below
    elif isinstance(value, float):
        v = value
    elif isinstance(value, str) and len(value) <= MAX_TEXT:
        text = value.strip()
        scale = 1.0
        if percent and text.endswith("%"):
            text, scale = text[:-1].strip(), 0.01
        v = float(text) * scale
    else:
        raise ValueError(f"expected a number, got {str(value)[:MAX_TEXT]!r}")
    if not math.isfinite(v):
        raise ValueError(f"expected a finite number, got {str(value)[:MAX_TEXT]!r}")
    return v
