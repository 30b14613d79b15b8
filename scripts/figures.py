"""Write the README's summary of the published benchmark run from benchmarks/results.json.

Usage: python scripts/figures.py [--check]

The table between the README's two figure markers is rendered by
dlinspect.bench.summary_markdown from the committed results.json (the run that wrote
BENCHMARKS.md); --check exits 1 when the README holds anything else
(tests/test_packaging.py checks the same).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dlinspect.bench import SUMMARY_BEGIN, SUMMARY_END, summary_markdown

ROOT = Path(__file__).resolve().parents[1]


def rendered(readme: str) -> str:
    """``readme`` with the block between the markers rendered from results.json."""
    report = json.loads((ROOT / "benchmarks" / "results.json").read_text(encoding="utf-8"))
    head, sep, rest = readme.partition(SUMMARY_BEGIN)
    _, sep2, tail = rest.partition(SUMMARY_END)
    if not sep or not sep2:
        raise SystemExit(f"README.md has no {SUMMARY_BEGIN} ... {SUMMARY_END} block")
    return f"{head}{SUMMARY_BEGIN}\n{summary_markdown(report)}\n{SUMMARY_END}{tail}"


def main() -> int:
    path = ROOT / "README.md"
    readme = path.read_text(encoding="utf-8")
    new = rendered(readme)
    if "--check" in sys.argv:
        return 0 if new == readme else 1
    path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
