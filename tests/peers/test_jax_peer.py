"""Peer suite: the intent of JAX's DLPack tests (tests/array_interoperability_test.py and
tests/pytorch_interoperability_test.py in jax-ml/jax), with dlinspect.to_jax as the consumer
instead of ``jax.dlpack.from_dlpack`` / ``jnp.from_dlpack``.

Each test names the JAX check it carries (``peer: testName``). What JAX checks there: every
DLPack dtype over scalar, non-empty and empty shapes; NumPy arrays with and without the
alignment XLA:CPU needs, under ``copy=False/True/None`` and ``device=``; jax.Array round
trips; NumPy and torch producers; non-default (transposed) layouts; int64 narrowed with x64
off; bfloat16 and the float8 family; that a capsule is consumed at most once; pinned host
memory imported without a copy (checked by writing to the source after the import).
dlinspect's results are checked against ``jnp.asarray`` of the same values and against
``plan``: shared memory (``unsafe_buffer_pointer``) exactly where the route is "zero-copy".
Where dlinspect deliberately differs from JAX, a comment says so.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import (  # noqa: E402
    CapsuleConsumedError,
    CopyRequiredError,
    DLInspectWarning,
    Need,
    UnsupportedDTypeError,
)
from dlinspect import _core as djax  # noqa: E402
from dlinspect._jaxcaps import MIN_ALIGN  # noqa: E402
from dlinspect.testing import FakeProducer, aligned_array, aligned_empty  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/_versions.py
from _versions import NUMPY_VERSIONED, enable_x64, torch_exports_float8  # noqa: E402
from peer_checks import NUMPY_DTYPES, to_jax_checked  # noqa: E402
from _computations import assert_computes_like  # noqa: E402

#: jax._src.dlpack.SUPPORTED_DTYPES_SET, the dtypes JAX's tests round-trip: NumPy's
#: (JAX's numpy_dtypes) and bfloat16.
DLPACK_DTYPES = [*NUMPY_DTYPES, jnp.bfloat16]
#: JAX's extra_dlpack_dtypes (neither NumPy nor TensorFlow have them).
EXTRA_DTYPES = ["float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                "float8_e5m2fnuz", "float4_e2m1fn", "float8_e3m4", "float8_e4m3",
                "float8_e8m0fnu"]
#: JAX's all_shapes: scalar, non-empty and empty (pytorch_interoperability_test adds (2, 0, 1)).
ALL_SHAPES = [(), (4,), (3, 4), (2, 3, 4), (3, 1), (1, 4), (2, 1, 4), (0,), (0, 4), (3, 0),
              (2, 0, 1)]
NARROWED = {np.dtype(d) for d in (np.int64, np.uint64, np.float64, np.complex128)}


def dt_id(d) -> str:
    return np.dtype(d).name


def shape_id(s) -> str:
    return "x".join(map(str, s)) or "scalar"


def rand_default(shape, dtype, seed=0) -> np.ndarray:
    """Like jtu.rand_default: small values of either sign (unsigned: non-negative)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 10, shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(-5, 6, shape).astype(dt)
    if dt.kind == "c":
        return (3 * rng.standard_normal(shape) + 3j * rng.standard_normal(shape)).astype(dt)
    return (3 * rng.standard_normal(shape)).astype(dt)


def with_alignment(x: np.ndarray, alignment: int) -> np.ndarray:
    """A copy of ``x`` whose data pointer is aligned to exactly ``alignment`` bytes (JAX's
    _ensure_alignment; alignment 2 makes even 8-byte elements misaligned)."""
    buf = aligned_empty((x.nbytes,), np.uint8, 512, offset=alignment)
    out = buf.view(x.dtype).reshape(x.shape)
    np.copyto(out, x)
    return out


def alignment_of(x: np.ndarray) -> int:
    """The largest power of two dividing ``x``'s data pointer (for the empty arrays too)."""
    ptr = x.ctypes.data
    return ptr & -ptr if ptr else 1 << 30


def cpu_align() -> int:
    """The alignment (bytes) from which XLA:CPU views host memory, as dlinspect probed it:
    16 on jaxlib 0.4.30 (its importer takes any alignment; its compiled code needs
    dlinspect._jaxcaps.MIN_ALIGN), 64 on newer jaxlib."""
    return djax.jax_target().cpu_align


def jax_views(x: np.ndarray) -> bool:
    """Whether JAX's own ``jax.dlpack.from_dlpack`` imports ``x`` without a copy (the same
    pointer): what dlinspect's alignment probe should have found, asked independently."""
    try:
        y = jax.dlpack.from_dlpack(x)
    except Exception:   # a jaxlib that refuses memory it cannot view
        return False
    return y.unsafe_buffer_pointer() == x.ctypes.data


def jax_reads(x: np.ndarray) -> bool:
    """Whether computations on JAX's own ``jax.dlpack.from_dlpack`` of ``x`` give ``x``'s
    values (a jaxlib that reads a transposed layout as row-major does not: what dlinspect's
    permuted_ok probe found)."""
    try:
        assert_computes_like(jax.dlpack.from_dlpack(x), x)
    except Exception:   # a jaxlib that refuses the layout, or computes wrong with it
        return False
    return True


def jax_round_trips(dtype) -> bool:
    """Whether JAX's own DLPack round trip (testJaxRoundTrip) holds ``dtype``: export of a
    jax.Array and import of its capsule (jaxlib 0.4.30 has no DLPack code for float8)."""
    try:
        x = jnp.zeros((2,), dtype)
        return jax.dlpack.from_dlpack(x).dtype == x.dtype
    except Exception:   # "XLA type F8E4M3FN has no DLPack equivalent"
        return False


def numpy_capsule(x: np.ndarray):
    """A capsule of ``x``: versioned where NumPy exports one (>= 2.1), else legacy."""
    return x.__dlpack__(max_version=(1, 0)) if NUMPY_VERSIONED else x.__dlpack__()


def copy_needed(values, dtype=np.float32) -> np.ndarray:
    """``values`` in memory this jaxlib cannot view (to_jax copies, copy=False refuses): 4
    bytes past a 64-byte boundary where XLA:CPU needs more alignment than that; on a jaxlib
    that views any alignment (0.4.30), every other element of a buffer (a stride gap)."""
    values = np.asarray(values)
    if cpu_align() > 4:
        out = with_alignment(values.astype(dtype), 4)
    else:
        out = aligned_empty(values.shape + (2,), dtype, 64)[..., 0]
        out[...] = values
    return out


def expected_of(x) -> np.ndarray:
    """The values and dtype JAX gives ``x`` (jnp.asarray: narrowed where x64 is off)."""
    with np.errstate(all="ignore"):
        return np.asarray(jnp.asarray(np.asarray(x)))


def comparable(a) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.kind == "V" else a


@pytest.fixture(params=["direct", "public"])
def import_path(request):
    """jaxlib's own import function, and the public jax.dlpack.from_dlpack."""
    djax.force_public_api(request.param == "public")
    yield request.param
    djax.force_public_api(False)


# ---- NumPy -> JAX --------------------------------------------------------------------------

@pytest.mark.parametrize("device", [None, "cpu:0"])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("copy", [False, True, None])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES + [jnp.bfloat16], ids=dt_id)
@pytest.mark.parametrize("shape", ALL_SHAPES, ids=shape_id)
def test_numpy_to_jax(shape, dtype, copy, aligned, device):
    """peer: testNumpyToJax (shape x dtype x copy x aligned, device=jax.devices()[0]): values
    as jnp.asarray gives them; copy=False with memory XLA:CPU cannot view is a ValueError;
    aligned memory is viewed. (Misaligned means below the alignment dlinspect probed: on
    jaxlib 0.4.30, which views any alignment, the 2-byte aligned arrays are viewed too.)

    deliberate difference from JAX: copy=False with a 64-bit dtype and x64 off raises
    CopyRequiredError (narrowing is a copy); bfloat16 NumPy (ml_dtypes) arrays, which NumPy
    does not export, are taken too."""
    # deliberate difference from JAX: copy=False with a 64-bit dtype and x64 off narrows
    # silently in jnp.from_dlpack; dlinspect raises CopyRequiredError (narrowing is a copy);
    # bfloat16 NumPy arrays are taken too
    x = rand_default(shape, dtype)
    x = aligned_array(x, x.dtype) if aligned else with_alignment(x, 2)
    dev = jax.devices()[0] if device else None
    route, y = to_jax_checked(x, x.ctypes.data, device=dev, copy=copy)
    empty = x.size == 0
    narrowed = np.dtype(dtype) in NARROWED
    viewable = alignment_of(x) >= cpu_align()
    if copy is False and not empty and (not viewable or narrowed):
        assert isinstance(route.error, CopyRequiredError) and isinstance(route.error, ValueError)
        return
    expected = expected_of(x)
    assert y.shape == shape and y.dtype == expected.dtype
    assert y.devices() == {jax.devices()[0]}
    np.testing.assert_array_equal(comparable(y), comparable(expected))
    if empty:
        assert route.kind == "zero-copy"
    elif copy is True or not viewable or narrowed:
        assert route.kind == "copy"
    else:
        assert route.kind == "zero-copy"


@pytest.mark.parametrize("dtype", DLPACK_DTYPES, ids=dt_id)
@pytest.mark.parametrize("shape", [(), (3, 4), (0, 4)], ids=shape_id)
def test_numpy_to_jax_import_paths(shape, dtype, import_path):
    """peer: testNumpyToJax through both ways into jaxlib (its import function, and the public
    jax.dlpack.from_dlpack dlinspect falls back to): the same values and the same sharing."""
    x = aligned_array(rand_default(shape, dtype), dtype)
    route, y = to_jax_checked(x, x.ctypes.data)
    np.testing.assert_array_equal(comparable(y), comparable(expected_of(x)))
    assert route.kind == ("zero-copy" if x.size == 0 or np.dtype(dtype) not in NARROWED
                          else "copy")


@pytest.mark.parametrize("alignment", [1, 2, 4, 8, 16, 32, 64, 128, 256])
def test_alignment_xla_cpu_views(alignment):
    """peer: _get_max_align_bits / _ensure_alignment: XLA:CPU views memory only at its
    alignment (64 bytes; jaxlib 0.4.30: any); below it the plan names the alignment and
    to_jax copies. Viewed exactly where JAX's own from_dlpack views the memory."""
    x = with_alignment(np.arange(16, dtype=np.uint8), alignment)
    assert dlinspect.peek(x).alignment == alignment
    route, y = to_jax_checked(x, x.ctypes.data)
    np.testing.assert_array_equal(np.asarray(y), np.arange(16))
    align = cpu_align()
    viewed = alignment >= align
    # deliberate difference from JAX: jaxlib 0.4.30 views memory of any alignment, and its
    # compiled code crashes on memory less than 16-byte aligned; dlinspect copies that
    assert (route.kind == "zero-copy") == viewed == (jax_views(x) and alignment >= MIN_ALIGN)
    assert bool(route.needs & Need.ALIGN) == (not viewed)
    if not viewed:
        assert f"{alignment}-byte aligned" in route.reason and f"{align}-byte" in route.reason
        with pytest.raises(CopyRequiredError):
            dlinspect.to_jax(x, copy=False)


def test_numpy_to_jax_nondefault_layout():
    """peer: testNumpyToJaxNondefaultLayout: a transposed NumPy array keeps its values.
    deliberate difference from JAX: its from_dlpack views a permuted compact layout (on a
    jaxlib that reads it right: dlinspect's permuted_ok) as an array committed in that
    layout, which jax.device_put moves wrong; dlinspect copies it into row-major order
    (Need.PERMUTED; Need.LAYOUT on a jaxlib that reads it as row-major)."""
    x = np.arange(4).reshape(2, 2).T
    route, y = to_jax_checked(x, x.ctypes.data)
    assert_computes_like(y, x)   # JAX's own test compares np.asarray only
    f = aligned_array(np.arange(12).reshape(3, 4), np.float32).T
    route, y = to_jax_checked(f, f.ctypes.data)
    assert_computes_like(y, f)
    permuted_ok = djax.jax_target().permuted_ok
    assert permuted_ok == jax_reads(f)
    assert route.kind == "copy" and djax.jax_target().row_major(y)
    assert bool(route.needs & Need.LAYOUT) == (not permuted_ok)
    assert bool(route.needs & Need.PERMUTED) == permuted_ok


def test_zero_copy_sees_later_writes():
    """peer: testTpuHostBufferDmaMap ("fill data *after* import to verify zero-copy"), and
    testTensorFlowToJax's shared memory: a zero-copy array reads what is written to the
    producer's memory afterwards; a copy does not."""
    x = aligned_array(np.zeros(1024), np.uint32)
    viewed = dlinspect.to_jax(x)
    snapshot = dlinspect.to_jax(x, copy=True)
    assert dlinspect.plan(x).kind == "zero-copy"
    x[:] = np.arange(1024, dtype=np.uint32)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a + 1)(viewed)),
                                  np.arange(1024) + 1)
    np.testing.assert_array_equal(np.asarray(snapshot), np.zeros(1024))


# ---- jax.Array round trips, JAX -> NumPy ------------------------------------------------------

@pytest.mark.parametrize("device_type", [None, "cpu"])
@pytest.mark.parametrize("dtype", DLPACK_DTYPES, ids=dt_id)
@pytest.mark.parametrize("shape", ALL_SHAPES, ids=shape_id)
def test_jax_array_round_trip(shape, dtype, device_type):
    """peer: testJaxArrayRoundTrip: a jax.Array through to_jax keeps its device and values, and
    can be converted more than once; its capsule comes back zero-copy.

    deliberate difference from JAX: to_jax returns a jax.Array as it is (no DLPack round
    trip); its bare capsule (which from_dlpack refuses) goes through DLPack."""
    # deliberate difference from JAX: from_dlpack(jax_array) goes through DLPack; dlinspect
    # returns the jax.Array as it is, and takes its bare capsule
    device = jax.devices()[0] if device_type is None else jax.devices(device_type)[0]
    with np.errstate(all="ignore"):
        x = jax.device_put(rand_default(shape, dtype), device)
    for _ in range(2):
        assert dlinspect.plan(x).kind == "zero-copy"
        assert dlinspect.to_jax(x) is x
        assert dlinspect.to_jax(x, device=device) is x
    route, z = to_jax_checked(x.__dlpack__(), x.unsafe_buffer_pointer() if x.size else None)
    assert z.devices() == {device} and z.dtype == x.dtype
    np.testing.assert_array_equal(comparable(z), comparable(x))
    if x.size:
        assert route.kind == "zero-copy"


@pytest.mark.parametrize("dtype", NUMPY_DTYPES + [jnp.bfloat16], ids=dt_id)
@pytest.mark.parametrize("shape", ALL_SHAPES, ids=shape_id)
def test_jax_to_numpy(shape, dtype):
    """peer: testJaxToNumpy: to_host of a jax.Array gives its values (bfloat16 too, which
    NumPy's from_dlpack refuses), a read-only view of JAX's own buffer."""
    with np.errstate(all="ignore"):
        x = jnp.array(rand_default(shape, dtype))
    assert dlinspect.plan(x, "host").kind == "zero-copy"
    h = dlinspect.to_host(x)
    assert h.dtype == x.dtype and h.shape == shape
    np.testing.assert_array_equal(comparable(h), comparable(x))
    if x.size:
        assert h.ctypes.data == x.unsafe_buffer_pointer()
        assert not h.flags.writeable   # JAX's memory is never written through NumPy


def test_consumed_at_most_once():
    """peer: testJaxRoundTrip (older form): "DLPack tensor may be consumed at most once".

    deliberate difference from JAX: jax raised RuntimeError for the second use; dlinspect
    raises CapsuleConsumedError, a ValueError, and reads nothing of the capsule."""
    # deliberate difference from JAX: older JAX raised RuntimeError on the second use;
    # dlinspect raises CapsuleConsumedError (a ValueError)
    x = jnp.arange(6.0).reshape(2, 3)
    cap = x.__dlpack__()
    y = dlinspect.to_jax(cap)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    with pytest.raises(CapsuleConsumedError) as info:
        dlinspect.to_jax(cap)
    assert isinstance(info.value, ValueError)
    assert isinstance(dlinspect.plan(cap).error, CapsuleConsumedError)
    with pytest.raises(CapsuleConsumedError):
        dlinspect.to_host(cap)


@pytest.mark.parametrize("order", ["good first", "bad first"])
def test_failed_batch_consumes_no_capsule(order):
    """peer: testJaxRoundTrip's consumed-at-most-once rule, for a batch: when to_jax raises,
    no capsule of the batch has been consumed (plan(batch) says the error before any
    import), so the caller can retry with other options."""
    good = aligned_array(np.arange(4), np.float32)
    bad = copy_needed(np.arange(4))
    caps = {"good": numpy_capsule(good), "bad": numpy_capsule(bad)}
    name = "dltensor_versioned" if NUMPY_VERSIONED else "dltensor"
    batch = dict(sorted(caps.items(), reverse=order == "good first"))
    assert dlinspect.plan(batch, copy=False)["good"].kind == "zero-copy"
    assert isinstance(dlinspect.plan(batch, copy=False)["bad"].error, CopyRequiredError)
    with pytest.raises(CopyRequiredError):
        dlinspect.to_jax(batch, copy=False)
    assert dlinspect.peek(caps["bad"]).capsule_name == name
    assert dlinspect.peek(caps["good"]).capsule_name == name


# ---- torch -> JAX ----------------------------------------------------------------------------

JIT_SHAPES = [(), (3, 4), (0, 4)]
TORCH_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16, np.float32,
                np.float64, jnp.bfloat16, np.complex64, np.complex128, np.bool_]


def torch_of(torch, x_np):
    x_np = np.asarray(x_np)   # (torch 2.3 reads a NumPy bool scalar as an index)
    if x_np.dtype == jnp.bfloat16:
        return torch.tensor(x_np.view(np.int16)).view(torch.bfloat16)
    return torch.tensor(x_np)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=dt_id)
@pytest.mark.parametrize("shape", ALL_SHAPES, ids=shape_id)
def test_torch_to_jax(shape, dtype, torch):
    """peer: testTorchToJax / testTorchToJaxArray: values as JAX gives them, and the result
    goes into a jitted computation (x + 1; for three of the shapes).

    deliberate difference from JAX: the tests skip 64-bit dtypes with x64 off; dlinspect
    narrows them as jnp.asarray does, with a DLInspectWarning."""
    # deliberate difference from JAX: the peer skips 64-bit dtypes with x64 off; dlinspect
    # narrows them as jnp.asarray, with a DLInspectWarning
    x_np = rand_default(shape, dtype)
    x = torch_of(torch, x_np)
    route, y = to_jax_checked(x, x.data_ptr() if x.numel() else None)
    expected = expected_of(x_np)
    assert y.dtype == expected.dtype and y.shape == shape
    np.testing.assert_array_equal(comparable(y), comparable(expected))
    # Every narrowed dtype warns, an empty tensor's too (its dtype becomes JAX's, int64 ->
    # int32, as the README says of narrowing).
    assert (route.warning is not None) == (np.dtype(dtype) in NARROWED)
    if x.numel():   # torch's allocations are 64-byte aligned: only narrowing copies
        assert route.kind == ("copy" if np.dtype(dtype) in NARROWED else "zero-copy")
    if shape not in JIT_SHAPES:   # (each shape compiles anew: a few of them keep this fast)
        return
    one = True if dtype is np.bool_ else 1
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(comparable(jax.jit(lambda a: a + one)(y)),
                                      comparable(jnp.asarray(expected) + one))


@pytest.mark.parametrize("x64", [False, True])
def test_torch_to_jax_int64(torch, x64):
    """peer: testTorchToJaxInt64 (jax issue 11895): int64 stays int64 with x64 on, else int32."""
    with enable_x64(x64):
        t = torch.ones((2, 3), dtype=torch.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if not x64 else "error", DLInspectWarning)
            y = dlinspect.to_jax(t)
        assert y.dtype == (jnp.int64 if x64 else jnp.int32)
        assert (dlinspect.plan(t).kind == "zero-copy") == x64
        np.testing.assert_array_equal(np.asarray(y), np.ones((2, 3)))


@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_torch_to_jax_nondefault_layout(torch, dtype):
    """peer: testTorchToJaxNondefaultLayout: x.T keeps its values, copied into row-major
    order (deliberate difference from JAX: see test_numpy_to_jax_nondefault_layout)."""
    x = torch.arange(4, dtype=getattr(torch, dtype)).reshape(2, 2).T
    route, y = to_jax_checked(x, x.data_ptr())
    assert_computes_like(y, x.numpy())
    assert route.kind == "copy" and djax.jax_target().row_major(y)


@pytest.mark.parametrize("perm", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1),
                                  (2, 1, 0)], ids=str)
@pytest.mark.parametrize("producer", ["numpy", "torch"])
def test_permuted_layouts(producer, perm, torch):
    """peer: testNumpyToJaxNondefaultLayout / testTorchToJaxNondefaultLayout over every axis
    order of a 3-d block: the values are kept, and a dense block in any axis order (compact
    strides) other than the identity is copied into row-major order (see
    test_numpy_to_jax_nondefault_layout), the identity viewed."""
    block = aligned_array(np.arange(24).reshape(2, 3, 4), np.float32)
    x = block.transpose(perm) if producer == "numpy" else torch.from_numpy(block).permute(perm)
    ptr = x.ctypes.data if producer == "numpy" else x.data_ptr()
    route, y = to_jax_checked(x, ptr)
    assert_computes_like(y, block.transpose(perm))
    viewed, permuted_ok = perm == (0, 1, 2), djax.jax_target().permuted_ok
    assert route.kind == ("zero-copy" if viewed else "copy") and djax.jax_target().row_major(y)
    assert bool(route.needs & Need.LAYOUT) == (not viewed and not permuted_ok)
    assert bool(route.needs & Need.PERMUTED) == (not viewed and permuted_ok)
    assert dlinspect.peek(x).is_compact


def test_torch_to_jax_strided(torch):
    """peer: testTorchToJaxFailure.

    deliberate difference from JAX: jaxlib refuses x[:, :2] ("UNIMPLEMENTED: Only DLPack
    tensors with trivial (compact) striding"); dlinspect copies it into C order, and only
    copy=False refuses (CopyRequiredError, a ValueError)."""
    # deliberate difference from JAX: jaxlib raises UNIMPLEMENTED for non-compact strides;
    # dlinspect copies into C order
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, :2]
    route, y = to_jax_checked(x, x.data_ptr())
    assert route.kind == "copy" and route.needs & Need.LAYOUT
    np.testing.assert_array_equal(np.asarray(y), x.numpy())
    with pytest.raises(CopyRequiredError):
        dlinspect.to_jax(x, copy=False)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz", "float8_e8m0fnu"])
def test_torch_narrow_floats_to_jax(torch, name):
    """peer: testTorchToJax for bfloat16, and the float8 dtypes JAX and torch share: the same
    bits, the same dtype, zero-copy; and Bfloat16Test: torch's bfloat16 is JAX's."""
    if name != "bfloat16" and not torch_exports_float8():
        pytest.skip("this torch does not export float8")
    if not hasattr(torch, name):
        pytest.skip(f"torch {torch.__version__} has no {name}")
    raw = torch.tensor([56, 60, 64, 68, 72, 127], dtype=torch.uint8)
    x = (raw.view(getattr(torch, name)) if name != "bfloat16"
         else raw.to(torch.int16).mul(64).view(torch.bfloat16))
    route, y = to_jax_checked(x, x.data_ptr())
    assert route.kind == "zero-copy"
    assert y.dtype == jnp.dtype(getattr(jnp, name))
    width = np.uint8 if name != "bfloat16" else np.uint16
    np.testing.assert_array_equal(np.asarray(y).view(width),
                                  x.view(torch.uint8 if name != "bfloat16" else torch.int16)
                                  .numpy().view(width))
    assert dlinspect.to_host(x).dtype == jnp.dtype(getattr(jnp, name))


# ---- the float8 family, float4 ---------------------------------------------------------------

@pytest.mark.parametrize("name", EXTRA_DTYPES)
@pytest.mark.parametrize("shape", ALL_SHAPES, ids=shape_id)
def test_extra_dlpack_dtypes(shape, name, ml_dtypes):
    """peer: testJaxRoundTrip over extra_dlpack_dtypes (float8 family, float4_e2m1fn): values
    and dtype kept; viewed where JAX's own DLPack round trip holds the dtype (jaxlib 0.4.30
    has no DLPack code for float8), else copied; float4 (sub-byte, which jaxlib's DLPack
    import does not take) is copied.

    deliberate difference from JAX: these come from NumPy (ml_dtypes) arrays, which
    jax.dlpack.from_dlpack cannot get (NumPy does not export them)."""
    # deliberate difference from JAX: jax.dlpack cannot get these from NumPy (NumPy does not
    # export ml_dtypes); dlinspect takes them
    if not hasattr(jnp, name) or not hasattr(ml_dtypes, name):
        pytest.skip(f"no {name} here")
    dt = np.dtype(getattr(ml_dtypes, name))
    x = aligned_array(np.abs(rand_default(shape, np.float32)) + 0.5, dt)
    route, y = to_jax_checked(x, x.ctypes.data)
    assert y.dtype == dt and y.shape == shape
    np.testing.assert_array_equal(comparable(y), comparable(x))
    if x.size:
        viewed = jax_round_trips(dt) and not name.startswith("float4")
        assert route.kind == ("zero-copy" if viewed else "copy")
        assert bool(route.needs & Need.NUMPY_PUT) == (not viewed)


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2"])
def test_sub_byte_integers(name, ml_dtypes):
    """peer: the sub-byte dtypes JAX holds (jnp.int4...): values kept through to_jax, which
    copies them (jaxlib's DLPack import takes none), and through a zero-copy to_host."""
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    src = [0, 1, 1, 0, 1, 1] if name.startswith("u") or name == "int2" else [-8, -1, 0, 1, 7, 3]
    x = aligned_array(np.array(src).reshape(2, 3), dt)
    route, y = to_jax_checked(x, x.ctypes.data)
    assert route.kind == "copy" and y.dtype == dt
    np.testing.assert_array_equal(np.asarray(y).astype(np.int8), np.array(src).reshape(2, 3))
    h = dlinspect.to_host(x)
    assert h.ctypes.data == x.ctypes.data and h.dtype == dt


# ---- pinned host memory, devices ------------------------------------------------------------

def test_pinned_host_round_trip_zero_copy():
    """peer: testPinnedTorchToJaxZeroCopy / testJaxPinnedHostRoundTrip: memory a producer
    reports as kDLCUDAHost (a pinned torch tensor) is imported without a copy.

    On this CPU-only JAX there is no CUDA device, so it is viewed by JAX's CPU device
    (Need.VIA_CPU); JAX with CUDA puts it in the CUDA device's pinned_host memory."""
    x = aligned_array(np.arange(8), np.float32)
    pinned = FakeProducer(x, (D.kDLCUDAHost, 0), capsule_device=(D.kDLCPU, 0))
    route, y = to_jax_checked(pinned, x.ctypes.data)
    if "cuda" in {d.platform for d in jax.devices()}:   # pragma: no cover - CUDA machines
        pytest.skip("a CUDA JAX imports it as pinned_host memory")
    assert route.kind == "zero-copy" and route.needs & Need.VIA_CPU
    assert y.devices() == {jax.devices("cpu")[0]}
    np.testing.assert_array_equal(np.asarray(y), np.arange(8))


def test_unsupported_dtype_for_jax(ml_dtypes):
    """peer: the dtypes outside JAX's SUPPORTED_DTYPES (jax.dlpack raises on them): the error
    is an UnsupportedDTypeError (a BufferError) naming code, bits and lanes; NumPy still
    takes them through to_host."""
    if not hasattr(ml_dtypes, "float6_e2m3fn"):
        pytest.skip("ml_dtypes has no float6")
    x = aligned_array(np.array([0.5, 1.0]), ml_dtypes.float6_e2m3fn)
    try:
        jnp.asarray(x)
    except Exception:
        pass
    else:   # pragma: no cover - a JAX that holds float6
        pytest.skip("this JAX holds float6_e2m3fn")
    route = dlinspect.plan(x)
    assert isinstance(route.error, UnsupportedDTypeError) and isinstance(route.error, BufferError)
    assert "bits=6" in str(route.error)
    with pytest.raises(UnsupportedDTypeError):
        dlinspect.to_jax(x)
    assert dlinspect.to_host(x).dtype == x.dtype
