"""Measure what the README's two commands take, into benchmarks/setup.json.

Usage: python scripts/measure_setup.py [--ci-log FILE]

The first command (the first ```bash block of README.md's "Set up and run") runs in a
fresh clone of this repository's HEAD, in a temporary folder: its wall time, the disk its
virtual environment takes, and the test accuracy the example prints are recorded. With
``--ci-log``, the report that ``bash .ci/run`` printed at its end (its last lines) is
read too: each step's time, the whole run's time and the clone's largest size. The
machine (cores, memory) and the date are recorded beside them; ``python
scripts/figures.py`` renders the file into README.md and docs/getting-started.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "setup.json"


def first_command() -> str:
    """The README's first command (the first ```bash block after "## Set up and run")."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Set up and run"):]
    return re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def run_first(command: str) -> dict[str, object]:
    """The first command in a fresh clone: seconds, the .venv's bytes, the accuracy."""
    with tempfile.TemporaryDirectory(prefix="dlinspect-setup-") as tmp:
        clone = Path(tmp) / "dlinspect"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        start = time.perf_counter()
        proc = subprocess.run(["bash", "-c", command], cwd=clone, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode:
            sys.exit(f"the first command failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                     f"\n{proc.stderr[-2000:]}")
        accuracy = re.search(r"test accuracy: ([0-9.]+)", proc.stdout)
        return {"command": command, "seconds": round(seconds, 1),
                "venv_bytes": _size(clone / ".venv"),
                "accuracy": float(accuracy.group(1)) if accuracy else None}


def read_ci_log(path: Path) -> dict[str, object]:
    """The closing report of a ``.ci/run`` log: each step's lane, seconds and the clone's
    size."""
    text = path.read_text(encoding="utf-8", errors="replace")
    head = re.search(r"== \.ci/run report: (\d+) min in all\n", text)
    if head is None:
        sys.exit(f"{path}: no '.ci/run report' in it")
    steps = []
    for line in text[head.end():].splitlines()[1:]:
        m = re.match(r"(\d+)\s+(.+?)\s{2,}(\d+) s\s+(\S+)\s+(.+)$", line)
        if m:
            steps.append({"lane": int(m.group(1)), "step": m.group(2).strip(),
                          "seconds": int(m.group(3)), "clone": m.group(4),
                          "result": m.group(5).strip()})
    if not steps or any(s["result"] != "ok" for s in steps):
        sys.exit(f"{path}: not a run whose every step passed")
    return {"minutes": int(head.group(1)), "steps": steps}


def machine() -> str:
    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return f"{os.cpu_count()} cores, {pages * page / 2**30:.0f} GiB"


def main() -> int:
    report = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    if "--ci-log" in sys.argv:
        report["ci"] = read_ci_log(Path(sys.argv[sys.argv.index("--ci-log") + 1]))
    if "--skip-first" not in sys.argv:
        report["first"] = run_first(first_command())
    report.update(machine=machine(), date=time.strftime("%Y-%m-%d"),
                  python=sys.version.split()[0])
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
