"""Every report gpudiag makes of the kept recordings, written to one folder, so that two
checkouts can be compared byte for byte (a refactor must leave them all unchanged).

    python scripts/golden_reports.py OUTDIR [RECORDING ...]
    python scripts/golden_reports.py --digests FILE     (rewrite the digests the test holds)

With no recordings: every `tests/fixtures/**/*.jsonl.gz`. For each recording it writes the
replayed report (JSON), its text, markdown and HTML renderings, and the speedscope and
Perfetto exports, each under OUTDIR/<folder>/<recording's stem>/. `diff -r A B` compares two
runs; `tests/agent/test_golden_reports.py` compares their SHA-256 digests with the file
`--digests` writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = {"text": "summary.txt", "markdown": "summary.md", "html": "report.html"}


def cli_main():
    """The command line's entry point, wherever this checkout keeps it."""
    for name in ("gpudiag.agent.cli.main", "gpudiag.agent.cli"):
        try:
            mod = __import__(name, fromlist=["main"])
        except ImportError:
            continue
        if hasattr(mod, "main"):
            return mod.main
    raise SystemExit("gpudiag's command line is not importable")


def run(main, argv: list[str]) -> str:
    """One command in-process; its stdout."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    if rc not in (0, None):
        raise SystemExit(f"gpudiag {' '.join(argv)}: exit {rc}")
    return buf.getvalue()


def write_all(main, rec: Path, out: Path) -> None:
    """The reports of one recording under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rel = str(rec.relative_to(ROOT)) if rec.is_relative_to(ROOT) else str(rec)
    report = out / "report.json"
    stdout = run(
        main,
        [
            "replay",
            rel,
            "--format",
            "json",
            "--out",
            str(report),
            "--speedscope",
            str(out / "stacks.speedscope.json"),
            "--trace",
            str(out / "trace.json"),
        ],
    )
    (out / "replay.stdout.json").write_text(stdout)
    for fmt, name in FORMATS.items():
        run(main, ["report", str(report), "--format", fmt, "--out", str(out / name)])


def recordings() -> list[Path]:
    """Every kept recording."""
    return sorted((ROOT / "tests" / "fixtures").rglob("*.jsonl.gz"))


def write_every(out: Path, recs: list[Path]) -> None:
    """Every output of every recording under `out`, gpudiag's own lines kept off stderr."""
    entry = cli_main()
    with contextlib.redirect_stderr(io.StringIO()):
        for rec in recs:
            write_all(entry, rec, out / rec.parent.name / rec.name.removesuffix(".jsonl.gz"))


def digests(out: Path) -> dict[str, str]:
    """path under `out` -> SHA-256 of its bytes."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv == ["--digests"]:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if argv[0] == "--digests":
        with tempfile.TemporaryDirectory() as tmp:
            write_every(Path(tmp), recordings())
            Path(argv[1]).write_text(json.dumps(digests(Path(tmp)), indent=1) + "\n")
        print(f"digests written to {argv[1]}", file=sys.stderr)
        return 0
    out = Path(argv[0])
    write_every(out, [Path(p).resolve() for p in argv[1:]] or recordings())
    print(f"reports written under {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
