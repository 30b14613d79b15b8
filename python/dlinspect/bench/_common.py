"""Timing, reporting and the result format shared by the benchmark suites.

A suite's ``run(quick, repeat, tick)`` returns a dict:

``title``, ``unit`` ("µs per call" or "batches/s"), ``rows`` (a list of dicts with
``name`` and ``median``, the figure in ``unit``, plus whatever the suite adds: with
``time_cases(..., cpu=True)``, ``cpu_median``, ``cpu_min`` and ``cpu_runs``, the
process's CPU time per call, all threads, in µs), ``targets`` (dicts with ``target``,
``status`` "PASS"/"FAIL"/"SKIP", or "NOISY" in a quick run whose figures spread too much
to judge, ``value``, and ``figure``, the rows' key the ratio is of: ``median`` or
``cpu_median``; a suite may add ``wall_value``, the same ratio in wall time),
``notes`` (lines of text) and optional suite-specific keys (``sweep``, ``memory``...).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
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
    """``nbytes`` as the suites name a size: ``"64 KiB"``, ``"4 MiB"``; a size of 1 MiB or
    more that is no whole number of MiB with one decimal: ``"3.9 MiB"`` (3,994 KiB)."""
    if nbytes < MIB:
        return f"{nbytes // KIB} KiB"
    if nbytes % MIB:
        return f"{nbytes / MIB:.1f} MiB"
    return f"{nbytes // MIB} MiB"


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


def _cpu_fields(cpu_us: list[float]) -> dict[str, Any]:
    """A row's CPU-time fields: median and least µs per call, and every run's."""
    return {"cpu_median": statistics.median(cpu_us), "cpu_min": min(cpu_us), "cpu_runs": cpu_us}


def _rounds(order: list[tuple[str, tuple[Any, int]]],
            repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run each ``(name, (timer, number))`` loop once a round for ``repeat`` rounds, each
    round starting one further on; the wall and the process's CPU µs per call of every
    run, by name."""
    runs_us: dict[str, list[float]] = {name: [] for name, _ in order}
    cpu_us: dict[str, list[float]] = {name: [] for name, _ in order}
    for r in range(repeat):
        for name, (timer, number) in order[r % len(order):] + order[:r % len(order)]:
            cpu_began = time.process_time()
            wall = timer.timeit(number)
            cpu_us[name].append((time.process_time() - cpu_began) / number * 1e6)
            runs_us[name].append(wall / number * 1e6)
    return runs_us, cpu_us


def time_cases(suite: str, cases: list[tuple[str, str, bool]], namespace: dict[str, Any],
               repeat: int, quick: bool, tick: Tick | None,
               targets: list[tuple[str, str, str, float]],
               cpu: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Time cases in turns and check ratio targets on their medians.

    The cases take turns: each of the ``repeat`` rounds runs every case's calibrated loop
    once, starting one case further on than the round before, so that the machine's drift
    over time (large on shared virtual machines) and what a case leaves behind for the next
    fall on a measured case and its baseline alike.

    Parameters
    ----------
    suite : str
        The suite's name, for ``tick``.
    cases : list of (str, str, bool)
        ``(name, statement, needs torch)``; the torch ones are skipped where ``namespace``
        has no ``"t"``.
    namespace : dict
        The globals the statements run in.
    repeat : int
        Rounds: runs of each case's loop.
    quick : bool
        Calibrate each loop to 0.02 s a run instead of 0.2 s.
    tick : callable or None
        Told each case's name as its calibration starts.
    targets : list of (str, str, str, float)
        ``(description, measured, baseline, limit)``: ``measured``'s median wall time at
        most ``limit`` times ``baseline``'s.
    cpu : bool
        Also give each row the process's CPU time per call (``time.process_time``: every
        thread of the process, JAX's and dlinspect's copy worker included), read around
        the same loop as the wall time, in the fields ``cpu_median``, ``cpu_min`` and
        ``cpu_runs`` (µs). Default False.

    Returns
    -------
    rows : list of dict
        One per case run: ``name``, ``stmt``, ``number`` (calls per loop), ``repeat``,
        ``median``, ``min`` and ``runs`` (wall µs per call), and the CPU fields with ``cpu``.
    checked : list of dict
        ``targets``, each judged as :func:`ratio_target` judges.
    """
    chosen = [(name, stmt) for name, stmt, needs_torch in cases
              if not needs_torch or "t" in namespace]
    timers = {}
    for name, stmt in chosen:
        if tick:
            tick(f"{suite}: {name}")
        timers[name] = _calibrated(stmt, namespace, 0.02 if quick else 0.2)
    runs_us, cpu_us = _rounds(list(timers.items()), repeat)
    rows = []
    for name, stmt in chosen:
        row = {"name": name, **_row(stmt, timers[name][1], runs_us[name])}
        if cpu:
            row.update(_cpu_fields(cpu_us[name]))
        rows.append(row)
    by_name = {r["name"]: r for r in rows}
    return rows, [ratio_target(d, by_name, m, b, lim) for d, m, b, lim in targets]


def ratio_target(description: str, rows: dict[str, dict[str, Any]], measured: str,
                 baseline: str, limit: float, higher_is_better: bool = False,
                 figure: str = "median") -> dict[str, Any]:
    """``measured / baseline`` (or its inverse for rates) against ``limit``.

    Parameters
    ----------
    description : str
        The target, in words.
    rows : dict
        The rows by name.
    measured, baseline : str
        The names of the two rows.
    limit : float
        The most (or with ``higher_is_better`` the least) the ratio may be.
    higher_is_better : bool
        The figures are rates: the ratio must reach ``limit``. Default False.
    figure : str
        The rows' key the ratio is of: ``"median"`` (the suite's unit, by default) or
        ``"cpu_median"`` (CPU µs per call, rows timed with ``time_cases(..., cpu=True)``).

    Returns
    -------
    dict
        ``target``, ``status`` ("PASS", "FAIL", or "SKIP" where a row is missing),
        ``value`` (the ratio, None when skipped), ``limit``, ``figure``, and ``measured``
        and ``baseline`` (names) unless skipped.
    """
    if measured not in rows or baseline not in rows:
        return {"target": description, "status": "SKIP", "value": None, "limit": limit,
                "figure": figure, "why": "a row is missing (optional library not installed)"}
    ratio = rows[measured][figure] / rows[baseline][figure]
    ok = ratio >= limit if higher_is_better else ratio <= limit
    return {"target": description, "status": "PASS" if ok else "FAIL", "value": ratio,
            "limit": limit, "figure": figure, "measured": measured, "baseline": baseline}


def target_value(target: dict[str, Any], number: Callable[[float], str] | None = None) -> str:
    """A target's ratio as the reports write it after the description.

    Parameters
    ----------
    target : dict
        A target, as :func:`ratio_target` returns it.
    number : callable or None
        How a ratio is written (default: four significant digits, thousands grouped).

    Returns
    -------
    str
        ``": 0.83"``; with the figure the ratio is of where that is CPU time, and the
        wall-time ratio where the suite adds one: ``": 0.83 CPU time, 0.61 wall time"``;
        ``""`` when skipped.
    """
    write = number or _fmt
    if target["value"] is None:
        return ""
    text = f": {write(target['value'])}"
    if target.get("figure") == "cpu_median":
        text += " CPU time"
    if target.get("wall_value") is not None:
        text += f", {write(target['wall_value'])} wall time"
    return text


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
        lines.extend(_rows_text(rows))
    lines.extend(result.get("notes", []))
    for t in result["targets"]:
        why = f" ({t['why']})" if t.get("why") and t["status"] in ("NOISY", "SKIP") else ""
        lines.append(f"{t['status']:<5} {t['target']}{target_value(t)}{why}")
    return "\n".join(lines)


def _rows_text(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a text table: name and median, and the CPU median where rows have one."""
    width = max(len(r["name"]) for r in rows)
    cpu = any("cpu_median" in r for r in rows)
    lines = [f"{'name':<{width}}  {'median':>12}" + (f"  {'cpu median':>12}" if cpu else ""),
             f"{'-' * width}  {'-' * 12}" + (f"  {'-' * 12}" if cpu else "")]
    for r in rows:
        cpu_text = f"  {_fmt(r['cpu_median']):>12}" if "cpu_median" in r else ""
        lines.append(f"{r['name']:<{width}}  {_fmt(r['median']):>12}{cpu_text}")
    return lines


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
