"""pyarrow as a DLPack producer: primitive Arrays (1-D, with offsets) and Tensors.

pyarrow exports host memory (kDLCPU), always flagged read-only in a versioned capsule,
and refuses arrays with nulls, bit-packed booleans and non-primitive types.
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from interop_helpers import check, check_all, check_lifetime, check_no_leak, need, record_jax

pa = need("pyarrow", "pyarrow")

import dlinspect  # noqa: E402

NUMERIC = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64"]


def values(dtype, n=12):
    return (np.arange(n) * 3 - 7).astype(dtype) if dtype[0] in "if" else np.arange(n).astype(dtype)


def own(ref):
    """An Array in a buffer pyarrow allocated (64-byte aligned), not NumPy's."""
    return pa.concat_arrays([pa.array(ref)])


@pytest.mark.parametrize("dtype", NUMERIC)
def test_dtypes_pyarrow_allocated(dtype):
    ref = values(dtype)
    kinds = check_all("pyarrow", f"{dtype} array", lambda: own(ref), ref)
    x = own(ref)
    assert dlinspect.peek(x).read_only is True       # pyarrow flags every export read-only
    assert kinds[("host", ())] == "zero-copy"
    narrowed = dtype in ("int64", "uint64", "float64")
    assert kinds[("jax", ())] == "copy"              # read-only: copied unless readonly="share"
    assert kinds[("jax", (("readonly", "share"),))] == ("copy" if narrowed else "zero-copy")


@pytest.mark.parametrize("dtype", NUMERIC)
def test_dtypes_from_numpy(dtype):
    ref = values(dtype)
    check_all("pyarrow", f"{dtype} from numpy", lambda: pa.array(ref), ref)


@pytest.mark.parametrize("case", ["offset", "offset-aligned", "empty", "empty-slice", "length-1"])
def test_layouts_array(case):
    base = np.arange(64, dtype=np.float32)
    make, ref = {
        "offset": (lambda: pa.array(base).slice(3, 10), base[3:13]),
        "offset-aligned": (lambda: own(base).slice(16, 16), base[16:32]),
        "empty": (lambda: pa.array([], pa.float32()), base[:0]),
        "empty-slice": (lambda: pa.array(base).slice(5, 0), base[:0]),
        "length-1": (lambda: pa.array([2.5], pa.float32()), np.array([2.5], np.float32)),
    }[case]
    check_all("pyarrow", case, make, ref)


@pytest.mark.parametrize("case", ["C", "F", "strided", "0-d", "empty"])
def test_layouts_tensor(case):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    ref = {"C": base, "F": np.asfortranarray(base), "strided": base[:, ::2],
           "0-d": np.array(2.5, np.float32), "empty": base[:0]}[case]
    x = pa.Tensor.from_numpy(ref)
    assert dlinspect.peek(x).shape == ref.shape
    check_all("pyarrow", f"Tensor {case}", lambda: pa.Tensor.from_numpy(ref), ref)


def test_read_only_host_view():
    x = pa.array([1.0, 2.0, 3.0], pa.float64())
    h = dlinspect.to_host(x)
    assert not h.flags.writeable
    assert h.__array_interface__["data"][0] == dlinspect.peek(x).data_ptr


@pytest.mark.parametrize("case,words,hint", [
    ("nulls", "Can only use DLPack on arrays with no nulls", "fill_null"),
    ("bool", "Bit-packed boolean data type not supported by DLPack", "cast('uint8')"),
    ("decimal", "DataType is not compatible with DLPack spec", None),
])
def test_refusals_are_producer_errors(case, words, hint):
    x = {"nulls": pa.array([1, None, 3], pa.int32()),
         "bool": pa.array([True, False, True]),
         "decimal": pa.array([Decimal(1), Decimal(2)], pa.decimal128(5, 0))}[case]
    for target in ("jax", "host"):
        route = dlinspect.plan(x, target)
        assert route.kind == "error" and isinstance(route.error, dlinspect.ProducerError)
        assert words in str(route.error)
        check(x, np.zeros(0), target)   # raises the route's error
    for fn in (dlinspect.to_jax, dlinspect.to_host, dlinspect.peek):
        with pytest.raises(dlinspect.ProducerError, match=words) as info:
            fn(x)
        assert isinstance(info.value, BufferError)
        assert type(info.value.__cause__).__name__ == "ArrowTypeError"
        if hint:
            assert hint in str(info.value)
    outcome = record_jax("pyarrow", f"refused {case}", x, "error")
    assert outcome[0] == "raised"


# A regression guarded here: the generic hint named .cpu() and .contiguous() for a dtype refusal
# (found on date32, which is now a non-numeric leaf: decimals are numbers DLPack lacks).
def test_type_refusal_hint_fits_pyarrow():
    with pytest.raises(dlinspect.ProducerError) as info:
        dlinspect.to_jax(pa.array([Decimal(1), Decimal(2)], pa.decimal128(5, 0)))
    assert ".cpu()" not in str(info.value) and ".contiguous()" not in str(info.value)


def test_chunked_array_is_refused_with_the_fix():
    # No __dlpack__, but numbers: refused (never kept silently in a batch), with the fix.
    x = pa.chunked_array([[1, 2], [3]])
    for call in (dlinspect.to_jax, dlinspect.to_host, lambda v: dlinspect.to_jax({"c": v})):
        with pytest.raises(dlinspect.ProducerError, match="combine_chunks"):
            call(x)
    x = pa.chunked_array([[1, 2], [3]], pa.int32())
    assert np.array_equal(np.asarray(dlinspect.to_jax(x.combine_chunks())), [1, 2, 3])


@pytest.mark.parametrize("make", [
    lambda: pa.array(["a", "bc"]),
    lambda: pa.array([1, 2], pa.date32()),
    lambda: pa.array([[1], [2, 3]]),
    lambda: pa.chunked_array([["a"], ["b"]]),
])
def test_non_numeric_arrays_are_leaves(make):
    # A string column does not lose the whole batch (issue 16): it is a leaf, kept.
    x = make()
    batch = {"col": x, "n": pa.array([1.0, 2.0], pa.float32())}
    out = dlinspect.to_jax(batch)
    assert out["col"] is x and np.array_equal(np.asarray(out["n"]), [1.0, 2.0])
    assert dlinspect.plan(batch)["col"].kind == "untouched"
    with pytest.raises(dlinspect.NotNumericError):
        dlinspect.peek(x)
    with pytest.raises(dlinspect.NotDLPackError, match=r"^\['col'\]"):
        dlinspect.to_jax(batch, leaves="raise")


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: own(ref), ref, churn=lambda: own(np.full(4096, -1.0, np.float32)))
    # readonly="share": zero-copy; the jax.Array alone keeps pyarrow's buffer alive
    x = own(ref)
    ptr = dlinspect.peek(x).data_ptr
    y = dlinspect.to_jax(x, readonly="share")
    assert y.addressable_data(0).unsafe_buffer_pointer() == ptr
    del x
    churn = [own(np.full(4096, -1.0, np.float32)) for _ in range(64)]
    assert np.array_equal(np.asarray(y), ref)
    del churn


def test_no_leak():
    check_no_leak(own(np.arange(1024, dtype=np.float32)))


def test_no_leak_on_refusals():
    check_no_leak(pa.array([1, None, 3], pa.int32()), refused=dlinspect.ProducerError)


@pytest.mark.parametrize("make", [
    lambda: pa.table({"x": [1.0, 2.0]}),
    lambda: pa.record_batch({"x": [1.0, 2.0]}),
])
def test_tables_are_refused_with_the_fix(make):
    # A table in a batch (Ray's batch_format="pyarrow") is numbers DLPack cannot carry as
    # one tensor: refused, naming what to do, never passed over silently.
    x = make()
    with pytest.raises(dlinspect.ProducerError, match="to_numpy"):
        dlinspect.to_jax({"t": x})
    assert dlinspect.plan({"t": x})["t"].kind == "error"


def test_pandas_frames_are_refused_with_the_fix():
    pd = pytest.importorskip("pandas")
    for x in (pd.DataFrame({"x": [1.0, 2.0]}), pd.Series([1.0, 2.0])):
        with pytest.raises(dlinspect.ProducerError, match="to_numpy"):
            dlinspect.to_jax({"f": x})
