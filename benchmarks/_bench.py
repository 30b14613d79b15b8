"""Timing and reporting shared by the benchmark scripts in this folder."""

from __future__ import annotations

import statistics
import timeit


def time_statement(stmt: str, namespace: dict, repeat: int) -> dict:
    """Median per-call time of ``stmt``, in microseconds: ``autorange`` picks the
    loop count (>= 0.2 s per run), then ``repeat`` runs are taken."""
    timer = timeit.Timer(stmt, globals=namespace)
    number, _ = timer.autorange()
    runs_us = [total / number * 1e6 for total in timer.repeat(repeat=repeat, number=number)]
    return {
        "stmt": stmt,
        "number": number,
        "repeat": repeat,
        "median_us": statistics.median(runs_us),
        "min_us": min(runs_us),
        "runs_us": runs_us,
    }


def ratio_targets(targets: list, results: dict) -> list[dict]:
    """Check ``(description, measured, baseline, limit)`` ratio targets; print and return them."""
    out = []
    for description, measured, baseline, limit in targets:
        if measured not in results or baseline not in results:
            status, ratio = "SKIP", None
            print(f"SKIP  {description}: torch is not installed")
        else:
            ratio = results[measured]["median_us"] / results[baseline]["median_us"]
            status = "PASS" if ratio <= limit else "FAIL"
            print(f"{status}  {description}: {measured} / {baseline} = {ratio:.3f}")
        out.append({"target": description, "measured": measured, "baseline": baseline,
                    "limit": limit, "ratio": ratio, "status": status})
    return out


def versions() -> dict:
    """Versions of Python and of every library the benchmarks touch (None: not installed)."""
    import importlib.metadata
    import platform

    out = {"python": platform.python_version()}
    for dist in ("numpy", "jax", "jaxlib", "torch", "ml_dtypes", "dlinspect"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def print_versions(found: dict) -> None:
    print("  ".join(f"{name} {version or 'not installed'}" for name, version in found.items()))
