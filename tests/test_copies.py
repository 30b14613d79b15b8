"""The copies to_jax makes in C: one pass over any layout, any size, narrowed or not."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")

from hypothesis import given, settings, strategies as st  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import plan, to_jax  # noqa: E402
from dlinspect.testing import DeleterCounter, aligned_empty, make_capsule  # noqa: E402
from _versions import enable_x64  # noqa: E402

DTYPES = ["bool", "uint8", "int16", "float16", "int32", "float32", "int64", "uint64",
          "float64", "complex64", "complex128"]


@st.composite
def views(draw):
    """A view of a fresh array: any extents, steps of either sign, transposes, broadcast
    axes and a misaligned start."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    offset = draw(st.sampled_from([0, dtype.itemsize, 16]))
    base = aligned_empty(shape, dtype, 64, offset=offset if offset % dtype.itemsize == 0 else 0)
    base[...] = (np.arange(base.size).reshape(shape) * 7 % 250).astype(dtype)
    index = tuple(slice(None, None, draw(st.sampled_from([1, 2, -1, -2, 3]))) for _ in shape)
    x = base[index] if index else base   # (a 0-d index gives a NumPy scalar)
    if ndim > 1 and draw(st.booleans()):
        x = x.transpose(draw(st.permutations(range(ndim))))
    if draw(st.booleans()):
        x = np.broadcast_to(x, (draw(st.integers(1, 3)),) + x.shape)
    return x


@settings(max_examples=300, deadline=None)
@given(x=views(), x64=st.booleans(), readonly=st.booleans())
def test_any_view_copies_to_its_values(x, x64, readonly):
    if readonly and x.flags.writeable:
        x = x.view()
        x.flags.writeable = False
    with enable_x64(x64), warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        route = plan(x)
        got = to_jax(x)
        want = np.asarray(x).astype(jax.dtypes.canonicalize_dtype(x.dtype))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)
    assert route.kind in ("zero-copy", "copy")
    if route.kind == "copy":
        assert got.unsafe_buffer_pointer() % 64 == 0


@pytest.mark.parametrize("nbytes", [(1 << 20) + 64, 8 << 20])
def test_past_a_mebibyte_still_one_copy(nbytes):
    # Misaligned, strided and narrowed sources above the old 1 MiB bound of the C copy:
    # values as NumPy casts them, the source freed at once (its deleter has run when
    # to_jax returns: nothing of it is kept).
    n = nbytes // 8
    src = aligned_empty((n,), np.float64, 64, offset=8)
    src[...] = np.linspace(-1e39, 1e39, n)   # (float32 overflows to inf at the ends)
    counter = DeleterCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        got = to_jax(make_capsule(src[::2], counter=counter))
    assert counter.calls == 1
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.asarray(got), src[::2].astype(np.float32))
    ints = np.arange(n, dtype=np.int64) * (1 << 33) + 5   # the low 32 bits kept, as NumPy wraps
    np.testing.assert_array_equal(np.asarray(to_jax(ints[::-3], narrow="ok")),
                                  ints[::-3].astype(np.int32))


LARGE = {   # past DL_COPY_PARALLEL_MIN: two threads copy a half each of a transpose
    "x.T": lambda a: a.reshape(1024, -1).T,
    "NCHW->NHWC": lambda a: a.reshape(2, 8, 256, -1).transpose(0, 2, 3, 1),
    "5-axis": lambda a: a.reshape(4, 8, 16, 32, -1).transpose(4, 1, 3, 0, 2),
    "reversed": lambda a: a.reshape(1024, -1)[::-1, ::-1],
    "every other column": lambda a: a.reshape(1024, -1)[:, ::2],
    "transposed slice": lambda a: a.reshape(1024, -1)[3:900, 5:].T,
    "dense, misaligned": lambda a: a[1:],
}


@pytest.mark.parametrize("memory", ["as malloc gives it", "reused"])
@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64", "complex128"])
@pytest.mark.parametrize("layout", sorted(LARGE))
def test_large_copies_in_two_halves(layout, dtype, memory):
    """Copies of 4 MiB and more (two threads for a transpose, cache tiles, streaming stores) give the
    values NumPy's copy gives, narrowed as JAX narrows, into fresh pages and into memory
    malloc had before (streamed: glibc's malloc keeps what is freed, as the copies
    benchmark has it)."""
    import contextlib
    from dlinspect.bench.copies import _kept_memory
    base = (np.arange((16 << 20) // np.dtype(dtype).itemsize) * 7 % 251).astype(dtype)
    x = LARGE[layout](base)
    with _kept_memory() if memory == "reused" else contextlib.nullcontext(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        if memory == "reused":
            to_jax(x).block_until_ready()   # (its memory, freed, is the next copy's)
        got = to_jax(x)
    want = x.astype(jax.dtypes.canonicalize_dtype(x.dtype))
    np.testing.assert_array_equal(np.asarray(got + 0), want)   # (computed by JAX)


def _large_copy_checked(seed):
    """to_jax of a 16 MiB transpose of values drawn from ``seed``: whether ``got + 0``,
    computed by JAX, holds NumPy's values of it."""
    x = np.random.default_rng(seed).integers(0, 251, (2048, 2048)).astype(np.float32).T
    return bool(np.array_equal(np.asarray(to_jax(x) + 0), x))


def test_large_copies_from_many_threads_at_once():
    """Threads that copy at once share the one worker: one has it, the others copy their
    copy whole; every value is right."""
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(_large_copy_checked, range(12)))



@pytest.mark.parametrize("files, cpus", [
    ({"cpu.max": "150000 100000\n"}, 2),   # cgroup v2: 1.5 CPUs of quota
    ({"cpu.max": "50000 100000\n"}, 1),
    ({"cpu.max": "max 100000\n"}, None),   # no quota
    ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),   # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),   # no cgroup file at all (macOS, Windows, a bare process)
])
def test_the_cpu_quota_a_container_sets(tmp_path, files, cpus):
    from dlinspect._core import cgroup_cpus
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpus(str(tmp_path)) == cpus


_THREADS_OF_A_LARGE_COPY = """
import os, sys, numpy as np, dlinspect
from dlinspect._core import copy_threads
def threads():
    return len(os.listdir("/proc/self/task"))
base = (np.arange(1 << 22, dtype=np.float32) % 251).reshape(2048, 2048)   # 16 MiB
x = {x}   # copied
before = threads()
y = dlinspect.to_jax(x)
assert np.array_equal(np.asarray(y + 0), x)
print(copy_threads(), threads() - before)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.parametrize("asked", ["1", "2"])
def test_copy_threads_as_asked_and_stopped_at_exit(asked):
    """DLINSPECT_COPY_THREADS=1 copies on the caller's thread alone (no worker started), 2
    with one worker thread; either way the process ends at once (the worker stopped at
    exit) with the values right."""
    import subprocess
    import sys
    env = dict(os.environ, DLINSPECT_COPY_THREADS=asked, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _THREADS_OF_A_LARGE_COPY.format(x="base.T")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads, started = map(int, proc.stdout.split()[-2:])
    assert threads == int(asked)
    assert started >= threads - 1   # (jax may start threads of its own on the first put)
    if asked == "1":
        # the same copy with the worker allowed starts one thread more than without it
        env["DLINSPECT_COPY_THREADS"] = "2"
        two = subprocess.run([sys.executable, "-c", _THREADS_OF_A_LARGE_COPY.format(x="base.T")],
                             env=env, capture_output=True, text=True, timeout=120)
        assert int(two.stdout.split()[-1]) == started + 1, (two.stdout, proc.stdout)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.parametrize("x", ["base[::-1]", "base.ravel()[1:]", "np.broadcast_to(base[:1], base.shape)"])
def test_a_copy_of_rows_runs_on_the_callers_thread(x):
    """A copy of rows (reversed, misaligned, broadcast) runs at memory speed on one
    thread: with two threads allowed it starts no more threads than with one, and its
    values are right."""
    import subprocess
    import sys
    started = []
    for asked in ("1", "2"):
        env = dict(os.environ, DLINSPECT_COPY_THREADS=asked, JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-c", _THREADS_OF_A_LARGE_COPY.format(x=x)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        started.append(int(proc.stdout.split()[-1]))
    assert started[0] == started[1], started
