"""NumPy memory: a header only where DLPack says exactly what the memory is (issue 16).

Every NumPy dtype kind x byte order x stride pattern, checked against NumPy's own values:
``to_host`` gives NumPy's values, ``to_jax`` gives ``jnp.asarray``'s, ``plan`` says what
happens (zero-copy exactly when the memory is shared, "error" exactly when it raises), and
``peek`` either describes the memory exactly or says why it cannot. Non-numeric arrays
(str, bytes, object, datetime, structured) are leaves kept as they are.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")

import jax.numpy as jnp  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import (  # noqa: E402
    CopyRequiredError,
    DLInspectWarning,
    NotDescribableError,
    NotNumericError,
    UnsupportedDTypeError,
    peek,
    plan,
    to_host,
    to_jax,
)
from dlinspect import _core  # noqa: E402

NUMERIC = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"]
ML = [n for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int4", "uint4",
                  "int2", "uint2", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
      if hasattr(ml_dtypes, n)]
NOT_NUMERIC = ["<U3", "S2", "O", "M8[s]", "m8[ms]", "V4", "i4,f4"]
ORDERS = ["=", "<", ">"]
PATTERNS = ["c", "step", "reversed", "T", "F", "record", "record-reversed", "broadcast", "0d",
            "empty"]


def dtype_of(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if name in ML else np.dtype(name)


def values(dt: np.dtype, n: int) -> np.ndarray:
    """``n`` values every dtype holds exactly (small integers; 0/1 for 1- and 2-bit)."""
    base = np.arange(n) % (2 if dt.name in ("bool", "int2", "uint2", "int1", "uint1") else 5)
    if dt.name.startswith(("int", "float4", "float6")) and dt.name not in ("int8",):
        base = base - 1      # negative values where the type has them
    if dt.kind == "u" or dt.name.startswith("uint"):
        base = np.abs(base)
    return base.astype(np.float64 if dt.kind in "fcV" else np.int64).astype(dt)


def make(name: str, order: str, pattern: str, n: int) -> np.ndarray:
    native = dtype_of(name)
    dt = native.newbyteorder(order) if native.itemsize > 1 and name not in ML else native
    src = values(native, 4 * n * n + 4).astype(dt)
    if pattern == "c":
        return src[: n * n].reshape(n, n)
    if pattern == "step":
        return src[::2]
    if pattern == "reversed":
        return src[::-1]
    if pattern == "T":
        return src[: n * n].reshape(n, n).T
    if pattern == "F":
        return np.asfortranarray(src[: n * n].reshape(n, n))
    if pattern.startswith("record"):
        rec = np.zeros(len(src), dtype=[("pad", "i1"), ("v", dt)])   # packed: odd strides
        rec["v"] = src
        return rec["v"][::-1] if pattern == "record-reversed" else rec["v"]
    if pattern == "broadcast":
        return np.broadcast_to(src[:n], (3, n))
    if pattern == "0d":
        return src[1:2].reshape(())
    return src[:0].reshape(0, n)


def describable(x: np.ndarray) -> bool:
    """What DLPack can say exactly (the issue's rule, written independently)."""
    if not x.dtype.isnative:
        return False
    return x.size <= 1 or all(s % x.itemsize == 0 for e, s in zip(x.shape, x.strides) if e > 1)


def expected_jax(x: np.ndarray) -> np.ndarray | None:
    """What JAX itself makes of ``x``'s values (None where JAX cannot hold its dtype).

    From a native-order copy: ``jnp.asarray`` refuses some byte-swapped arrays
    (">i2": "Error interpreting argument"), which dlinspect copies (README)."""
    try:
        return np.asarray(jnp.asarray(np.array(x, x.dtype.newbyteorder("="), order="C")))
    except Exception:
        return None


def shares(out, x: np.ndarray) -> bool:
    if x.size == 0:
        return False
    ptr = out.unsafe_buffer_pointer() if isinstance(out, jax.Array) else out.ctypes.data
    lo = x.ctypes.data + sum(min(0, (e - 1) * s) for e, s in zip(x.shape, x.strides))
    hi = x.ctypes.data + sum(max(0, (e - 1) * s) for e, s in zip(x.shape, x.strides))
    return lo <= ptr <= hi + x.itemsize


def same(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    if got.dtype.newbyteorder("=") != want.dtype.newbyteorder("="):
        # by value where NumPy has no common cast (ml_dtypes against narrowed JAX dtypes)
        wide = np.complex128 if "complex" in got.dtype.name + want.dtype.name else np.float64
        got, want = got.astype(wide), want.astype(wide)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(name=st.sampled_from(NUMERIC + ML), order=st.sampled_from(ORDERS),
       pattern=st.sampled_from(PATTERNS), n=st.integers(1, 4), x64=st.booleans())
def test_numeric_memory_every_route(name, order, pattern, n, x64):
    x = make(name, order, pattern, n)
    exact = describable(x)

    # peek: an exact header, or NotDescribableError saying why; never a guess.
    if exact:
        info = peek(x)
        assert info.shape == x.shape and info.dtype_name == x.dtype.name
        assert all(b == s for e, b, s in zip(x.shape, info.byte_strides, x.strides) if e > 1)
        assert info.data_ptr == x.ctypes.data or x.size == 0
        _core.capsule_of(x)   # an exact header of dlinspect's own (ValueError otherwise)
    else:
        with pytest.raises(NotDescribableError) as caught:
            peek(x)
        reason = "endian" if not x.dtype.isnative else "multiple of"
        assert reason in str(caught.value) and caught.value.array is x
        assert caught.value.why in str(caught.value)   # NumPy copies it (NotDescribableError)

    # to_host: NumPy's own values, viewed exactly when DLPack can describe the memory.
    host_plan = plan(x, target="host")
    if host_plan.kind == "error":
        with pytest.raises(type(host_plan.error)):
            to_host(x)
    else:
        got = to_host(x)
        same(got, x)
        assert host_plan.zero_copy == shares(got, x) or x.size == 0
        assert host_plan.zero_copy or not exact or x.size == 0 or x.dtype.name.startswith("float6")
    with pytest.raises((CopyRequiredError, UnsupportedDTypeError)) if not exact else _nothing():
        to_host(x, copy=False)

    # to_jax: jnp.asarray's values; plan says what happens.
    with _x64(x64), warnings.catch_warnings():
        warnings.simplefilter("ignore", DLInspectWarning)
        want = expected_jax(x)
        route = plan(x)
        if route.info is not None and route.info.source == "ndarray":   # no export: its fields
            assert _header(route.info) == _header(peek(x))
            assert peek(x).read_only in (None, route.info.read_only)
        if want is None:
            assert route.kind == "error" and isinstance(route.error, UnsupportedDTypeError)
            with pytest.raises(UnsupportedDTypeError):
                to_jax(x)
            return
        assert route.kind != "error", route.reason
        got = to_jax(x)
        assert isinstance(got, jax.Array) and got.dtype == want.dtype
        same(got, want)
        assert route.zero_copy == shares(got, x) or x.size == 0
        if not exact:
            assert route.kind == "copy" and "DLPack" in route.reason
            with pytest.raises(CopyRequiredError):
                to_jax(x, copy=False)
            assert plan(x, copy=False).kind == "error"


def _header(info) -> tuple:
    """What a header says of the memory (not where it came from: a capsule or not), but
    read_only, which NumPy < 2's "dltensor" capsule cannot say (None)."""
    return (info.shape, info.strides, info.dtype_name, info.data_ptr, info.device)


def test_an_array_jax_takes_itself_is_read_without_an_export():
    """An aligned row-major array the batched put takes as it is is decided from its own fields
    (source "ndarray": no capsule made), with the header its export gives; others are exported."""
    x = dlinspect.testing.aligned_array(np.arange(12.0).reshape(3, 4), np.float32)
    info = plan(x).info
    assert (info.source, info.capsule_name, info.version) == ("ndarray", None, None)
    assert _header(info) == _header(peek(x)) and info.read_only is False
    assert peek(x).read_only in (None, False)   # (None: NumPy < 2 exports a "dltensor" capsule)
    got = to_jax(x)
    assert plan(x).zero_copy and shares(got, x)
    same(jax.jit(lambda a: a * 2 + 1)(got), np.asarray(x) * 2 + 1)
    assert float((got + 0)[2, 3]) == 11.0 and float(got.sum()) == 66.0
    frozen = np.arange(4.0, dtype=np.float32)
    frozen.flags.writeable = False   # (read-only: its export says so; readonly="share" views it)
    shared = plan(frozen, readonly="share").info
    assert shared.read_only is True and _header(shared) == _header(peek(frozen))
    for other in (x[:, ::2], x.astype(">f4"), np.arange(3, dtype=np.float64)):
        assert plan(other).info is None or plan(other).info.source != "ndarray"


@pytest.mark.slow
def test_empty_arrays_of_every_dtype():
    """An empty array of every dtype, with x64 off and on: ``to_jax`` gives an empty
    ``jax.Array`` of ``jnp.asarray``'s dtype, or the error ``plan`` names. In a child
    process: making an empty array with ``jnp.zeros`` aborted the process for float6
    (XLA:CPU of jaxlib 0.12.0.1 compiles no fill for it), found by the property test."""
    code = textwrap.dedent(f"""
        import warnings, numpy as np, ml_dtypes, jax, jax.numpy as jnp, dlinspect
        warnings.simplefilter("ignore")
        for x64 in (False, True):
            jax.config.update("jax_enable_x64", x64)
            for name in {NUMERIC + ML!r}:
                dt = np.dtype(getattr(ml_dtypes, name, None) or name)
                for shape in ((0,), (2, 0, 3)):
                    x = np.empty(shape, dt)
                    route = dlinspect.plan(x)
                    if route.kind == "error":
                        try:
                            dlinspect.to_jax(x)
                        except type(route.error):
                            continue
                        raise AssertionError(("no error", name, shape))
                    y = dlinspect.to_jax(x)
                    want = jnp.asarray(np.empty(shape, dt)).dtype
                    assert (y.shape, y.dtype) == (shape, want), (name, shape, y.dtype, want)
                    assert route.kind == "zero-copy", (name, route.kind)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("dtype", NOT_NUMERIC)
@pytest.mark.parametrize("order", ORDERS)
def test_non_numeric_arrays_are_leaves(dtype, order):
    dt = np.dtype(dtype)
    if dt.kind in "UMm" and order != "=":
        dt = dt.newbyteorder(order)
    x = np.zeros(3, dt)
    assert not dlinspect._core.is_tensor(x)
    assert to_jax(x) is x and to_jax({"col": x})["col"] is x
    assert plan(x).kind == "untouched" and plan({"col": x})["col"].kind == "untouched"
    assert to_jax([x, np.ones(2, np.float32)])[0] is x
    with pytest.raises(NotNumericError, match="not a numeric tensor"):
        peek(x)
    with pytest.raises(NotNumericError):
        to_host(x)
    with pytest.raises(dlinspect.NotDLPackError, match=r"^\['col'\]"):
        to_jax({"col": x}, leaves="raise")


def test_examples_of_the_issue():
    # Byte-swapped: values, and a view written through never corrupts the caller's array.
    be = np.arange(4, dtype=">f4")
    np.testing.assert_array_equal(to_host(be), [0, 1, 2, 3])
    out = to_host(be)
    out[0] = 99
    assert be[0] == 0
    np.testing.assert_array_equal(np.asarray(to_jax(be)), [0, 1, 2, 3])
    # A field of a packed record array (stride 5 for float32), and reversed.
    rec = np.zeros(6, dtype=[("a", "i1"), ("f", "<f4")])
    rec["f"] = np.arange(6)
    np.testing.assert_array_equal(to_host(rec["f"]), np.arange(6))
    np.testing.assert_array_equal(np.asarray(to_jax(rec["f"][::-1])), np.arange(6)[::-1])
    assert plan(rec["f"]).kind == "copy"
    # ml_dtypes sub-byte types: one element per byte, IS_SUBBYTE_TYPE_PADDED.
    i4 = np.array([-8, 7, 1, -1], ml_dtypes.int4)
    np.testing.assert_array_equal(to_host(i4).astype(int), [-8, 7, 1, -1])
    info = peek(i4)
    assert info.flags & _core.FLAG_IS_SUBBYTE_TYPE_PADDED and info.nbytes == 4
    got = to_jax(i4)
    assert got.dtype == i4.dtype and np.asarray(got).astype(int).tolist() == [-8, 7, 1, -1]
    if hasattr(ml_dtypes, "float6_e2m3fn"):
        f6 = np.array([1.0, 0.5, -2.0], ml_dtypes.float6_e2m3fn)
        np.testing.assert_array_equal(to_host(f6).astype(float), [1.0, 0.5, -2.0])


def test_odd_strides_reversed_read_nothing_outside_the_array():
    # Reversed odd-stride fields once read below the array (a segfault at 10M rows):
    # the copy must come from NumPy, inside the array's own bounds.
    rec = np.zeros(200_000, dtype=[("a", "i1"), ("f", "<f4")])
    rec["f"] = np.arange(200_000)
    out = to_host(rec["f"][::-1])
    assert out[0] == 199_999 and out[-1] == 0
    np.testing.assert_array_equal(np.asarray(to_jax(rec["f"][::-1]))[:3], [199_999, 199_998, 199_997])


def test_capsule_of_refuses_a_false_header():
    with pytest.raises(ValueError, match="endian"):
        _core.capsule_of(np.arange(3, dtype=">i4"))
    rec = np.zeros(3, dtype=[("a", "i1"), ("f", "<f4")])
    with pytest.raises(ValueError, match="multiple"):
        _core.capsule_of(rec["f"])


def test_masked_array_exports_its_data():
    # Documented: NumPy's __dlpack__ exports a masked array's data without the mask.
    m = np.ma.masked_array(np.arange(3, dtype=np.float32), mask=[0, 1, 0])
    np.testing.assert_array_equal(np.asarray(to_jax(m)), [0, 1, 2])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _x64(on: bool):
    from _versions import enable_x64
    return enable_x64(on)
