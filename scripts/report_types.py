"""Generate agent/output/report_types.py (TypedDicts of the report document) from
agent/output/report.schema.json, so the renderers are type-checked against the schema.
Run after changing the schema; tests/agent/test_report_types.py fails while the file is stale."""

from __future__ import annotations

import json
import keyword
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "agent" / "output" / "report.schema.json"
OUT = ROOT / "agent" / "output" / "report_types.py"
SCALARS = {"string": "str", "number": "float", "integer": "int", "boolean": "bool", "null": "None"}
HEAD = '''"""The report document's types, generated from report.schema.json by
`python scripts/report_types.py` (do not edit): every object a TypedDict (total=False: a
reader still checks what it reads), so the renderers are checked against the schema."""

from __future__ import annotations

from typing import Any, Literal, TypedDict
'''


def camel(name: str) -> str:
    """A schema key as part of a class name."""
    return "".join(p[:1].upper() + p[1:] for p in name.replace("-", "_").split("_") if p)


class Gen:
    """Walks the schema, emitting one TypedDict per object with properties."""

    def __init__(self) -> None:
        self.classes: list[str] = []

    def type_of(self, node: dict, name: str) -> str:
        """The Python type of one schema node (classes emitted for its objects)."""
        if "enum" in node:
            values = [json.dumps(v) if v is not None else "None" for v in node["enum"]]
            lits = [v for v in values if v != "None"]
            out = f"Literal[{', '.join(lits)}]" if lits else "None"
            return out + (" | None" if "None" in values and lits else "")
        if "const" in node:
            return f"Literal[{json.dumps(node['const'])}]"
        for key in ("oneOf", "anyOf"):
            if key in node:
                return " | ".join(dict.fromkeys(self.type_of(n, name) for n in node[key]))
        types = node.get("type")
        if types is None:
            return "Any"
        if isinstance(types, str):
            types = [types]
        return " | ".join(dict.fromkeys(self.one(t, node, name) for t in types))

    def one(self, t: str, node: dict, name: str) -> str:
        if t in SCALARS:
            return SCALARS[t]
        if t == "array":
            items = node.get("items")
            return f"list[{self.type_of(items, name + 'Item')}]" if items else "list[Any]"
        if node.get("properties"):
            return self.typed_dict(node, name)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return f"dict[str, {self.type_of(extra, name + 'Value')}]"
        return "dict[str, Any]"

    def typed_dict(self, node: dict, name: str) -> str:
        fields = {k: self.type_of(v, name + camel(k)) for k, v in node["properties"].items()}
        if all(k.isidentifier() and not keyword.iskeyword(k) for k in fields):
            body = "\n".join(f"    {k}: {t}" for k, t in fields.items())
            doc = f'    """The report\'s `{name}` object."""\n\n'
            self.classes.append(f"class {name}(TypedDict, total=False):\n{doc}{body}\n")
        else:
            items = ", ".join(f"{json.dumps(k)}: {t}" for k, t in fields.items())
            self.classes.append(f"{name} = TypedDict({name!r}, {{{items}}}, total=False)\n")
        return name


def formatted(text: str) -> str:
    """The text as `ruff format` leaves it (the project's formatter, from the test extra)."""
    from ruff.__main__ import find_ruff_bin

    done = subprocess.run(
        [find_ruff_bin(), "format", "--stdin-filename", str(OUT), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def render() -> str:
    """The module's text."""
    g = Gen()
    g.typed_dict(json.loads(SCHEMA.read_text()), "Report")
    aliases = "\n".join(
        [
            "Finding = ReportFindingsItem",
            "Evidence = ReportFindingsItemEvidenceItem",
            "Trial = ReportTrialsItem",
            "Verdict = ReportVerdict",
        ]
    )
    return formatted(HEAD + "\n\n" + "\n\n".join(g.classes) + "\n\n" + aliases + "\n")


def main() -> int:
    """Write the module; 0 when it was current, 1 when it changed."""
    text = render()
    if OUT.exists() and OUT.read_text() == text:
        print(f"{OUT.name}: current")
        return 0
    OUT.write_text(text)
    print(f"{OUT.name}: written from the schema")
    return 1


if __name__ == "__main__":
    sys.exit(main())
