"""Peer suite: the intent of NumPy's own DLPack tests (numpy/_core/tests/test_dlpack.py),
with dlinspect as the consumer instead of ``numpy.from_dlpack``.

Each test names the NumPy check it carries (``peer: test_...``). What NumPy checks there:
dtypes round trip with their values, producers that only know the legacy protocol
(``__dlpack__(stream=None)``), reference counts held by exports and by imported arrays,
strides that are not whole elements, non-numeric and byte-swapped dtypes, non-contiguous
views, up to 32 dimensions, the device, destructors running while an exception unwinds,
read-only and writeable results, 0-d arrays, size-1 axes with odd strides, ``copy`` and
``device`` keywords. dlinspect's result is checked against NumPy's own array: values,
dtype, shape, and shared memory (data pointers) exactly where ``plan(x).kind`` is
"zero-copy". Where dlinspect deliberately differs from NumPy, a comment says so.
"""

from __future__ import annotations

import gc
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import _core as djax  # noqa: E402
from dlinspect import (  # noqa: E402
    CapsuleConsumedError,
    CopyRequiredError,
    DLInspectWarning,
    Need,
    NotDescribableError,
    NotDLPackError,
    NotNumericError,
    ProducerError,
    UnsupportedDeviceError,
    UnsupportedDTypeError,
)
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_array, aligned_empty  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/_versions.py
from _versions import NUMPY_VERSIONED, enable_x64  # noqa: E402
from peer_checks import NUMPY_DTYPES, to_jax_checked  # noqa: E402

ML_DTYPES = ["bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
             "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
             "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int2", "uint2", "int4", "uint4"]


class OldDLPack(np.ndarray):
    """A producer that only knows the DLPack 0.x protocol (NumPy's ``OldDLPack``)."""

    def __dlpack__(self, stream=None):
        return super().__dlpack__(stream=None)


def new_or_old(arr: np.ndarray, kind: str) -> np.ndarray:
    return arr if kind == "new" else arr.view(OldDLPack)


def values(shape, dtype, seed=0):
    """Small random values of ``dtype`` (NumPy's np.arange, spread over signs and kinds)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 10, shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(-5, 6, shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def numpy_capsule(x: np.ndarray, max_version):
    """``x.__dlpack__(max_version=max_version)`` where NumPy takes the keyword (>= 2.1); on an
    older NumPy, which refuses it (TypeError), its one export: a legacy capsule."""
    if NUMPY_VERSIONED:
        return x.__dlpack__(max_version=max_version)
    try:
        x.__dlpack__(max_version=max_version)
    except TypeError:
        return x.__dlpack__()
    raise AssertionError(f"NumPy {np.__version__} took max_version")


def copy_needed(values, dtype=np.float32) -> np.ndarray:
    """``values`` in memory JAX cannot view on this jaxlib, so that to_jax must copy: 4 bytes
    past a 64-byte boundary where XLA:CPU needs more alignment than that (as dlinspect
    probed it); on a jaxlib that views any alignment (0.4.30: cpu_align 1), every other
    element of a buffer (a gap in the strides), which no jaxlib views."""
    values = np.asarray(values)
    if djax.jax_target().cpu_align > 4:
        out = aligned_empty(values.shape, dtype, 64, offset=4)
    else:
        out = aligned_empty(values.shape + (2,), dtype, 64)[..., 0]
    out[...] = values
    return out


def as_comparable(a) -> np.ndarray:
    """ml_dtypes arrays compared through float32 (exact for all of them; NaN == NaN)."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.kind == "V" else a


# ---- dtypes ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["new", "old"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_passthrough_to_host(dtype, kind):
    """peer: test_dtype_passthrough (new and old producers): same dtype, same values; a
    host view shares the memory; peer: test_writeable (versioned exports are writeable,
    legacy ones read-only, as numpy.from_dlpack makes them)."""
    x = new_or_old(values((2, 3), dtype), kind)
    assert dlinspect.plan(x, "host").kind == "zero-copy"
    y = dlinspect.to_host(x)
    assert type(y) is np.ndarray
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y, x)
    assert y.ctypes.data == x.ctypes.data
    assert y.flags.writeable == (kind == "new" and NUMPY_VERSIONED)


@pytest.mark.parametrize("kind", ["new", "old"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_passthrough_to_jax(dtype, kind):
    """peer: test_dtype_passthrough, into JAX: the dtype JAX gives the values (jnp.asarray's:
    64-bit narrowed with x64 off, with a DLInspectWarning) and jnp.asarray's values; 64-byte
    aligned 32-bit data is shared."""
    x = new_or_old(aligned_array(values((2, 3), dtype), dtype), kind)
    with np.errstate(all="ignore"):
        expected = np.asarray(jnp.asarray(np.asarray(x)))
    route, y = to_jax_checked(x, x.ctypes.data)
    assert y.dtype == expected.dtype == jax.dtypes.canonicalize_dtype(dtype)
    np.testing.assert_array_equal(np.asarray(y), expected)
    narrowed = np.dtype(dtype) in (np.int64, np.uint64, np.float64, np.complex128)
    assert bool(route.needs & Need.NARROW) == narrowed
    assert route.kind == ("copy" if narrowed else "zero-copy")


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_passthrough_to_jax_x64(dtype):
    """peer: test_dtype_passthrough with JAX's x64 on: every dtype is kept and viewed."""
    x = aligned_array(values((5,), dtype), dtype)
    with enable_x64(True):
        route, y = to_jax_checked(x, x.ctypes.data)
        assert route.kind == "zero-copy"
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(y), x)


@pytest.mark.parametrize("name", ML_DTYPES)
def test_ml_dtypes(name, ml_dtypes):
    """peer: test_dtype_passthrough extended to ml_dtypes (NumPy's own registry tests map
    such dtypes to DLPack codes).

    deliberate difference from NumPy: numpy.from_dlpack refuses ml_dtypes arrays (NumPy does
    not export them); dlinspect describes their memory itself and views it in NumPy, and
    into JAX where JAX holds the dtype."""
    # deliberate difference from NumPy: numpy.from_dlpack refuses ml_dtypes arrays; dlinspect
    # describes their memory itself
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    src = [0, 1, -1, 1, 0, -2] if name.startswith("int") else [0, 1, 2, 3, 1, 0]
    if dt.kind == "V" and "int" not in name:
        src = [0.5, 1, 2, 0.25, 1, 4]
    x = aligned_array(np.array(src).reshape(2, 3), dt)
    h = dlinspect.to_host(x)
    assert h.dtype == dt and h.ctypes.data == x.ctypes.data
    np.testing.assert_array_equal(as_comparable(h), as_comparable(x))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = np.asarray(jnp.asarray(x))
    except Exception:
        expected = None   # JAX has no such arrays here (float6 on this jaxlib)
    route, y = to_jax_checked(x, x.ctypes.data)
    if expected is None:
        assert route.kind == "error" and isinstance(route.error, UnsupportedDTypeError)
        assert isinstance(route.error, BufferError)
        return
    assert y.dtype == dt
    np.testing.assert_array_equal(as_comparable(y), as_comparable(expected))


# ---- reference counts and lifetimes ---------------------------------------------------------

@pytest.mark.parametrize("max_version", [None, (0, 0), (1, 0), (100, 3)])
def test_dunder_dlpack_refcount(max_version):
    """peer: test_dunder_dlpack_refcount: a capsule holds one reference to its array; peek
    and plan of the capsule (and of the array) take none and consume nothing."""
    x = np.arange(5)
    base = sys.getrefcount(x)
    for _ in range(3):
        dlinspect.peek(x), dlinspect.plan(x), dlinspect.explain(x)
    assert sys.getrefcount(x) == base
    cap = numpy_capsule(x, max_version)
    assert sys.getrefcount(x) == base + 1
    info = dlinspect.peek(cap)
    dlinspect.plan(cap)
    assert info.capsule_name == ("dltensor_versioned" if max_version and max_version[0] >= 1
                                 and NUMPY_VERSIONED else "dltensor")
    assert dlinspect.peek(cap).capsule_name == info.capsule_name   # still unconsumed
    del cap
    assert sys.getrefcount(x) == base


@pytest.mark.parametrize("kind", ["new", "old"])
@pytest.mark.parametrize("target", ["host", "jax"])
def test_from_dlpack_refcount(kind, target):
    """peer: test_from_dlpack_refcount: a zero-copy result holds exactly one reference to
    the array, released when the result dies."""
    x = new_or_old(aligned_array(np.arange(5), np.int32), kind)
    base = sys.getrefcount(x)
    y = dlinspect.to_host(x) if target == "host" else dlinspect.to_jax(x)
    assert dlinspect.plan(x, target).kind == "zero-copy"
    assert sys.getrefcount(x) == base + 1
    del y
    gc.collect()
    assert sys.getrefcount(x) == base


@pytest.mark.parametrize("call", ["to_host copy=True", "to_jax copy=True", "to_jax copy needed",
                                  "to_jax copy=False error", "to_host copy=False error"])
def test_copies_and_errors_hold_no_reference(call):
    """peer: test_from_dlpack_refcount, for the routes that do not share memory: once the
    call returns (or raises), the array's reference count is what it was. ("copy needed":
    memory this jaxlib cannot view, misaligned or strided: see copy_needed.)"""
    if "needed" in call or "jax copy=False" in call:
        x = copy_needed(np.arange(6))
        assert dlinspect.plan(x).kind == "copy"
    else:
        x = aligned_array(np.arange(6), np.float32)
    src = FakeProducer(x, (D.kDLROCM, 0)) if "to_host copy=False" in call else x
    base = sys.getrefcount(x)
    if "error" in call:
        with pytest.raises(CopyRequiredError):
            (dlinspect.to_host if "host" in call else dlinspect.to_jax)(src, copy=False)
    else:
        y = (dlinspect.to_host(x, copy=True) if "host" in call else
             dlinspect.to_jax(x, copy=True if "copy" in call else None))
        np.testing.assert_array_equal(np.asarray(y), x)
    assert sys.getrefcount(x) == base


def _export_then_raise(counter, max_version):
    cap = FakeProducer(np.arange(5.0), counter=counter).__dlpack__(max_version=max_version)
    dlinspect.peek(cap)
    dlinspect.plan(cap)
    raise RuntimeError


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_dlpack_destructor_exception(max_version):
    """peer: test_dlpack_destructor_exception: an unconsumed capsule whose frame unwinds with
    an exception is freed (its deleter runs once), after dlinspect read it."""
    counter = DeleterCounter()
    gc.disable()
    try:
        with pytest.raises(RuntimeError):
            _export_then_raise(counter, max_version)
    finally:
        gc.enable()
    assert counter.calls == 1


def test_failed_route_leaves_capsule_unconsumed():
    """peer: test_dlpack_destructor_exception / refcount, on dlinspect's error path: a route
    that raises leaves the caller's capsule as it was, to be consumed later."""
    x = copy_needed(np.arange(6).reshape(2, 3))
    counter = DeleterCounter()
    cap = FakeProducer(x, counter=counter).__dlpack__(max_version=(1, 0))
    with pytest.raises(CopyRequiredError):
        dlinspect.to_jax(cap, copy=False)
    assert dlinspect.peek(cap).capsule_name == "dltensor_versioned" and counter.calls == 0
    y = dlinspect.to_jax(cap)
    np.testing.assert_array_equal(np.asarray(y), x)
    assert counter.calls == 1   # copied (misaligned or strided): the source is released at once
    with pytest.raises(CapsuleConsumedError):
        dlinspect.to_host(cap)


# ---- what NumPy refuses ----------------------------------------------------------------------

class RefusingExport(np.ndarray):
    """An ndarray subclass that refuses DLPack export itself (say, its buffer is not ready)."""

    def __dlpack__(self, **kwargs):
        raise BufferError("RefusingExport arrays cannot be exported yet")


def test_subclass_export_is_used():
    """peer: new_and_old_dlpack's OldDLPack: a subclass's own __dlpack__ is the export taken
    (here one that exports other values than its buffer holds: those values arrive)."""
    class Tenfold(np.ndarray):
        def __dlpack__(self, **kwargs):
            return (np.asarray(self) * 10).__dlpack__(**kwargs)

    x = aligned_array(np.arange(4), np.float32).view(Tenfold)
    np.testing.assert_array_equal(np.from_dlpack(x), np.arange(4) * 10)
    np.testing.assert_array_equal(dlinspect.to_host(x), np.arange(4) * 10)
    np.testing.assert_array_equal(np.asarray(dlinspect.to_jax(x)), np.arange(4) * 10)


def test_subclass_refusal_is_respected():
    """peer: test_readonly / new_and_old_dlpack: the producer's __dlpack__ decides; where a
    subclass's own __dlpack__ refuses, numpy.from_dlpack raises its BufferError, and dlinspect
    should raise ProducerError (a BufferError) in its words, as for any other producer."""
    x = aligned_array(np.arange(4), np.float32).view(RefusingExport)
    with pytest.raises(BufferError):
        np.from_dlpack(x)
    assert dlinspect.plan(x).kind == "error"
    for fn in (dlinspect.peek, dlinspect.to_host, dlinspect.to_jax):
        with pytest.raises(ProducerError, match="cannot be exported yet"):
            fn(x)



def test_strides_not_multiple_of_itemsize():
    """peer: test_strides_not_multiple_of_itemsize.

    deliberate difference from NumPy: numpy.from_dlpack raises BufferError for a field of a
    packed record array; dlinspect's peek raises NotDescribableError (a BufferError, too), but
    to_host and to_jax copy the values with NumPy (copy=False: CopyRequiredError)."""
    # deliberate difference from NumPy: BufferError from from_dlpack; dlinspect copies (peek:
    # NotDescribableError)
    z = np.zeros((5,), dtype=np.dtype([("int", np.int32), ("char", np.int8)]))
    z["int"] = np.arange(5) * 7
    field = z["int"]
    with pytest.raises(NotDescribableError) as info:
        dlinspect.peek(field)
    assert isinstance(info.value, BufferError)
    for target, fn in (("host", dlinspect.to_host), ("jax", dlinspect.to_jax)):
        assert dlinspect.plan(field, target).kind == "copy"
        out = fn(field)
        np.testing.assert_array_equal(np.asarray(out), field)
        assert out.dtype == np.int32
        with pytest.raises(CopyRequiredError):
            fn(field, copy=False)
        assert dlinspect.plan(field, target, copy=False).kind == "error"


@pytest.mark.parametrize("value", [np.datetime64("2021-05-27"), np.timedelta64(3, "s"),
                                   np.array(["a", "bc"]), np.array([b"x"]),
                                   np.array([None, 1], dtype=object)],
                         ids=["datetime64", "timedelta64", "str", "bytes", "object"])
def test_invalid_dtype(value):
    """peer: test_invalid_dtype (datetime64) and the registry's string dtypes.

    deliberate difference from NumPy: numpy.from_dlpack raises BufferError; dlinspect's peek
    and to_host raise NotNumericError (a TypeError: not a DLPack tensor at all), and to_jax
    keeps such an array as a pytree leaf, unchanged (leaves="raise" refuses it)."""
    # deliberate difference from NumPy: BufferError; dlinspect: NotNumericError (a TypeError),
    # and to_jax keeps the array as a leaf
    x = np.asarray(value)
    with pytest.raises(NotNumericError) as info:
        dlinspect.peek(x)
    assert isinstance(info.value, TypeError)
    with pytest.raises(NotNumericError):
        dlinspect.to_host(x)
    assert dlinspect.to_jax(x) is x
    assert dlinspect.plan(x).kind == "untouched"
    with pytest.raises(NotDLPackError):
        dlinspect.to_jax(x, leaves="raise")
    assert isinstance(dlinspect.plan(x, leaves="raise").error, NotDLPackError)


@pytest.mark.parametrize("dtype", ["int64", "float32", "complex64", "int16"])
def test_invalid_byte_swapping(dtype):
    """peer: test_invalid_byte_swapping.

    deliberate difference from NumPy: numpy.from_dlpack raises BufferError; dlinspect's peek
    raises NotDescribableError (a BufferError), while to_host and to_jax copy into native byte
    order with the right values."""
    # deliberate difference from NumPy: BufferError; dlinspect copies into native byte order
    # (peek: NotDescribableError)
    dt = np.dtype(dtype).newbyteorder()
    x = np.arange(5, dtype=dt)
    with pytest.raises(NotDescribableError) as info:
        dlinspect.peek(x)
    assert isinstance(info.value, BufferError)
    h = dlinspect.to_host(x)
    assert h.dtype == dt.newbyteorder("=") and h.dtype.isnative
    np.testing.assert_array_equal(h, x)
    route, y = to_jax_checked(x, None)
    assert route.kind == "copy"
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.asarray(x.astype(h.dtype))))
    with pytest.raises(CopyRequiredError):
        dlinspect.to_host(x, copy=False)


# ---- layouts -----------------------------------------------------------------------------

NON_CONTIGUOUS = {
    "x[0]": lambda x: x[0],
    "x[:, 0]": lambda x: x[:, 0],
    "x[1, :]": lambda x: x[1, :],
    "x[1]": lambda x: x[1],
    "diagonal().copy()": lambda x: np.diagonal(x).copy(),
    "x.T": lambda x: x.T,
    "x[::2, 1::2]": lambda x: x[::2, 1::2],
    "x[::-1]": lambda x: x[::-1],
    "x[:, ::-2]": lambda x: x[:, ::-2],
}


@pytest.mark.parametrize("view", list(NON_CONTIGUOUS))
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_non_contiguous(view, dtype):
    """peer: test_non_contiguous: rows, columns, diagonal copies (plus transposes, gaps and
    negative strides, which NumPy exports too): to_host views the same memory with the same
    strides; to_jax gives the same values, sharing memory exactly where plan says so: a
    layout change is needed for gaps and negative strides, and for a transposed (compact, not
    C-ordered) view where this jaxlib reads every layout as row-major (the permuted_ok
    dlinspect probed)."""
    base = aligned_array(values((5, 5), dtype), dtype)
    y = NON_CONTIGUOUS[view](base)
    h = dlinspect.to_host(y)
    np.testing.assert_array_equal(h, y)
    assert h.ctypes.data == y.ctypes.data
    if y.size > 1 and y.ndim == 1 or min(y.shape) > 1:
        assert h.strides == y.strides
    route, j = to_jax_checked(y, y.ctypes.data)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.asarray(j), np.asarray(jnp.asarray(y)))
    info = dlinspect.peek(y)
    permuted = not y.flags.c_contiguous and not djax.jax_target().permuted_ok
    assert bool(route.needs & Need.LAYOUT) == (info.has_negative_strides or not info.is_compact
                                               or permuted)


@pytest.mark.parametrize("ndim", list(range(33)) + [48, dlinspect.MAX_NDIM])
def test_higher_dims(ndim):
    """peer: test_higher_dims (0 to 32 dimensions of extent 1), up to dlinspect.MAX_NDIM (or
    as many as this NumPy's arrays hold: 32 before NumPy 2.0, 64 since)."""
    shape = (1,) * ndim
    try:
        np.empty(shape)
    except ValueError as exc:   # "maximum supported dimension for an ndarray is 32, found 48"
        assert ndim > 32
        pytest.skip(f"NumPy {np.__version__} holds no {ndim}-d array ({exc})")
    x = aligned_array(np.zeros(shape), np.float32)
    assert dlinspect.peek(x).shape == shape
    assert dlinspect.to_host(x).shape == shape
    route, y = to_jax_checked(x, x.ctypes.data)
    assert y.shape == shape and route.kind == "zero-copy"


def test_dlpack_device():
    """peer: test_dlpack_device: (kDLCPU, 0) for the array, its to_host result and a slice of
    that; to_jax puts it on JAX's CPU device."""
    x = np.arange(5)
    assert dlinspect.peek(x).device == (D.kDLCPU, 0)
    y = dlinspect.to_host(x)
    assert y.__dlpack_device__() == (1, 0)
    assert y[::2].__dlpack_device__() == (1, 0)
    assert dlinspect.peek(y[::2]).device == (D.kDLCPU, 0)
    route = dlinspect.plan(x)
    assert route.jax_device == jax.devices("cpu")[0]
    with pytest.warns(DLInspectWarning):
        assert dlinspect.to_jax(x).devices() == {jax.devices("cpu")[0]}


# ---- read-only, writeable ----------------------------------------------------------------

def test_readonly():
    """peer: test_readonly: a read-only array's host view is read-only.

    deliberate difference from NumPy: x.__dlpack__() without max_version refuses a read-only
    array (BufferError); dlinspect takes it either way: to_host gives a read-only view of the
    same memory, to_jax copies it (readonly="share" views it), copy=False is refused."""
    # deliberate difference from NumPy: __dlpack__() without max_version refuses read-only
    # arrays; dlinspect views (host) or copies (JAX) them
    x = aligned_array(np.arange(5), np.float32)
    x.flags.writeable = False
    if NUMPY_VERSIONED:
        with pytest.raises(BufferError):
            x.__dlpack__()
    assert dlinspect.peek(x).read_only is True
    h = dlinspect.to_host(x)
    assert not h.flags.writeable and h.ctypes.data == x.ctypes.data
    route, y = to_jax_checked(x, x.ctypes.data)
    assert route.kind == "copy" and route.needs & Need.READ_ONLY
    np.testing.assert_array_equal(np.asarray(y), x)
    route, y = to_jax_checked(x, x.ctypes.data, readonly="share")
    assert route.kind == "zero-copy"
    with pytest.raises(CopyRequiredError):
        dlinspect.to_jax(x, copy=False)
    c = dlinspect.to_host(x, copy=True)
    assert c.flags.writeable and c.ctypes.data != x.ctypes.data


def test_readonly_legacy_producer():
    """peer: test_readonly with a producer that only speaks the legacy protocol.

    A subclass's own __dlpack__ is the producer: its refusal stands (dlinspect stands in
    only for numpy.ndarray's own export, as on NumPy < 2.1, covered by the oldest stack)."""
    x = aligned_array(np.arange(5), np.float32).view(OldDLPack)
    x.flags.writeable = False
    with pytest.raises(BufferError):
        x.__dlpack__()
    assert dlinspect.plan(x).kind == "error"
    for fn in (dlinspect.peek, dlinspect.to_host, dlinspect.to_jax):
        with pytest.raises(ProducerError, match="read"):
            fn(x)


def test_writeable_capsules():
    """peer: test_writeable, for bare capsules: versioned capsules of writeable arrays give
    writeable views; legacy capsules, which cannot say, read-only ones.

    deliberate difference from NumPy: numpy.from_dlpack takes no bare capsules."""
    # deliberate difference from NumPy: from_dlpack takes no bare capsules; dlinspect does
    x = np.arange(5.0)
    if NUMPY_VERSIONED:
        assert dlinspect.to_host(x.__dlpack__(max_version=(1, 0))).flags.writeable
    assert not dlinspect.to_host(x.__dlpack__()).flags.writeable


# ---- shapes ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.complex64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_ndim0(dtype):
    """peer: test_ndim0: a 0-d array keeps its value and its 0 dimensions."""
    x = np.array(values((), dtype))
    h = dlinspect.to_host(x)
    assert h.shape == () and h.dtype == x.dtype
    np.testing.assert_array_equal(h, x)
    route, y = to_jax_checked(x, x.ctypes.data)
    assert y.shape == ()
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.asarray(x)))


def test_size1dims_arrays():
    """peer: test_size1dims_arrays: F order with an odd stride on an axis of extent 1 (which
    constrains nothing: no layout change but the F order's own, where this jaxlib reads
    transposed layouts as row-major; its C-ordered twin needs none on any jaxlib)."""
    x = np.ndarray(dtype="f8", shape=(10, 5, 1), strides=(8, 80, 4),
                   buffer=np.ones(1000, dtype=np.uint8), order="F")
    x[...] = np.arange(50).reshape(5, 10).T[..., None]
    h = dlinspect.to_host(x)
    np.testing.assert_array_equal(h, x)
    assert h.ctypes.data == x.ctypes.data
    route, y = to_jax_checked(x, x.ctypes.data)
    np.testing.assert_array_equal(np.asarray(y), x.astype(np.float32))
    assert bool(route.needs & Need.LAYOUT) == (not djax.jax_target().permuted_ok)
    c = np.ndarray(dtype="f4", shape=(5, 10, 1), strides=(40, 4, 2),
                   buffer=np.ones(1000, dtype=np.uint8))
    c[...] = np.arange(50).reshape(5, 10, 1)
    route, y = to_jax_checked(c, c.ctypes.data)
    np.testing.assert_array_equal(np.asarray(y), c)
    assert not route.needs & Need.LAYOUT   # extent-1 axes constrain nothing


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0), (2, 0, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_], ids=lambda d: np.dtype(d).name)
def test_size0(shape, dtype):
    """peer: the empty arrays NumPy round-trips: shape and dtype kept, no copy planned."""
    x = np.zeros(shape, dtype)
    h = dlinspect.to_host(x)
    assert h.shape == shape and h.dtype == x.dtype
    route = dlinspect.plan(x)
    assert route.kind == "zero-copy" and route.needs & Need.EMPTY
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DLInspectWarning)
        y = dlinspect.to_jax(x, copy=False)
    assert y.shape == shape and y.dtype == jax.dtypes.canonicalize_dtype(dtype)


# ---- copy and device keywords ---------------------------------------------------------------

def test_copy():
    """peer: test_copy: copy=None and copy=False share memory, copy=True does not (for
    NumPy and for JAX, with 64-byte aligned memory that XLA:CPU can view)."""
    x = aligned_array(np.arange(5), np.int32)
    assert np.shares_memory(dlinspect.to_host(x), x)
    assert np.shares_memory(dlinspect.to_host(x, copy=False), x)
    c = dlinspect.to_host(x, copy=True)
    assert not np.shares_memory(c, x) and c.flags.writeable
    np.testing.assert_array_equal(c, x)
    for copy, shared in ((None, True), (False, True), (True, False)):
        route, y = to_jax_checked(x, x.ctypes.data, copy=copy)
        assert route.kind == ("zero-copy" if shared else "copy")
        np.testing.assert_array_equal(np.asarray(y), x)


@pytest.mark.parametrize("bad", [np.array([1, 2, 3]), "yes", 1, 0])
def test_dunder_dlpack_copy_argument(bad):
    """peer: test_dunder_dlpack_copy: copy must be None, True or False (NumPy raises
    ValueError for an array; dlinspect too, and also for truthy stand-ins)."""
    x = np.arange(5.0)
    for call in (lambda: dlinspect.to_host(x, copy=bad), lambda: dlinspect.to_jax(x, copy=bad),
                 lambda: dlinspect.plan(x, copy=bad)):
        with pytest.raises(ValueError):
            call()


def test_dunder_dlpack_stream():
    """peer: test_dunder_dlpack_stream: NumPy takes only stream=None; dlinspect asks a CPU
    producer with stream=None (and never another stream)."""
    p = FakeProducer(aligned_array(np.arange(4.0)))
    dlinspect.to_jax(p), dlinspect.to_host(p), dlinspect.peek(p)
    assert p.calls and all(call["stream"] is None for call in p.calls)


def test_device():
    """peer: test_device: a CPU destination works (device=None or JAX's CPU device); a device
    the memory is not on is refused with a BufferError where no copy may be made.

    deliberate difference from NumPy: numpy.from_dlpack(x, device="gpu") raises ValueError;
    dlinspect takes jax.Device objects and raises TypeError for a string."""
    # deliberate difference from NumPy: device='gpu' is a ValueError; dlinspect takes
    # jax.Device objects and raises TypeError for a string
    x = aligned_array(np.arange(5), np.float32)
    cpu = jax.devices("cpu")[0]
    for device in (None, cpu):
        route, y = to_jax_checked(x, x.ctypes.data, device=device)
        assert route.kind == "zero-copy" and y.devices() == {cpu}
    with pytest.raises(TypeError):
        dlinspect.to_jax(x, device="gpu")
    # Memory on a device neither JAX nor NumPy has here (NumPy: dl_device=(10, 0) refused).
    rocm = FakeProducer(np.arange(5, dtype=np.float32), (D.kDLROCM, 0))
    with pytest.raises(UnsupportedDeviceError) as info:
        dlinspect.to_jax(rocm, fallback="raise")
    assert isinstance(info.value, BufferError)
    with pytest.raises(CopyRequiredError):
        dlinspect.to_host(rocm, copy=False)
    assert dlinspect.plan(rocm, "host").kind == "host-fallback"
    np.testing.assert_array_equal(dlinspect.to_host(rocm), np.arange(5))
    assert {"dl_device": (1, 0), "copy": True}.items() <= rocm.calls[-1].items()


# ---- things that are not arrays -------------------------------------------------------------

@pytest.mark.parametrize("obj", [[1, 2, 3], 3, 2.5, None, object(), {"a": 1}],
                         ids=["list", "int", "float", "None", "object", "dict"])
def test_from_dlpack_of_non_arrays(obj):
    """peer: numpy.from_dlpack of an object without __dlpack__ is a TypeError/AttributeError.

    peek and to_host raise NotDLPackError (a TypeError). deliberate difference from NumPy:
    to_jax takes pytrees, so such an object is a leaf kept as it is (leaves="raise": refused)."""
    # deliberate difference from NumPy: from_dlpack of a non-array raises; dlinspect's to_jax
    # keeps non-tensor pytree leaves as they are
    with pytest.raises(NotDLPackError) as info:
        dlinspect.peek(obj)
    assert isinstance(info.value, TypeError)
    with pytest.raises(NotDLPackError):
        dlinspect.to_host(obj)
    out = dlinspect.to_jax(obj)
    assert out is obj or out == obj
    if obj is not None:
        with pytest.raises(NotDLPackError):
            dlinspect.to_jax(obj, leaves="raise")


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_bare_capsules(max_version):
    """peer: test_from_dlpack_refcount / the capsule half of the protocol.

    deliberate difference from NumPy: numpy.from_dlpack refuses a bare capsule; dlinspect takes
    it, consumes it exactly once, and names a second use CapsuleConsumedError (a ValueError)."""
    # deliberate difference from NumPy: from_dlpack refuses bare capsules; dlinspect takes them
    # (consumed exactly once)
    x = aligned_array(np.arange(6).reshape(2, 3), np.float32)
    base = sys.getrefcount(x)
    cap = numpy_capsule(x, max_version)
    route = dlinspect.plan(cap)
    assert route.kind == "zero-copy"
    y = dlinspect.to_jax(cap)
    assert y.unsafe_buffer_pointer() == x.ctypes.data
    with pytest.raises(CapsuleConsumedError) as info:
        dlinspect.to_jax(cap)
    assert isinstance(info.value, ValueError)
    assert dlinspect.plan(cap).kind == "error"
    del cap
    assert sys.getrefcount(x) == base + 1     # held by y only
    del y
    gc.collect()
    assert sys.getrefcount(x) == base
