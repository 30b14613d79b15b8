"""How long one ``dlinspect.peek`` call takes, next to the calls it replaces.

Measured: the median time of one call, in microseconds (µs), of

    id(x)                   the floor of any call from Python into C
    peek(cap)               a ``x.__dlpack__(max_version=(1, 3))`` capsule made once
    peek(x)                 a 32x32 float32 numpy array
    peek(x.__dlpack__())    baseline for peek(x): export a capsule, then peek it
    peek(t)                 a 32x32 float32 torch CPU tensor (1.3 C exchange API)
    t.__dlpack__()          torch's own export, which peek(t) avoids
    from_dlpack(x)          ``numpy.from_dlpack(x)``, a full DLPack round trip

``peek`` and ``from_dlpack`` are bound to global names, so every statement is
one global lookup plus a call, like ``id(x)``. Each statement runs under
``timeit.Timer``: ``autorange`` picks the loop count (>= 0.2 s per run), then
``repeat`` runs it ``--repeat`` times (15 by default) and the median per-call
time is reported. Targets, as ratios of times measured in this same run:

    peek(cap) <= 2.5 x id(x)
    peek(x)   <= 1.5 x peek(x.__dlpack__())
    peek(t)   <= 0.25 x t.__dlpack__()

torch is optional; without it the torch rows and target are skipped.
This is a report: the exit status is 0 unless ``--check`` is given, then it
is 1 when a target fails.

Usage: python benchmarks/bench_peek.py [--json FILE] [--check] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy

import dlinspect
from _bench import ratio_targets, time_statement

try:
    import torch
except ImportError:
    torch = None

# (row name, statement, needs torch)
CASES = [
    ("id(x)", "id(x)", False),
    ("peek(cap)", "peek(cap)", False),
    ("peek(x)", "peek(x)", False),
    ("peek(x.__dlpack__())", "peek(x.__dlpack__())", False),
    ("peek(t)", "peek(t)", True),
    ("t.__dlpack__()", "t.__dlpack__()", True),
    ("numpy.from_dlpack(x)", "from_dlpack(x)", False),
]

# (description, measured row, baseline row, largest allowed ratio)
TARGETS = [
    ("peek(capsule) <= 2.5x id()", "peek(cap)", "id(x)", 2.5),
    ("peek(numpy array) <= 1.5x peek(x.__dlpack__())", "peek(x)", "peek(x.__dlpack__())", 1.5),
    ("peek(torch tensor) <= 0.25x t.__dlpack__()", "peek(t)", "t.__dlpack__()", 0.25),
]


def make_namespace() -> dict:
    x = numpy.zeros((32, 32), dtype=numpy.float32)
    namespace = {
        "x": x,
        "cap": x.__dlpack__(max_version=(1, 3)),
        "peek": dlinspect.peek,
        "from_dlpack": numpy.from_dlpack,
    }
    if torch is not None:
        namespace["t"] = torch.zeros((32, 32), dtype=torch.float32)
    return namespace




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--repeat", type=int, default=15, help="timeit repeats (default 15)")
    args = parser.parse_args(argv)

    versions = {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "dlinspect": dlinspect.__version__,
    }
    print("  ".join(f"{name} {version or 'not installed'}" for name, version in versions.items()))
    print(f"machine: {platform.machine()} {platform.system()}, median of {args.repeat} runs")
    if torch is None:
        print("note: torch is not installed; the torch rows and target are skipped")

    namespace = make_namespace()
    results = {}
    width = max(len(name) for name, _, _ in CASES)
    print(f"\n{'name':<{width}}  {'median µs':>10}")
    print(f"{'-' * width}  {'-' * 10}")
    for name, stmt, needs_torch in CASES:
        if needs_torch and torch is None:
            print(f"{name:<{width}}  {'skipped':>10}")
            continue
        results[name] = time_statement(stmt, namespace, args.repeat)
        print(f"{name:<{width}}  {results[name]['median_us']:>10.4f}")

    print()
    targets = ratio_targets(TARGETS, results)

    if args.json:
        report = {"unit": "microseconds per call", "versions": versions,
                  "machine": platform.machine(), "results": results, "targets": targets}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.json}")

    failed = any(t["status"] == "FAIL" for t in targets)
    return 1 if (args.check and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
