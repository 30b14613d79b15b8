"""Suite ``sweep``: per-call cost against tensor size, for every consumer installed.

For 64-byte aligned float32 tensors of 1 KiB to 256 MiB (to 4 MiB with ``quick``),
the median µs of one call of:

    to_jax                  ``dlinspect.to_jax(x)`` (block_until_ready)
    jax.dlpack.from_dlpack  (block_until_ready)
    numpy.from_dlpack
    torch.from_dlpack       (where torch is installed)

with ``dlinspect.plan(x).kind`` of each size (it should be zero-copy).
Target: to_jax is flat across sizes on the zero-copy path (max/min <= 2).
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.dlpack
import numpy

import dlinspect

from ._common import KIB, MIB, Tick, optional, size_label, size_repeat, time_statement
from .to_jax import aligned_filled

SIZES = [1 * KIB, 16 * KIB, 256 * KIB, 4 * MIB, 64 * MIB, 256 * MIB]
QUICK_SIZES = [1 * KIB, 64 * KIB, 4 * MIB]
FLAT_LIMIT = 2.0


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    repeat = repeat or (3 if quick else 15)
    torch = optional("torch")
    methods = {"to_jax": "to_jax(x).block_until_ready()",
               "jax.dlpack.from_dlpack": "jax_from_dlpack(x).block_until_ready()",
               "numpy.from_dlpack": "numpy_from_dlpack(x)"}
    if torch is not None:
        methods["torch.from_dlpack"] = "torch_from_dlpack(x)"
    sweep = []
    rows = []
    for nbytes in QUICK_SIZES if quick else SIZES:
        x = aligned_filled((nbytes // 4,))
        ns = {"x": x, "to_jax": dlinspect.to_jax, "jax_from_dlpack": jax.dlpack.from_dlpack,
              "numpy_from_dlpack": numpy.from_dlpack,
              "torch_from_dlpack": torch.from_dlpack if torch is not None else None}
        point: dict[str, Any] = {"nbytes": nbytes, "size": size_label(nbytes),
                                 "plan": dlinspect.plan(x).kind}
        for method, stmt in methods.items():
            if tick:
                tick(f"sweep: {method} {point['size']}")
            timing = time_statement(stmt, ns, size_repeat(repeat, nbytes), 0.02 if quick else 0.2)
            point[method] = timing["median"]
            rows.append({"name": f"{method} {point['size']}", **timing})
        sweep.append(point)
        del ns, x
    return {"title": "sweep", "unit": "µs per call", "rows": rows, "repeat": repeat,
            "methods": list(methods), "sweep": sweep, "targets": [_flat_target(sweep)],
            "notes": []}


def _flat_target(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """to_jax's costs, max over min across the sizes, at most FLAT_LIMIT, every size zero-copy."""
    costs = [p["to_jax"] for p in sweep]
    ratio = max(costs) / min(costs)
    not_zero_copy = [p["size"] for p in sweep if p["plan"] != "zero-copy"]
    ok = ratio <= FLAT_LIMIT and not not_zero_copy
    return {"target": f"to_jax flat across sizes on the zero-copy path: max/min <= {FLAT_LIMIT:g}",
            "status": "PASS" if ok else "FAIL", "value": ratio, "limit": FLAT_LIMIT,
            "not_zero_copy": not_zero_copy}
