"""Run every ``>>>`` example of README.md and of the site's pages, and of the docstrings the
API reference renders.

Usage: python scripts/doctest_docs.py [--docstrings] [PAGE ...]

Each Markdown page runs in a child process, its examples in order in one namespace, with
JAX on the CPU and doctest's ELLIPSIS and NORMALIZE_WHITESPACE. A page's front matter
(the lines between two ``---`` lines at its top) may say:

    requires: [grain]   the modules it needs: the page is skipped, with the reason, where
                        one is not importable (the loader pages whose libraries are not in
                        the default environment run in the interop suite:
                        tests/interop/test_docs_pages.py)
    devices: 4          how many CPU devices JAX has while it runs
                        (XLA_FLAGS=--xla_force_host_platform_device_count=4)

``--docstrings`` also runs the examples in the docstrings of every object docs/api.md
renders (its ``auto...`` directives). Exits 1 when an example fails or a page has an
example that did not run. tests/test_docs.py runs the same functions.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def pages() -> list[Path]:
    """README.md and every Markdown page of the site."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                        if not p.relative_to(ROOT / "docs").parts[0].startswith("_"))]


def front_matter(path: Path) -> dict[str, Any]:
    """The ``key: value`` lines of a page's front matter (lists as ``[a, b]``)."""
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        return {}
    head = text[4:text.index("\n---\n", 4)]
    out: dict[str, Any] = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            out[key.strip()] = [v.strip() for v in value[1:-1].split(",") if v.strip()]
        else:
            out[key.strip()] = int(value) if value.isdigit() else value
    return out


def prompts(path: Path) -> int:
    """How many examples the page holds: its ``>>>`` lines."""
    return sum(line.lstrip().startswith(">>>")
               for line in path.read_text(encoding="utf-8").splitlines())


def missing(path: Path) -> list[str]:
    """The modules a page requires that are not importable here."""
    return [m for m in front_matter(path).get("requires", [])
            if importlib.util.find_spec(m) is None]


def run_page(path: Path) -> dict[str, Any]:
    """Run one page's examples in a child process: attempted, failed, prompts, output;
    or skipped (the reason) when a module it requires is missing."""
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    lacking = missing(path)
    if lacking:
        return {"page": rel, "skipped": f"{rel} needs {', '.join(lacking)}, not installed here"}
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    devices = front_matter(path).get("devices")
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    proc = subprocess.run([sys.executable, __file__, "--child", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        result = {"attempted": 0, "failed": 1}
    result.update(page=rel, prompts=prompts(path),
                  output=("\n".join(lines[:-1]) + proc.stderr)[-12000:])
    return result


def recipe(path: Path, *names: str) -> dict[str, Any]:
    """The objects ``names`` as a page defines them: its examples run in order, in one
    namespace, in this process, until every name is defined (what a test or benchmark
    of the page's recipe calls, so that it runs the code the page shows)."""
    namespace: dict[str, Any] = {"__name__": f"page:{path.name}"}
    for example in doctest.DocTestParser().get_examples(path.read_text(encoding="utf-8")):
        if all(name in namespace for name in names):
            break
        exec(compile(example.source, str(path), "exec"), namespace)
    lacking = [name for name in names if name not in namespace]
    if lacking:
        raise LookupError(f"{path} defines no {', '.join(lacking)} in its examples")
    return {name: namespace[name] for name in names}


def _child(page: str) -> None:
    import warnings
    warnings.simplefilter("default")   # a page shows warnings as a user sees them
    result = doctest.testfile(page, module_relative=False, globs={}, optionflags=FLAGS)
    print(json.dumps({"attempted": result.attempted, "failed": result.failed}))


def api_names() -> set[str]:
    """Every name docs/api.md documents: its ``auto...`` directives and ``py:data``."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    return ({name for name, _ in api_objects()}
            | set(re.findall(r"^\.\. py:data:: (\S+)", text, re.M)))


def api_objects() -> list[tuple[str, Any]]:
    """Every object docs/api.md renders with an ``auto...`` directive, by its name."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    names = re.findall(r"^\.\. auto(?:function|class|exception|data|module):: (\S+)", text, re.M)
    out = []
    for name in names:
        module, _, attr = name.rpartition(".")
        try:
            obj = importlib.import_module(name)
        except ImportError:
            obj = getattr(importlib.import_module(module), attr)
        out.append((name, obj))
    return out


def run_docstrings() -> dict[str, Any]:
    """The examples of every docstring the API reference renders (members included)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    seen: set[str] = set()
    for name, obj in api_objects():
        for test in finder.find(obj, name, globs={}):
            if test.name not in seen:
                seen.add(test.name)
                runner.run(test)
    result = runner.summarize(verbose=False)
    return {"attempted": result.attempted, "failed": result.failed, "docstrings": len(seen)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        _child(argv[1])
        return 0
    status = 0
    chosen = [Path(a).resolve() for a in argv if not a.startswith("--")] or pages()
    for path in chosen:
        r = run_page(path)
        if "skipped" in r:
            print(f"skipped {r['skipped']}")
            continue
        ok = r["failed"] == 0 and r["attempted"] == r["prompts"]
        print(f"{'ok  ' if ok else 'FAIL'} {r['page']}: {r['attempted']} examples, "
              f"{r['failed']} failed ({r['prompts']} >>> lines)")
        if not ok:
            print(r["output"])
            status = 1
    if "--docstrings" in argv:
        d = run_docstrings()
        print(f"{'ok  ' if d['failed'] == 0 else 'FAIL'} docstrings of the API reference: "
              f"{d['attempted']} examples in {d['docstrings']} docstrings, {d['failed']} failed")
        status |= d["failed"] != 0 or d["attempted"] == 0
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
