"""The report document's TypedDicts (agent/output/report_types.py) are generated from its
schema and kept current, so the renderers are type-checked against what the schema allows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def generator():
    """scripts/report_types.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "report_types_gen", ROOT / "scripts" / "report_types.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_report_types_are_generated_from_the_current_schema():
    gen = generator()
    assert gen.OUT.read_text() == gen.render(), "stale: run `python scripts/report_types.py`"


def test_every_top_level_key_of_the_schema_is_typed():
    import json

    from gpudiag.agent.output.report_types import Report

    schema = json.loads((ROOT / "agent" / "output" / "report.schema.json").read_text())
    assert set(Report.__annotations__) == set(schema["properties"])
