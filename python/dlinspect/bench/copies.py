"""Suite ``copies``: the copies to_jax must make, against JAX's own and NumPy's.

For float32 tensors that JAX cannot view as they are, of 1 KiB, 64 KiB, 1 MiB, 3.9 MiB,
4 MiB, 4.1 MiB, 8 MiB, 64 MiB and 256 MiB (``quick``: 1 KiB, 64 KiB, 3.9 MiB, 4 MiB and
4.1 MiB), the median wall time and the median CPU time per call, in µs, of:

    to_jax(x)                        dlinspect's one copy (block_until_ready)
    jax.device_put(x)                JAX's own put of the same input
    jnp.asarray(x)                   JAX's own conversion
    to_jax(numpy_copy(x))            NumPy's copy into fresh 64-byte aligned memory
                                     (np.copyto), then the zero-copy import of it

for ten kinds of ``x``: ``misaligned`` (16 bytes past a 64-byte boundary), ``read-only``
(an aligned read-only NumPy array), ``narrowing`` (float64 with x64 off, cast to float32;
``narrow="ok"``), ``strided`` (every other column of a row-major matrix), ``transposed``
(``a.T`` of a square matrix 16 bytes past a 64-byte boundary, as NumPy's allocator places
large arrays), ``NCHW->NHWC`` (``a.transpose(0, 2, 3, 1)`` of 2 images of 4 square
channels), ``NHWC->NCHW 3ch`` (``a.transpose(0, 3, 1, 2)`` of 2 square images of 3
channels last: the innermost source stride is 12 bytes), ``reversed``
(``a[::-1, ::-1]`` of a square matrix), ``broadcast`` (``np.broadcast_to`` of one row to
a square matrix: stride 0 on the outer axis, read-only) and ``reversed rows`` (``a[::-1]``
of a square row-major matrix: each row dense).

Sizes are the bytes to_jax writes (float32 values), and sit on both sides of the copy
kernel's 4 MiB thresholds (``DL_COPY_PARALLEL_MIN``, two threads; ``DL_COPY_STREAM_MIN``,
streaming stores; both counted in destination bytes): 3.9 MiB is 3,994 KiB and 4.1 MiB
4,198 KiB. Each kind's tensor is the smallest of its shape holding at least the size's
values (square sides, image sides and strided rows rounded up), so that a row copies
its size or a little more, never less: a row of 4 MiB lies on the thresholds' upper side
and one of 3.9 MiB below them. A tensor holds up to 15% more than its size at 1 KiB, 3.3%
at 64 KiB, 1.1% at 1 MiB and 0.6% from 3.9 MiB (the image kinds; the others less or
none). Every row records ``nbytes``, the bytes it copies.

Before any timing, each kind's to_jax result is checked by computation against NumPy's
reference (the values, and ``2 * a - a[..., ::-1]`` computed in JAX): the suite raises
where they differ.

Every statement takes its turn in every round (``time_cases``), so the machine's drift
falls on all alike. The CPU time is the process's, every thread (``time.process_time``
around the same loop as the wall time): dlinspect's copy worker and JAX's threads count.
Target, judged on CPU time: every kind and size at most 1.0x the fastest (in CPU time)
baseline that copies too (``jax.device_put`` views an aligned read-only array in place,
which dlinspect copies by design: there it is no baseline). Each target also gives the
wall-time ratio, against the baseline fastest in wall time (``wall_value``,
``wall_baseline``).

The copies are timed, not the first touch of fresh pages: glibc's malloc keeps what is
freed while a size is timed (``_kept_memory``). That touch costs every statement alike
but not at every moment alike: where a virtual machine's host takes freed memory back,
touching it again waits on the host (measured on one: 64 MiB touched in 470 ms, copied
in 9 ms; one statement's median 10-26 ms from one round to the next).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import warnings
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy

import dlinspect
from dlinspect._core import aligned_empty

from ._common import KIB, MIB, Tick, ratio_target, size_label, size_repeat, time_cases

#: 3,994 KiB and 4,198 KiB: "3.9 MiB" and "4.1 MiB", either side of the copy kernel's
#: 4 MiB thresholds (include/dlinspect/copy.h).
SIZES = [1 * KIB, 64 * KIB, 1 * MIB, 3994 * KIB, 4 * MIB, 4198 * KIB, 8 * MIB, 64 * MIB,
         256 * MIB]
QUICK_SIZES = [1 * KIB, 64 * KIB, 3994 * KIB, 4 * MIB, 4198 * KIB]
LIMIT = 1.0
KINDS = ("misaligned", "read-only", "narrowing", "strided", "transposed", "NCHW->NHWC",
         "NHWC->NCHW 3ch", "reversed", "broadcast", "reversed rows")
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


def _side(count: int, per: int = 1) -> int:
    """The least side ``s`` with ``per * s * s >= count``: a square's side rounded up."""
    return math.isqrt(max(0, -(-count // per) - 1)) + 1


def tensors(nbytes: int) -> dict[str, Any]:
    """One source tensor of each kind, at least ``nbytes`` of float32 values to copy (the
    smallest of the kind's shape that holds them).

    Parameters
    ----------
    nbytes : int
        The size: bytes of float32 values to_jax writes.

    Returns
    -------
    dict
        Kind (:data:`KINDS`) -> its NumPy array.
    """
    n = nbytes // 4
    side = _side(n)
    hw4 = _side(n, 2 * 4)
    hw3 = _side(n, 2 * 3)
    read_only = _filled((n,), numpy.float32)
    read_only.flags.writeable = False
    return {"misaligned": _filled((n,), numpy.float32, 16),
            "read-only": read_only,
            "narrowing": _filled((n,), numpy.float64),
            "strided": _filled((-(-n // 64), 128), numpy.float32)[:, ::2],
            "transposed": _filled((side, side), numpy.float32, 16).T,
            "NCHW->NHWC": _filled((2, 4, hw4, hw4), numpy.float32).transpose(0, 2, 3, 1),
            "NHWC->NCHW 3ch": _filled((2, hw3, hw3, 3), numpy.float32).transpose(0, 3, 1, 2),
            "reversed": _filled((side, side), numpy.float32)[::-1, ::-1],
            "broadcast": numpy.broadcast_to(_filled((side,), numpy.float32), (side, side)),
            "reversed rows": _filled((side, side), numpy.float32)[::-1]}


def _computed(a: Any) -> Any:
    """The computation the check runs on to_jax's result and NumPy's reference: each
    element against the one mirrored along the last axis."""
    return 2 * a - a[..., ::-1]


def _check(kind: str, out: Any, x: Any) -> None:
    """Raise where to_jax's result ``out`` of ``x`` differs from NumPy's reference (the
    values as float32), in its values or in a computation JAX runs on it."""
    import jax
    reference = numpy.asarray(x, numpy.float32)
    values = numpy.asarray(out)
    computed = numpy.asarray(jax.jit(_computed)(out))
    if (values.shape != reference.shape or not numpy.array_equal(values, reference)
            or not numpy.array_equal(computed, _computed(reference))):
        raise AssertionError(f"copies: to_jax of the {kind} tensor {x.shape} (strides "
                             f"{x.strides}) differs from NumPy's reference")


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
    into ``ns``, and checks to_jax's result of each (``_check``) before any is timed."""
    cases, bases_of = [], {}
    for kind, x in xs.items():
        name = "x_" + "".join(c if c.isalnum() else "_" for c in kind)
        ns[name] = x
        ok, cast = EXTRA.get(kind, ("", ""))
        _check(kind, eval(f"to_jax({name}{ok})", ns), x)
        cases.append((f"to_jax {kind} {size}", f"to_jax({name}{ok}).block_until_ready()", False))
        bases = [base for base, stmt in BASELINES.items()
                 if _copies(stmt.format(x=name, cast=cast), ns, x)]
        cases += [(f"{base} {kind} {size}",
                   BASELINES[base].format(x=name, cast=cast) + ".block_until_ready()", False)
                  for base in bases]
        bases_of[kind] = bases
    return cases, bases_of


def _target(kind: str, size: str, bases: list[str],
            by_name: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One kind's target at one size: to_jax's CPU time against that of the baseline
    fastest in CPU time; with the wall-time ratio against the one fastest in wall time."""
    measured = f"to_jax {kind} {size}"
    rows = [by_name[f"{base} {kind} {size}"] for base in bases]
    fastest_cpu = min(rows, key=lambda r: r["cpu_median"])["name"]
    fastest_wall = min(rows, key=lambda r: r["median"])["name"]
    target = ratio_target(
        f"to_jax of a {kind} {size} tensor at most {LIMIT:g}x the fastest copy of JAX's own "
        f"and NumPy's (CPU time)", by_name, measured, fastest_cpu, LIMIT, figure="cpu_median")
    target["wall_value"] = by_name[measured]["median"] / by_name[fastest_wall]["median"]
    target["wall_baseline"] = fastest_wall
    return target


def _targets(size: str, bases_of: dict[str, list[str]],
             rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kind's target at one size (``_target``)."""
    by_name = {r["name"]: r for r in rows}
    return [_target(kind, size, bases, by_name) for kind, bases in bases_of.items()]


def _described(rows: list[dict[str, Any]], size: str, xs: dict[str, Any]) -> None:
    """Give each row of one size its ``kind``, ``size`` (the nominal one) and ``nbytes``
    (the bytes its copy writes: float32 values)."""
    kinds = {f"{who} {kind} {size}": kind for kind in xs for who in ("to_jax", *BASELINES)}
    for row in rows:
        kind = kinds[row["name"]]
        row.update(kind=kind, size=size, nbytes=xs[kind].size * 4)


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    """Run the suite (see the module's docstring).

    Parameters
    ----------
    quick : bool
        The quick sizes (:data:`QUICK_SIZES`), 3 runs, loops of 0.02 s.
    repeat : int or None
        Runs per measurement (default 15, or 3 with ``quick``; a third from 64 MiB).
    tick : callable or None
        Told each case as it starts.

    Returns
    -------
    dict
        The suite's result (see ``dlinspect.bench._common``): ``rows`` with wall and CPU
        medians, ``kind``, ``size`` and ``nbytes``; ``targets`` judged on CPU time, each
        with its ``wall_value``.

    Raises
    ------
    AssertionError
        A kind's to_jax result differs from NumPy's reference.
    """
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
            xs = tensors(nbytes)
            cases, bases_of = _cases(size, ns, xs)
            got, _ = time_cases("copies", cases, ns, size_repeat(repeat, nbytes), quick, tick,
                                [], cpu=True)
            _described(got, size, xs)
            del ns, cases, xs
        rows += got
        targets += _targets(size, bases_of, got)
    return {"title": "copies", "unit": "µs per call", "rows": rows, "repeat": repeat,
            "targets": targets, "notes": [
                "baselines: jax.device_put(x), jnp.asarray(x), and numpy.copyto into 64-byte "
                "aligned memory then to_jax of that (zero-copy); each only where it copies",
                "median: wall time; cpu median: the process's CPU time (every thread) around "
                "the same calls; targets are judged on CPU time, against the baseline "
                "fastest in CPU time, and give the wall-time ratio too",
                "sizes: each kind's tensor is the smallest of its shape holding the size's "
                "float32 values (rounded up; each row's nbytes is what it copies); 3.9 MiB is "
                "3,994 KiB, 4.1 MiB 4,198 KiB",
                "glibc's malloc keeps freed memory while a size is timed: every destination "
                "is memory touched before (see the suite's docstring)"]}
