"""Suite ``copies``: the copies to_jax must make, against NumPy's own copy.

For float32 tensors of 1 KiB to 256 MiB (to 4 MiB with ``quick``) that JAX cannot view
as they are, the median µs of:

    to_jax(x)                       dlinspect's one copy (block_until_ready)
    to_jax(numpy_copy(x))           NumPy's own copy into fresh 64-byte aligned memory
                                    (np.copyto), then the zero-copy import of it

for four kinds of ``x``: ``misaligned`` (16 bytes past a 64-byte boundary), ``strided``
(every other column of a row-major matrix), ``narrowing`` (float64 with x64 off, cast
to float32; ``narrow="ok"``) and ``read-only`` (a read-only NumPy array). Both
statements of a pair take turns in every round (``time_cases``), so the machine's
drift falls on both. Target: every kind and size at most 1.15x its baseline; a strided
tensor, whose copy gathers in C where NumPy's copies through its iterator, at most 1.0x.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy

import dlinspect
from dlinspect._core import aligned_empty

from ._common import KIB, MIB, Tick, time_cases

SIZES = [1 * KIB, 64 * KIB, 1 * MIB, 4 * MIB, 64 * MIB, 256 * MIB]
QUICK_SIZES = [1 * KIB, 64 * KIB, 4 * MIB]
LIMIT = 1.15
#: Kinds held to another limit than :data:`LIMIT`.
LIMITS = {"strided": 1.0}
KINDS = ("misaligned", "strided", "narrowing", "read-only")


def numpy_copy(x: Any, dtype: Any = None) -> Any:
    """NumPy's copy of ``x`` into fresh 64-byte aligned memory (cast to ``dtype``)."""
    out = aligned_empty(x.shape, x.dtype if dtype is None else dtype, 64)
    numpy.copyto(out, x, casting="unsafe")
    return out


def tensors(nbytes: int) -> dict[str, Any]:
    """One source tensor of each kind, ``nbytes`` of float32 values to copy."""
    n = nbytes // 4
    misaligned = aligned_empty((n,), numpy.float32, 64, offset=16)
    misaligned[...] = 1.5
    wide = numpy.full((max(1, n // 64), 128), 2.5, numpy.float32)
    wide64 = aligned_empty((n,), numpy.float64, 64)
    wide64[...] = 3.5
    read_only = aligned_empty((n,), numpy.float32, 64)
    read_only[...] = 4.5
    read_only.flags.writeable = False
    return {"misaligned": misaligned, "strided": wide[:, ::2], "narrowing": wide64,
            "read-only": read_only}


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    repeat = repeat or (3 if quick else 15)
    dlinspect.to_jax(tensors(KIB)["misaligned"]).block_until_ready()   # JAX started first
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for nbytes in QUICK_SIZES if quick else SIZES:
        size = f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"
        ns: dict[str, Any] = {"to_jax": dlinspect.to_jax, "numpy_copy": numpy_copy,
                              "float32": numpy.float32}
        cases, pairs = [], []
        for kind, x in tensors(nbytes).items():
            name = kind.replace("-", "_")
            ns[name] = x
            cast = ", float32" if kind == "narrowing" else ""
            ok = ', narrow="ok"' if kind == "narrowing" else ""
            ours, base = f"to_jax {kind} {size}", f"numpy copy + import {kind} {size}"
            cases += [(ours, f"to_jax({name}{ok}).block_until_ready()", False),
                      (base, f"to_jax(numpy_copy({name}{cast})).block_until_ready()", False)]
            limit = LIMITS.get(kind, LIMIT)
            pairs.append((f"to_jax of a {kind} {size} tensor at most {limit:g}x NumPy's own "
                          f"copy into aligned memory and its import", ours, base, limit))
        got, checked = time_cases("copies", cases, ns, repeat if nbytes < 64 * MIB
                                  else max(3, repeat // 3), quick, tick, pairs)
        rows += got
        targets += checked
        del ns
    return {"title": "copies", "unit": "µs per call", "rows": rows, "repeat": repeat,
            "targets": targets, "notes": ["baseline: numpy.copyto into 64-byte aligned "
                                          "memory, then to_jax of that (zero-copy)"]}
