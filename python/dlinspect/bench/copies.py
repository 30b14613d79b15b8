"""Suite ``copies``: the copies to_jax must make, against JAX's own and NumPy's.

For float32 tensors of 1 KiB to 256 MiB (to 4 MiB with ``quick``) that JAX cannot view
as they are, the median µs of:

    to_jax(x)                        dlinspect's one copy (block_until_ready)
    jax.device_put(x)                JAX's own put of the same input
    jnp.asarray(x)                   JAX's own conversion
    to_jax(numpy_copy(x))            NumPy's copy into fresh 64-byte aligned memory
                                     (np.copyto), then the zero-copy import of it

for seven kinds of ``x``: ``misaligned`` (16 bytes past a 64-byte boundary), ``read-only``
(an aligned read-only NumPy array), ``narrowing`` (float64 with x64 off, cast to float32;
``narrow="ok"``), ``strided`` (every other column of a row-major matrix), ``transposed``
(``a.T`` of a square matrix 16 bytes past a 64-byte boundary, as NumPy's allocator places
large arrays), ``NCHW->NHWC`` (``a.transpose(0, 2, 3, 1)`` of images) and ``reversed``
(``a[::-1, ::-1]``). Every statement takes its turn in every round (``time_cases``), so
the machine's drift falls on all alike. Target: every kind and size at most 1.0x the
fastest baseline that copies too (``jax.device_put`` views an aligned read-only array
in place, which dlinspect copies by design: there it is no baseline).

The copies are timed, not the first touch of fresh pages: glibc's malloc keeps what is
freed while a size is timed (``_kept_memory``). That touch costs every statement alike
but not at every moment alike: where a virtual machine's host takes freed memory back,
touching it again waits on the host (measured on one: 64 MiB touched in 470 ms, copied
in 9 ms; one statement's median 10-26 ms from one round to the next).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import warnings
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy

import dlinspect
from dlinspect._core import aligned_empty

from ._common import KIB, MIB, Tick, ratio_target, size_label, size_repeat, time_cases

SIZES = [1 * KIB, 64 * KIB, 1 * MIB, 4 * MIB, 64 * MIB, 256 * MIB]
QUICK_SIZES = [1 * KIB, 64 * KIB, 4 * MIB]
LIMIT = 1.0
KINDS = ("misaligned", "read-only", "narrowing", "strided", "transposed", "NCHW->NHWC",
         "reversed")
#: The baselines: row name -> statement over ``x`` (a kind's tensor).
BASELINES = {"jax.device_put": "jax.device_put({x})", "jnp.asarray": "jnp.asarray({x})",
             "numpy copy + import": "to_jax(numpy_copy({x}{cast}))"}
#: What the statements add for a kind: to_jax's keyword, and the cast of NumPy's copy.
EXTRA = {"narrowing": (', narrow="ok"', ", float32")}


def numpy_copy(x: Any, dtype: Any = None) -> Any:
    """NumPy's copy of ``x`` into fresh 64-byte aligned memory (cast to ``dtype``)."""
    out = aligned_empty(x.shape, x.dtype if dtype is None else dtype, 64)
    numpy.copyto(out, x, casting="unsafe")
    return out


@contextlib.contextmanager
def _kept_memory() -> Iterator[None]:
    """glibc's malloc keeps all it frees and maps no block anew while this runs (mallopt:
    M_MMAP_MAX 0, M_TRIM_THRESHOLD 2**31 - 1), then takes its defaults again; a no-op
    where the C library has no mallopt."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", lambda option, value: 0)
    mallopt(-4, 0), mallopt(-1, 2**31 - 1)   # (M_MMAP_MAX, M_TRIM_THRESHOLD)
    try:
        yield
    finally:
        mallopt(-4, 65536), mallopt(-1, 128 * KIB)


def _filled(shape: tuple[int, ...], dtype: Any, offset: int = 0) -> Any:
    a = aligned_empty(shape, dtype, 64, offset=offset)
    a.reshape(-1)[:] = numpy.arange(a.size) % 251
    return a


def tensors(nbytes: int) -> dict[str, Any]:
    """One source tensor of each kind, ``nbytes`` of float32 values to copy."""
    n = nbytes // 4
    side = max(1, int(n ** 0.5))
    hw = max(1, int((n // 8) ** 0.5))
    read_only = _filled((n,), numpy.float32)
    read_only.flags.writeable = False
    return {"misaligned": _filled((n,), numpy.float32, 16), "read-only": read_only,
            "narrowing": _filled((n,), numpy.float64),
            "strided": _filled((max(1, n // 64), 128), numpy.float32)[:, ::2],
            "transposed": _filled((side, side), numpy.float32, 16).T,
            "NCHW->NHWC": _filled((2, 4, hw, hw), numpy.float32).transpose(0, 2, 3, 1),
            "reversed": _filled((side, side), numpy.float32)[::-1, ::-1]}


def _copies(stmt: str, ns: dict[str, Any], x: Any) -> bool:
    """Whether a baseline's statement gives a copy of ``x`` (not a view of its memory)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = eval(stmt, ns)
    return bool(out.unsafe_buffer_pointer() != x.__array_interface__["data"][0])


def _cases(size: str, ns: dict[str, Any],
           xs: dict[str, Any]) -> tuple[list[tuple[str, str, bool]], dict[str, list[str]]]:
    """The cases of one size (``time_cases``'s): to_jax of each kind's tensor in ``xs``,
    then each baseline that copies it; and the baselines of each kind. Puts the tensors
    into ``ns``."""
    cases, bases_of = [], {}
    for kind, x in xs.items():
        name = "x_" + "".join(c if c.isalnum() else "_" for c in kind)
        ns[name] = x
        ok, cast = EXTRA.get(kind, ("", ""))
        cases.append((f"to_jax {kind} {size}", f"to_jax({name}{ok}).block_until_ready()", False))
        bases = [base for base, stmt in BASELINES.items()
                 if _copies(stmt.format(x=name, cast=cast), ns, x)]
        cases += [(f"{base} {kind} {size}",
                   BASELINES[base].format(x=name, cast=cast) + ".block_until_ready()", False)
                  for base in bases]
        bases_of[kind] = bases
    return cases, bases_of


def _targets(size: str, bases_of: dict[str, list[str]],
             rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kind's target at one size: to_jax against the fastest baseline that copies."""
    by_name = {r["name"]: r for r in rows}
    targets = []
    for kind, bases in bases_of.items():
        fastest = min(bases, key=lambda b: by_name[f"{b} {kind} {size}"]["median"])
        targets.append(ratio_target(
            f"to_jax of a {kind} {size} tensor at most {LIMIT:g}x the fastest copy of "
            f"JAX's own and NumPy's", by_name, f"to_jax {kind} {size}",
            f"{fastest} {kind} {size}", LIMIT))
    return targets


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    repeat = repeat or (3 if quick else 15)
    dlinspect.to_jax(tensors(KIB)["misaligned"]).block_until_ready()   # JAX started first
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    warnings.filterwarnings("ignore", message=".*requested in asarray is not available")
    for nbytes in QUICK_SIZES if quick else SIZES:
        size = size_label(nbytes)
        ns: dict[str, Any] = {"to_jax": dlinspect.to_jax, "numpy_copy": numpy_copy,
                              "float32": numpy.float32, "jax": jax, "jnp": jnp}
        with _kept_memory():
            cases, bases_of = _cases(size, ns, tensors(nbytes))
            got, _ = time_cases("copies", cases, ns, size_repeat(repeat, nbytes), quick, tick,
                                [])
            del ns, cases
        rows += got
        targets += _targets(size, bases_of, got)
    return {"title": "copies", "unit": "µs per call", "rows": rows, "repeat": repeat,
            "targets": targets, "notes": [
                "baselines: jax.device_put(x), jnp.asarray(x), and numpy.copyto into 64-byte "
                "aligned memory then to_jax of that (zero-copy); each only where it copies",
                "glibc's malloc keeps freed memory while a size is timed: every destination "
                "is memory touched before (see the suite's docstring)"]}
