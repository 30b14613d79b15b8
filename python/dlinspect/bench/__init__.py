"""dlinspect's benchmark suites, runnable from an installed wheel.

``dlinspect bench`` (see :mod:`dlinspect.cli`) runs them; the scripts in the
repository's ``benchmarks/`` folder are thin entry points over the same code.
Suites: ``peek``, ``to_jax``, ``sweep`` (per-call cost against tensor size, for
every consumer installed), ``loader`` (a torch DataLoader into JAX) and, when named
(``dlinspect bench --instructions``), ``instructions`` (instructions per call under
valgrind's callgrind: targets that hold on a noisy machine) and ``copies`` (the copies
to_jax makes, 1 KiB to 256 MiB and either side of the copy kernel's 4 MiB thresholds,
against JAX's own and NumPy's, in wall and in CPU time; its targets are judged on CPU
time) and ``stack`` (``dlinspect.stack`` against ``np.stack``, also as a torch
``collate_fn``). Every figure is a median measured in the run that reports it; targets
are ratios against baselines measured in the same run.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ._common import format_suite, machine, target_value, versions

__all__ = ["SUITES", "DEFAULT_SUITES", "run_suites", "format_report", "verdict", "plot_sweep",
           "write_markdown", "summary_markdown"]

#: Every suite; :data:`DEFAULT_SUITES` run when none is named.
SUITES = ("peek", "to_jax", "sweep", "loader", "instructions", "copies", "stack")
DEFAULT_SUITES = ("peek", "to_jax", "sweep", "loader")


def run_suites(names: Sequence[str] = DEFAULT_SUITES, *, quick: bool = False, repeat: int | None = None,
               progress: bool = True) -> dict[str, Any]:
    """Run benchmark suites and return their results.

    Parameters
    ----------
    names : sequence of str
        Suites to run, from :data:`SUITES` (``peek``, ``to_jax``, ``sweep``, ``loader``,
        ``instructions``, ``copies``, ``stack``).
    quick : bool
        Fewer repeats, shorter timings, smaller sizes (noisier figures).
    repeat : int or None
        Runs per measurement (default 15, or 3 with ``quick``).
    progress : bool
        Say on stderr what runs and for about how long (:data:`TYPICAL_SECONDS`), then
        each case as it starts: a tqdm bar where stderr is a terminal and tqdm is
        installed, else a line per case.

    Returns
    -------
    dict
        ``versions``, ``machine``, ``quick``, ``jax_platform``, ``seconds`` (wall
        time of the run) and ``suites``: per suite, its ``rows`` (``median`` in the
        suite's ``unit``: µs per call or batches/s), ``targets``, ``notes`` and
        ``seconds``.

    Raises
    ------
    ValueError
        An unknown suite name.
    ImportError
        jax is not installed (before anything runs).
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; choose from {list(SUITES)}")
    importlib.import_module("jax")   # (every suite converts into JAX: ImportError before any line)
    estimate = sum(TYPICAL_SECONDS[name][0 if quick else 1] for name in names)
    bar = _progress(names, quick, estimate) if progress else None
    start = time.perf_counter()

    def tick(what: str) -> None:
        if bar is not None:
            bar.set_postfix_str(what, refresh=True)
        elif progress:
            print(f"dlinspect bench: {time.perf_counter() - start:.0f} s of about {estimate} s: "
                  f"{what}", file=sys.stderr, flush=True)

    suites = {}
    for name in names:
        began = time.perf_counter()
        module = importlib.import_module(f"dlinspect.bench.{name}")
        suites[name] = module.run(quick=quick, repeat=repeat, tick=tick)
        suites[name]["seconds"] = time.perf_counter() - began
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    for result in suites.values():
        _mark_noisy(result, quick)
    return {"versions": versions(), "machine": machine(), "quick": quick,
            "jax_platform": _jax_platform(), "seconds": time.perf_counter() - start,
            "suites": suites}


#: Each suite's seconds, (quick, full), in the runs recorded on a 2-core x86-64 machine:
#: the full ones, the published run's (benchmarks/results.json, each suite's "seconds",
#: rounded up); what the first line's estimate adds up.
TYPICAL_SECONDS = {"peek": (2, 130), "to_jax": (3, 110), "sweep": (3, 320), "loader": (8, 30),
                   "instructions": (60, 80), "copies": (35, 3900), "stack": (3, 180)}


def _progress(names: Sequence[str], quick: bool, estimate: int) -> Any:
    """Say at once what runs and for about how long (stderr); a tqdm bar where stderr is a
    terminal and tqdm is installed (None: a line per case instead)."""
    print(f"dlinspect bench: {', '.join(names)}{' (--quick)' if quick else ''}: about "
          f"{estimate} s on a 2-core machine", file=sys.stderr, flush=True)
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=len(names), unit="suite", desc="dlinspect bench", leave=False)


#: Spread (max - min) / median across repetitions above which a quick run's figure
#: says nothing about its target.
NOISY_SPREAD = 0.25


def _mark_noisy(result: dict[str, Any], quick: bool) -> None:
    """A target missed on figures that spread more than :data:`NOISY_SPREAD` across
    their repetitions, or missed by less than they spread, is NOISY (not FAIL), saying
    why: the machine was too busy for the figure to judge the target. The figures are
    those the target's ratio is of: wall time, or CPU time (``figure`` "cpu_median")."""
    rows = {r["name"]: r for r in result.get("rows", [])}
    for t in result["targets"]:
        if t["status"] != "FAIL":
            continue
        spreads = _spreads(t, rows)
        miss = abs(t["value"] / t["limit"] - 1) if t.get("value") and t.get("limit") else 1.0
        if spreads and (max(spreads) > NOISY_SPREAD or miss < max(spreads)):
            t["status"] = "NOISY"
            t["why"] = (f"missed by {miss:.1%}, while the figures spread {max(spreads):.0%} "
                        f"across the repetitions of this run: " + (
                            "run without --quick" if quick else
                            "run again on a quieter machine") + " to judge the target")


def _spreads(target: dict[str, Any], rows: dict[str, dict[str, Any]]) -> list[float]:
    """The spread, (max - min) / median, of the runs of a target's measured and baseline
    rows (those that have more than one run): wall-time runs, or CPU-time ones where the
    target's ratio is of CPU time."""
    runs_key = "cpu_runs" if target.get("figure") == "cpu_median" else "runs"
    spreads = []
    for name in (target.get("measured"), target.get("baseline")):
        runs = rows.get(name, {}).get(runs_key) if name else None
        if runs and len(runs) > 1:
            median = sorted(runs)[len(runs) // 2]
            spreads.append((max(runs) - min(runs)) / median if median else 0.0)
    return spreads


def _jax_platform() -> str | None:
    try:
        import jax
        return jax.default_backend()
    except ImportError:
        return None


def verdict(report: dict[str, Any]) -> str:
    """The run's one closing line: how many targets were met, missed, too noisy to judge
    and skipped, and what that makes the run (``MET``, ``MISSED`` or ``NOISY``).

    Parameters
    ----------
    report : dict
        What :func:`run_suites` returned.

    Returns
    -------
    str
    """
    statuses = [t["status"] for s in report["suites"].values() for t in s["targets"]]
    counts = {k: statuses.count(k) for k in ("PASS", "FAIL", "NOISY", "SKIP")}
    word = "MET"
    if counts["FAIL"]:
        word = "MISSED"
    elif counts["NOISY"]:
        word = "NOISY"
    return (f"targets: {counts['PASS']} met, {counts['FAIL']} missed, {counts['NOISY']} "
            f"noisy (spread too wide to judge), {counts['SKIP']} skipped: {word}")


def format_report(report: dict[str, Any]) -> str:
    """The whole report as text: versions, then each suite's medians, notes and targets.

    Parameters
    ----------
    report : dict
        What :func:`run_suites` returned.

    Returns
    -------
    str
    """
    head = "  ".join(f"{k} {v or 'not installed'}" for k, v in report["versions"].items())
    lines = [head, f"machine: {report['machine']}, JAX platform {report['jax_platform']}"
             + (" (quick)" if report["quick"] else ""), ""]
    for result in report["suites"].values():
        lines += [format_suite(result), ""]
    lines.append(verdict(report))
    return "\n".join(lines)


def plot_sweep(report: dict[str, Any], path: str) -> None:
    """Per-call cost against tensor size for each method of the ``sweep`` suite, as a PNG.

    Parameters
    ----------
    report : dict
        What :func:`run_suites` returned, with the ``sweep`` suite.
    path : str
        Where to write the PNG (log-log: size in bytes, median µs per call).

    Raises
    ------
    ImportError
        matplotlib is not installed (``pip install matplotlib``).
    ValueError
        The report has no ``sweep`` suite.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("dlinspect bench --plot draws with matplotlib, which is not installed; "
                          "install it with: pip install matplotlib") from exc
    sweep = report["suites"].get("sweep")
    if sweep is None:
        raise ValueError("--plot needs the sweep suite; run it too (dlinspect bench sweep ...)")
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    sizes = [p["nbytes"] for p in sweep["sweep"]]
    for method in sweep["methods"]:
        ax.plot(sizes, [p[method] for p in sweep["sweep"]], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [p["size"] for p in sweep["sweep"]])
    ax.set_xlabel("tensor size (float32, 64-byte aligned)")
    ax.set_ylabel("median µs per call")
    v = report["versions"]
    ax.set_title(f"DLPack import cost by size (jax {v.get('jax')}, {report['machine']})",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(report: dict[str, Any], path: str, command: str,
                   plot: str | None = None) -> None:
    """Write a Markdown report: the command, versions, every table and target.

    Parameters
    ----------
    report : dict
        What :func:`run_suites` returned.
    path : str
        The Markdown file to write.
    command : str
        The command that produced the run (shown verbatim).
    plot : str or None
        Path of the sweep plot, relative to the Markdown file, to embed.
    """
    v = report["versions"]
    out = ["# Benchmarks", "",
           "Every figure here comes from one run of the command below on the machine named "
           "under it; this file was written by that run (`--markdown`), not by hand.", "",
           f"```\n{command}\n```", "",
           f"Machine: {report['machine']}, JAX platform {report['jax_platform']}. "
           + ", ".join(f"{k} {val or 'not installed'}" for k, val in v.items())
           + f". The run took {report['seconds']:.0f} s.", ""]
    if plot:
        out += [f"![per-call cost against tensor size]({plot})", ""]
    for name, result in report["suites"].items():
        out += _suite_markdown(name, result)
    out += [verdict(report), ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


def _suite_markdown(name: str, result: dict[str, Any]) -> list[str]:
    """One suite's section of :func:`write_markdown`: its table(s), notes and targets."""
    table = _rows_table
    if name == "sweep":
        table = _sweep_table
    elif name == "loader" and "tables" in result:
        table = _loader_tables
    return ([f"## {name}", "", f"Median {result['unit']}"
             + (f", {result['repeat']} runs" if "repeat" in result else "") + ".", ""]
            + table(result) + [""]
            + [f"- {note}" for note in result.get("notes", [])]
            + [f"- **{t['status']}** {t['target']}{target_value(t, _g4)}"
               for t in result["targets"]]
            + [""])


def _g4(value: float) -> str:
    """A ratio as the Markdown report writes it: four significant digits."""
    return f"{value:.4g}"


def _rows_table(result: dict[str, Any]) -> list[str]:
    """The median of every call, and its median CPU time where the rows have one."""
    rows = result["rows"]
    if not any("cpu_median" in r for r in rows):
        return (["| call | median |", "| --- | ---: |"]
                + [f"| `{r['name']}` | {r['median']:.4g} |" for r in rows])
    return (["| call | median | CPU time, median |", "| --- | ---: | ---: |"]
            + [f"| `{r['name']}` | {r['median']:.4g} | {r['cpu_median']:.4g} |" for r in rows])


def _sweep_table(result: dict[str, Any]) -> list[str]:
    """A row per tensor size: its plan and each method's median."""
    methods = result["methods"]
    return (["| size | plan | " + " | ".join(methods) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in methods) + " |"]
            + [f"| {p['size']} | {p['plan']} | " + " | ".join(f"{p[m]:.2f}" for m in methods)
               + " |" for p in result["sweep"]])


def _loader_tables(result: dict[str, Any]) -> list[str]:
    """Batches/s of every method: converted only, end to end (async and synced), sharded."""
    cols = ("conversion", "end_to_end", "end_to_end_synced")
    tables = result["tables"]
    return (["| method | conversion only | end to end, jitted step (async) "
             "| end to end, loss read every step |",
             "| --- | ---: | ---: | ---: |"]
            + [f"| {method} | " + " | ".join(f"{tables[c][method]['median']:,.0f}" for c in cols)
               + " |" for method in tables["conversion"]]
            + ["", "Sharded over 4 forced CPU devices, conversion only:", "",
               "| method | batches/s |", "| --- | ---: |"]
            + [f"| {m} | {row['median']:,.0f} |" for m, row in result["sharded"]["rows"].items()])


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if unit.startswith("instructions"):
        return f"{value:,.0f}"
    if unit.startswith("batches"):
        return f"{value:,.0f} /s"
    return f"{value:.3g} µs" if unit.startswith("µs") else f"{value:.4g}"


def summary_markdown(report: dict[str, Any]) -> str:
    """Every target of a run in one Markdown table: suite, target, the measured and the
    baseline figures (the medians the ratio is of, wall or CPU time, in the suite's unit),
    the ratio and its status.

    Parameters
    ----------
    report : dict
        What :func:`run_suites` returned (or its JSON, ``--json``).

    Returns
    -------
    str
        The table, preceded by the machine and versions of the run.
    """
    v = report["versions"]
    out = [f"{report['machine']}; " + ", ".join(f"{k} {val}" for k, val in v.items() if val)
           + f"; {report['seconds'] / 60:.0f} min.", "",
           "| suite | target | measured | baseline | value | status |",
           "| --- | --- | ---: | ---: | ---: | --- |"]
    for name, result in report["suites"].items():
        rows = {r["name"]: r for r in result.get("rows", [])}
        unit = result.get("unit", "")
        for t in result["targets"]:
            figure = t.get("figure", "median")
            measured = rows.get(t.get("measured"), {}).get(figure)
            baseline = rows.get(t.get("baseline"), {}).get(figure)
            value = "" if t["value"] is None else f"{t['value']:.3g}"
            out.append(f"| {name} | {t['target']} | {_figure(measured, unit)} | "
                       f"{_figure(baseline, unit)} | {value} | {t['status']} |")
    return "\n".join(out)
