"""Timing, reporting and the result format shared by the benchmark suites.

A suite's ``run(quick, repeat, tick)`` returns a dict:

``title``, ``unit`` ("µs per call" or "batches/s"), ``rows`` (a list of dicts with
``name`` and ``median``, the figure in ``unit``, plus whatever the suite adds),
``targets`` (dicts with ``target``, ``status`` "PASS"/"FAIL"/"SKIP", or "NOISY" in a
quick run whose figures spread too much to judge, ``value``),
``notes`` (lines of text) and optional suite-specific keys (``sweep``, ``memory``...).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import timeit
from collections.abc import Callable, Iterator
from typing import Any

KIB = 1024
MIB = 1024 * KIB

Tick = Callable[[str], None]


def handed_over(batches: list[Any]) -> Iterator[Any]:
    """The batches, each handed over as a loader hands it: taken out of the list first, so
    that the list holds none of them (dlinspect views only memory the batch owns)."""
    while batches:
        yield batches.pop(0)


def size_label(nbytes: int) -> str:
    """``nbytes`` as the suites name a size: ``"64 KiB"``, ``"4 MiB"``."""
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def size_repeat(repeat: int, nbytes: int) -> int:
    """Runs per measurement of a tensor of ``nbytes``: a third (at least 3) from 64 MiB."""
    return repeat if nbytes < 64 * MIB else max(3, repeat // 3)


def _calibrated(stmt: str, namespace: dict[str, Any], min_run_s: float) -> tuple[Any, int]:
    """A timer for ``stmt`` and a loop count giving >= ``min_run_s`` per run
    (``timeit``'s autorange when 0.2 s)."""
    timer = timeit.Timer(stmt, globals=namespace)
    timer.timeit(1)   # (a first call's one-time work, e.g. a lazy import, is no loop count)
    number = 1
    while timer.timeit(number) < min_run_s:
        number *= 2 if min_run_s < 0.2 else 10
    return timer, number


def _row(stmt: str, number: int, runs_us: list[float]) -> dict[str, Any]:
    return {"stmt": stmt, "number": number, "repeat": len(runs_us),
            "median": statistics.median(runs_us), "min": min(runs_us), "runs": runs_us}


def time_statement(stmt: str, namespace: dict[str, Any], repeat: int,
                   min_run_s: float = 0.2) -> dict[str, Any]:
    """Median per-call time of ``stmt`` in µs over ``repeat`` runs of a calibrated loop."""
    timer, number = _calibrated(stmt, namespace, min_run_s)
    return _row(stmt, number, [total / number * 1e6
                               for total in timer.repeat(repeat=repeat, number=number)])


def time_cases(suite: str, cases: list[tuple[str, str, bool]], namespace: dict[str, Any],
               repeat: int, quick: bool, tick: Tick | None,
               targets: list[tuple[str, str, str, float]]) -> tuple[list[dict[str, Any]],
                                                                    list[dict[str, Any]]]:
    """Time ``(name, statement, needs torch)`` cases (torch ones skipped without torch in
    ``namespace``) and check ``(description, measured, baseline, limit)`` ratio targets.

    The cases take turns: each of the ``repeat`` rounds runs every case's calibrated loop
    once, starting one case further on than the round before, so that the machine's drift
    over time (large on shared virtual machines) and what a case leaves behind for the next
    fall on a measured case and its baseline alike."""
    chosen = [(name, stmt) for name, stmt, needs_torch in cases
              if not needs_torch or "t" in namespace]
    timers = {}
    for name, stmt in chosen:
        if tick:
            tick(f"{suite}: {name}")
        timers[name] = _calibrated(stmt, namespace, 0.02 if quick else 0.2)
    runs_us: dict[str, list[float]] = {name: [] for name, _ in chosen}
    order = list(timers.items())
    for r in range(repeat):
        for name, (timer, number) in order[r % len(order):] + order[:r % len(order)]:
            runs_us[name].append(timer.timeit(number) / number * 1e6)
    rows = [{"name": name, **_row(stmt, timers[name][1], runs_us[name])} for name, stmt in chosen]
    by_name = {r["name"]: r for r in rows}
    return rows, [ratio_target(d, by_name, m, b, lim) for d, m, b, lim in targets]


def ratio_target(description: str, rows: dict[str, dict[str, Any]], measured: str,
                 baseline: str, limit: float, higher_is_better: bool = False) -> dict[str, Any]:
    """``measured / baseline`` (or its inverse for rates) against ``limit``."""
    if measured not in rows or baseline not in rows:
        return {"target": description, "status": "SKIP", "value": None, "limit": limit,
                "why": "a row is missing (optional library not installed)"}
    ratio = rows[measured]["median"] / rows[baseline]["median"]
    ok = ratio >= limit if higher_is_better else ratio <= limit
    return {"target": description, "status": "PASS" if ok else "FAIL", "value": ratio,
            "limit": limit, "measured": measured, "baseline": baseline}


def versions() -> dict[str, str | None]:
    """Versions of Python and of every library the suites touch (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("numpy", "jax", "jaxlib", "torch", "ml_dtypes", "dlinspect"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def machine() -> str:
    return f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs"


def rss_kib() -> int:
    """This process's resident set size (VmRSS of /proc/self/status), in KiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS line in /proc/self/status")


def optional(name: str) -> Any:
    """The module ``name``, or None where it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def format_suite(result: dict[str, Any]) -> str:
    """A suite's rows, notes and targets as text."""
    lines = [f"== {result['title']} ({result['unit']})"]
    rows = result["rows"]
    if rows:
        width = max(len(r["name"]) for r in rows)
        lines.append(f"{'name':<{width}}  {'median':>12}")
        lines.append(f"{'-' * width}  {'-' * 12}")
        for r in rows:
            lines.append(f"{r['name']:<{width}}  {_fmt(r['median']):>12}")
    lines.extend(result.get("notes", []))
    for t in result["targets"]:
        value = "" if t["value"] is None else f": {_fmt(t['value'])}"
        why = f" ({t['why']})" if t.get("why") and t["status"] in ("NOISY", "SKIP") else ""
        lines.append(f"{t['status']:<5} {t['target']}{value}{why}")
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
