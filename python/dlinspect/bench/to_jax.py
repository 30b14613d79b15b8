"""Suite ``to_jax``: one ``dlinspect.to_jax`` call next to ``jax.dlpack.from_dlpack``.

Rows, median µs per call, every result waited for with ``block_until_ready``:

    to_jax(x) / from_dlpack(x)        a 64-byte aligned 32x32 float32 NumPy array
    to_jax(x16) / from_dlpack(x16)    the same, 16-byte aligned (NumPy's usual for small
                                      arrays): both copy; dlinspect's copy is made in C
    to_jax(t) / from_dlpack(t)        a 32x32 float32 torch CPU tensor
    to_jax(d) / tree_map(from_dlpack, d)   a dict of 16 float32 torch tensors of shape (64,)
    16 x to_jax(t16)                  the same 16 tensors, one call each, into the same dict
    16 x jaxlib import                16 NumPy (64,) float32 capsules into jaxlib's own import
                                      function: the floor any DLPack import pays here
    to_jax(j) / from_dlpack(j)        a jax.Array (returned as it is: no DLPack round trip)

and the resident-set growth (VmRSS) of importing one 256 MiB aligned array with
to_jax while the result is alive (64 MiB with ``quick``).

Targets: to_jax <= 0.25x from_dlpack for the NumPy array and the torch tensor;
the dict of 16 <= 0.15x tree_map(from_dlpack) and <= 1.15x its 16 single calls (the row
"16 x jaxlib import" shows how much of the batch is jaxlib's own import: no target);
a jax.Array <= 0.05x from_dlpack; the large zero-copy import adds < 1 MiB of RSS and
shares the array's memory.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.dlpack
import jax.tree_util
import numpy

import dlinspect
from dlinspect._core import aligned_empty

from ._common import MIB, Tick, optional, rss_kib, time_cases

CASES = [
    ("to_jax(x)", "to_jax(x).block_until_ready()", False),
    ("from_dlpack(x)", "from_dlpack(x).block_until_ready()", False),
    ("to_jax(x16)", "to_jax(x16).block_until_ready()", False),
    ("from_dlpack(x16)", "from_dlpack(x16).block_until_ready()", False),
    ("to_jax(t)", "to_jax(t).block_until_ready()", True),
    ("from_dlpack(t)", "from_dlpack(t).block_until_ready()", True),
    ("to_jax(d)", "block_until_ready(to_jax(d))", True),
    ("tree_map(from_dlpack, d)", "block_until_ready(tree_map(from_dlpack, d))", True),
    ("16 x to_jax(t16)", "block_until_ready({k: to_jax(v) for k, v in d.items()})", True),
    ("16 x jaxlib import", "block_until_ready([imp(a.__dlpack__(), cpu, None, None, 1) "
                           "for a in arrays])", True),
    ("to_jax(j)", "to_jax(j).block_until_ready()", False),
    ("from_dlpack(j)", "from_dlpack(j).block_until_ready()", False),
]
TARGETS = [
    ("to_jax(numpy 32x32) <= 0.25x from_dlpack", "to_jax(x)", "from_dlpack(x)", 0.25),
    ("to_jax(torch 32x32) <= 0.25x from_dlpack", "to_jax(t)", "from_dlpack(t)", 0.25),
    ("to_jax(dict of 16 torch) <= 0.15x tree_map(from_dlpack)", "to_jax(d)",
     "tree_map(from_dlpack, d)", 0.15),
    ("to_jax(dict of 16 torch) <= 1.15x 16 single calls", "to_jax(d)", "16 x to_jax(t16)", 1.15),
    ("to_jax(jax.Array) <= 0.05x from_dlpack", "to_jax(j)", "from_dlpack(j)", 0.05),
]
MEMORY_LIMIT_KIB = 1024


def aligned_filled(shape: tuple[int, ...], value: float = 1.0) -> numpy.ndarray:
    """A 64-byte aligned float32 array of ``shape``, every page written."""
    x = aligned_empty(shape, numpy.float32, alignment=64)
    x.fill(value)
    return x


def measure_memory(nbytes: int) -> dict[str, Any]:
    big = aligned_filled((nbytes // 4,))
    before = rss_kib()
    y = dlinspect.to_jax(big)
    y.block_until_ready()
    after = rss_kib()
    out = {"nbytes": nbytes, "plan": dlinspect.plan(big).kind, "rss_before_kib": before,
           "rss_after_kib": after, "growth_kib": after - before,
           "shares_memory": y.unsafe_buffer_pointer() == big.ctypes.data}
    del y, big
    return out


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    repeat = repeat or (3 if quick else 15)
    torch = optional("torch")
    x16 = aligned_empty((32, 32), numpy.float32, alignment=64, offset=16)
    x16.fill(1.0)
    ns: dict[str, Any] = {"x": aligned_filled((32, 32)), "x16": x16, "to_jax": dlinspect.to_jax,
                          "from_dlpack": jax.dlpack.from_dlpack, "tree_map": jax.tree_util.tree_map,
                          "j": jax.numpy.ones((32, 32)),
                          "block_until_ready": jax.block_until_ready}
    if torch is not None:
        ns["t"] = torch.ones(32, 32)
        ns["d"] = {f"w{i:02d}": torch.ones(64, dtype=torch.float32) for i in range(16)}
        from dlinspect._core import jax_target as target
        ns["imp"], ns["cpu"] = target().import_fn, target().cpu_device
        ns["arrays"] = [aligned_filled((64,)) for _ in range(16)]
    rows, targets = time_cases("to_jax", CASES, ns, repeat, quick, tick, TARGETS)
    if tick:
        tick("to_jax: memory")
    memory = measure_memory((64 if quick else 256) * MIB)
    ok = memory["growth_kib"] < MEMORY_LIMIT_KIB and memory["shares_memory"]
    targets.append({"target": f"{memory['nbytes'] // MIB} MiB zero-copy to_jax adds < "
                              f"{MEMORY_LIMIT_KIB} KiB RSS and shares the memory",
                    "status": "PASS" if ok else "FAIL", "value": memory["growth_kib"],
                    "limit": MEMORY_LIMIT_KIB})
    notes = [f"memory: to_jax of a {memory['nbytes'] // MIB} MiB aligned array ({memory['plan']}): "
             f"VmRSS {memory['growth_kib']:+,} KiB; shares the array's memory: "
             f"{memory['shares_memory']}"]
    return {"title": "to_jax", "unit": "µs per call", "rows": rows, "repeat": repeat,
            "targets": targets, "memory": memory, "notes": notes}
