"""Measure what the README's commands take, into benchmarks/setup.json.

Usage: python scripts/measure_setup.py [--ci-log FILE] [--skip-first]

In a fresh clone of this repository's HEAD, in a temporary folder, the README's first
command (the first ```bash block of its "Set up and run") runs, then its test command (the
second block) in the virtual environment the first made, as in the shell where the first
ran. Recorded: each command's wall time and the machine's load average as it began; the
disk the first command's virtual environment takes and the test accuracy the example
prints; the disk the test command added to the clone (the test tools, the build folder),
pytest's closing counts (passed, skipped) and how many slow tests it left out. With
``--ci-log``, the report that ``bash .ci/run`` printed at its end (its last lines) is read
too: each step's time, the whole run's time and the clone's largest size, and the date.
The machine (cores, memory) and the date are recorded beside them; ``python
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


def readme_commands() -> list[str]:
    """The ```bash blocks of README.md's "Set up and run": the first command, the test
    command, then ``bash .ci/run``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Set up and run"):]
    return [block.strip() for block in re.findall(r"```bash\n(.+?)\n```", section, re.S)]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _run(command: str, cwd: Path, what: str) -> tuple[float, str]:
    """Run ``command`` with bash in ``cwd`` outside any virtual environment of this
    process: its seconds and its output."""
    env = dict(os.environ)
    if "VIRTUAL_ENV" in env:    # the measuring environment's, not the command's
        venv_bin = str(Path(env.pop("VIRTUAL_ENV")) / "bin")
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    start = time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"the {what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return seconds, proc.stdout + proc.stderr


def run_readme(first: str, test: str) -> dict[str, dict[str, object]]:
    """Both commands in one fresh clone: the first's seconds, the .venv's bytes and the
    accuracy; then the test command's seconds, the bytes it added and pytest's counts."""
    with tempfile.TemporaryDirectory(prefix="dlinspect-setup-") as tmp:
        clone = Path(tmp) / "dlinspect"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        load = os.getloadavg()[0]
        seconds, out = _run(first, clone, "first command")
        accuracy = re.search(r"test accuracy: ([0-9.]+)", out)
        report: dict[str, dict[str, object]] = {"first": {
            "command": first, "seconds": round(seconds, 1), "load": round(load, 2),
            "venv_bytes": _size(clone / ".venv"),
            "accuracy": float(accuracy.group(1)) if accuracy else None}}
        before, load = _size(clone), os.getloadavg()[0]
        # in the first command's environment, as in the shell where it ran
        seconds, out = _run(f". .venv/bin/activate && {test}", clone, "test command")
        counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped|xfailed)", out)}
        # (pytest-xdist's closing line leaves out the deselected: collected again for them)
        _, out = _run(". .venv/bin/activate && python -m pytest --collect-only -q -p no:cacheprovider",
                      clone, "collection")
        counts["deselected"] = int(re.search(r"\((\d+) deselected\)", out).group(1))
        report["test"] = {"command": test, "seconds": round(seconds, 1), "load": round(load, 2),
                          "added_bytes": _size(clone) - before, "counts": counts}
        return report


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
        report["ci"]["date"] = time.strftime("%Y-%m-%d")
    if "--skip-first" not in sys.argv:
        first, test = readme_commands()[:2]
        report.update(run_readme(first, test))
        report.update(machine=machine(), date=time.strftime("%Y-%m-%d"),
                      python=sys.version.split()[0])
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
