"""How long one ``dlinspect.to_jax`` call takes, next to ``jax.dlpack.from_dlpack``.

Measured: the median time of one call, in microseconds (µs), every result
waited for with ``block_until_ready``, of

    to_jax(x)               a 64-byte aligned 32x32 float32 numpy array
    from_dlpack(x)          ``jax.dlpack.from_dlpack(x)``, the baseline for to_jax(x)
    to_jax(t)               a 32x32 float32 torch CPU tensor (``torch.ones(32, 32)``)
    from_dlpack(t)          baseline for to_jax(t)
    to_jax(d)               a dict of 16 float32 torch tensors of shape (64,)
    tree_map(from_dlpack)   ``jax.tree_util.tree_map(jax.dlpack.from_dlpack, d)``

then, on the zero-copy path, to_jax and from_dlpack of 64-byte aligned float32
numpy arrays of 1 KiB, 16 KiB, 256 KiB, 4 MiB, 64 MiB and 256 MiB, with the
route ``dlinspect.plan(x).kind`` of each (it should be ``zero-copy``), and
last the resident-set growth (VmRSS) of importing one 256 MiB array with
``to_jax`` while the result is kept alive.

``to_jax``, ``from_dlpack`` and the rest are bound to global names, so every
statement is one global lookup plus the calls. Each statement runs under
``timeit.Timer``: ``autorange`` picks the loop count (>= 0.2 s per run), then
``repeat`` runs it ``--repeat`` times (15 by default; a third of that, at
least 3, for the 64 MiB and 256 MiB sizes) and the median per-call time is
reported. Targets, from times measured in this same run:

    to_jax(x)  <= 0.25 x from_dlpack(x)               numpy (32, 32)
    to_jax(t)  <= 0.25 x from_dlpack(t)               torch (32, 32); torch's own
                                                      __dlpack__ and __dlpack_device__
                                                      cost ~4 µs of it
    max / min of to_jax over the size sweep <= 2.0    and every size routed zero-copy
    256 MiB to_jax adds < 1 MiB (1024 KiB) of RSS

torch is optional; without it the torch rows and target are skipped.
JAX runs on the CPU (``JAX_PLATFORMS=cpu`` unless set otherwise).
This is a report: the exit status is 0 unless ``--check`` is given, then it
is 1 when a target fails.

Usage: python benchmarks/bench_to_jax.py [--json FILE] [--check] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.dlpack
import jax.tree_util
import jaxlib
import numpy

import dlinspect
from _bench import ratio_targets, time_statement
from dlinspect.testing import aligned_empty

try:
    import torch
except ImportError:
    torch = None

ALIGNMENT = 64
KIB = 1024
MIB = 1024 * KIB

# (row name, statement, needs torch)
CASES = [
    ("to_jax(x)", "to_jax(x).block_until_ready()", False),
    ("from_dlpack(x)", "from_dlpack(x).block_until_ready()", False),
    ("to_jax(t)", "to_jax(t).block_until_ready()", True),
    ("from_dlpack(t)", "from_dlpack(t).block_until_ready()", True),
    ("to_jax(d)", "block_until_ready(to_jax(d))", True),
    ("tree_map(from_dlpack, d)", "block_until_ready(tree_map(from_dlpack, d))", True),
]

# (description, measured row, baseline row, largest allowed ratio)
TARGETS = [
    ("to_jax(numpy 32x32) <= 0.25x from_dlpack", "to_jax(x)", "from_dlpack(x)", 0.25),
    ("to_jax(torch 32x32) <= 0.25x from_dlpack", "to_jax(t)", "from_dlpack(t)", 0.25),
]

# (label, bytes) of the zero-copy size sweep
SIZES = [
    ("1 KiB", 1 * KIB),
    ("16 KiB", 16 * KIB),
    ("256 KiB", 256 * KIB),
    ("4 MiB", 4 * MIB),
    ("64 MiB", 64 * MIB),
    ("256 MiB", 256 * MIB),
]
SWEEP_STATEMENTS = [
    ("to_jax", "to_jax(x).block_until_ready()"),
    ("from_dlpack", "from_dlpack(x).block_until_ready()"),
]
FLAT_LIMIT = 2.0  # largest allowed max/min of to_jax over the sweep
LARGE = 64 * MIB  # from this size on, fewer repeats

MEMORY_BYTES = 256 * MIB
MEMORY_LIMIT_KIB = 1024  # RSS growth must stay below this


def aligned_filled(shape: tuple[int, ...], value: float = 1.0) -> numpy.ndarray:
    """A 64-byte aligned float32 array of ``shape``, every page written."""
    x = aligned_empty(shape, numpy.float32, alignment=ALIGNMENT)
    x.fill(value)
    return x


def make_namespace() -> dict:
    namespace = {
        "x": aligned_filled((32, 32)),
        "to_jax": dlinspect.to_jax,
        "from_dlpack": jax.dlpack.from_dlpack,
        "tree_map": jax.tree_util.tree_map,
        "block_until_ready": jax.block_until_ready,
    }
    if torch is not None:
        namespace["t"] = torch.ones(32, 32)
        namespace["d"] = {f"w{i:02d}": torch.ones(64, dtype=torch.float32) for i in range(16)}
    return namespace




def rss_kib() -> int:
    """This process's resident set size, VmRSS from /proc/self/status, in KiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS line in /proc/self/status")


def run_sweep(repeat: int, results: dict) -> list[dict]:
    sweep = []
    print(f"\n{'size':>8}  {'plan':<10}  {'to_jax µs':>10}  {'from_dlpack µs':>14}"
          f"  {'repeat':>6}")
    print(f"{'-' * 8}  {'-' * 10}  {'-' * 10}  {'-' * 14}  {'-' * 6}")
    for label, nbytes in SIZES:
        x = aligned_filled((nbytes // 4,))
        kind = dlinspect.plan(x).kind
        size_repeat = repeat if nbytes < LARGE else max(3, repeat // 3)
        namespace = {"x": x, "to_jax": dlinspect.to_jax, "from_dlpack": jax.dlpack.from_dlpack}
        row = {"size": label, "nbytes": nbytes, "plan": kind, "zero_copy": kind == "zero-copy"}
        for fn, stmt in SWEEP_STATEMENTS:
            name = f"{fn}(x) {label}"
            results[name] = time_statement(stmt, namespace, size_repeat)
            row[f"{fn}_us"] = results[name]["median_us"]
        print(f"{label:>8}  {kind:<10}  {row['to_jax_us']:>10.4f}  {row['from_dlpack_us']:>14.4f}"
              f"  {size_repeat:>6}")
        sweep.append(row)
        del namespace, x
    return sweep


def measure_memory() -> dict:
    big = aligned_filled((MEMORY_BYTES // 4,))
    before = rss_kib()
    y = dlinspect.to_jax(big)
    y.block_until_ready()
    after = rss_kib()
    shares = y.unsafe_buffer_pointer() == big.ctypes.data
    memory = {
        "nbytes": MEMORY_BYTES,
        "plan": dlinspect.plan(big).kind,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "growth_kib": after - before,
        "shares_memory": shares,
    }
    del y, big
    return memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--repeat", type=int, default=15, help="timeit repeats (default 15)")
    args = parser.parse_args(argv)

    versions = {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "dlinspect": dlinspect.__version__,
    }
    print("  ".join(f"{name} {version or 'not installed'}" for name, version in versions.items()))
    print(f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, "
          f"JAX platform {jax.default_backend()}, median of {args.repeat} runs")
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
    del namespace

    sweep = run_sweep(args.repeat, results)

    memory = measure_memory()
    print(f"\nmemory: to_jax of a {MEMORY_BYTES // MIB} MiB aligned array ({memory['plan']}): "
          f"VmRSS {memory['rss_before_kib']} -> {memory['rss_after_kib']} KiB, "
          f"+{memory['growth_kib']} KiB; shares the array's memory: {memory['shares_memory']}")

    print()
    targets = ratio_targets(TARGETS, results)

    description = f"to_jax flat across sizes (zero-copy): max/min <= {FLAT_LIMIT}"
    slowest = max(sweep, key=lambda row: row["to_jax_us"])
    fastest = min(sweep, key=lambda row: row["to_jax_us"])
    ratio = slowest["to_jax_us"] / fastest["to_jax_us"]
    not_zero_copy = [row["size"] for row in sweep if not row["zero_copy"]]
    status = "PASS" if ratio <= FLAT_LIMIT and not not_zero_copy else "FAIL"
    extra = f"; not zero-copy: {', '.join(not_zero_copy)}" if not_zero_copy else ""
    print(f"{status}  {description}: to_jax(x) {slowest['size']} / to_jax(x) {fastest['size']}"
          f" = {ratio:.3f}{extra}")
    targets.append({"target": description, "measured": f"to_jax(x) {slowest['size']}",
                    "baseline": f"to_jax(x) {fastest['size']}", "limit": FLAT_LIMIT,
                    "ratio": ratio, "not_zero_copy": not_zero_copy, "status": status})

    description = f"{MEMORY_BYTES // MIB} MiB zero-copy to_jax adds < {MEMORY_LIMIT_KIB} KiB RSS"
    status = "PASS" if memory["growth_kib"] < MEMORY_LIMIT_KIB else "FAIL"
    print(f"{status}  {description}: +{memory['growth_kib']} KiB")
    targets.append({"target": description, "measured": "growth_kib", "limit": MEMORY_LIMIT_KIB,
                    "value": memory["growth_kib"], "status": status})

    if args.json:
        report = {"unit": "microseconds per call", "versions": versions,
                  "machine": platform.machine(), "results": results, "sweep": sweep,
                  "memory": memory, "targets": targets}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.json}")

    failed = any(t["status"] == "FAIL" for t in targets)
    return 1 if (args.check and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
