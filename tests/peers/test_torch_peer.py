"""Peer suite: the intent of PyTorch's CPU DLPack tests (test/test_dlpack.py in
pytorch/pytorch), with dlinspect as the consumer instead of ``torch.from_dlpack``.

Each test names the torch check it carries (``peer: test_...``). What torch checks there on
CPU: every dtype through a capsule and through the protocol, shared storage, non-contiguous
views and transposes, the dtype kept, refusals (requires_grad, conjugate bit, non-strided
layouts, quantized dtypes, unsupported devices) as BufferError in torch's words, strides
kept as they are (no normalization), a wrapper exposing only ``__dlpack__`` and
``__dlpack_device__``, legacy and versioned capsules for every ``max_version``, NumPy arrays
made by ``t.numpy()``, the ``copy``/``device`` keywords, narrow float types through their
bits, and a CPU stream of None. dlinspect's results are compared with torch's own values
(``t.numpy()``, or the bits for types NumPy lacks), with shared memory (``data_ptr``)
exactly where ``plan(t).kind`` is "zero-copy". Where dlinspect deliberately differs from
torch, a comment says so.
"""

from __future__ import annotations

import gc
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import (  # noqa: E402
    CapsuleConsumedError,
    CopyRequiredError,
    DLInspectWarning,
    Need,
    ProducerError,
    UnsupportedDeviceError,
    UnsupportedDTypeError,
)
from dlinspect import _core as djax  # noqa: E402
from dlinspect.testing import FakeProducer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/_versions.py
from _versions import (  # noqa: E402
    ml_dtypes_has,
    torch_exports_float8,
    torch_exports_versioned,
    torch_use_count,
)
from peer_checks import to_jax_checked  # noqa: E402

#: torch's __dlpack__ takes max_version (torch >= 2.4): tensors are exported in versioned
#: capsules, whose host views are writeable; torch 2.3 gives legacy capsules (read-only views).
TORCH_VERSIONED = torch_exports_versioned()

#: all_types_and_complex_and(torch.half, torch.bfloat16, torch.bool, torch.uint16,
#: torch.uint32, torch.uint64), torch's dtype list for its CPU DLPack tests.
TORCH_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
                torch.float64, torch.complex64, torch.complex128, torch.float16, torch.bfloat16,
                torch.bool, torch.uint16, torch.uint32, torch.uint64]
NARROWED = {torch.int64, torch.uint64, torch.float64, torch.complex128}
#: The narrow-precision dtypes of test_dlpack_conversion_with_streams_narrow_precision.
NARROW_PRECISION = ["float8_e5m2", "float8_e5m2fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
                    "float8_e8m0fnu"]


def dt_id(dt) -> str:
    return str(dt).replace("torch.", "")


def make_tensor(shape, dtype, seed=0):
    """torch.testing.make_tensor's role: random values of ``dtype`` (no NaNs)."""
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype) * 3
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    low = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -9
    return torch.randint(low, 10, shape, generator=g, dtype=torch.int64).to(dtype)


def reference(t) -> np.ndarray:
    """torch's own values as NumPy (bfloat16 through its bits into ml_dtypes)."""
    if t.dtype is torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def comparable(a) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.kind == "V" else a


def torch_capsule(t, max_version):
    """``t.__dlpack__(max_version=max_version)`` where torch takes the keyword; on torch 2.3,
    which refuses it (TypeError), its one export: a legacy capsule."""
    if TORCH_VERSIONED:
        return t.__dlpack__(max_version=max_version)
    try:
        t.__dlpack__(max_version=max_version)
    except TypeError:
        return t.__dlpack__()
    raise AssertionError(f"torch {torch.__version__} took max_version")


def copy_needed_view(t):
    """A view of the 1-d tensor ``t`` that JAX cannot view on this jaxlib: ``t[1:]`` (4 bytes
    past torch's 64-byte aligned allocation) where XLA:CPU needs more alignment than that,
    as dlinspect probed it; on a jaxlib that views any alignment (0.4.30), ``t[::2]`` (a gap
    in the strides, which no jaxlib views)."""
    return t[1:] if djax.jax_target().cpu_align > 4 else t[::2]


def jax_values(t) -> np.ndarray:
    """What JAX makes of torch's values (jnp.asarray: 64-bit narrowed with x64 off)."""
    with np.errstate(all="ignore"):
        return np.asarray(jnp.asarray(reference(t)))


class TensorDLPackWrapper:
    """Exposes only __dlpack__ and __dlpack_device__ (torch's TensorDLPackWrapper), and
    records the keywords each __dlpack__ call got."""

    def __init__(self, tensor, device=None):
        self.tensor = tensor
        self.device = device
        self.calls = []

    def __dlpack__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return self.tensor.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.device or self.tensor.__dlpack_device__()


# ---- dtypes: capsule and protocol -------------------------------------------------------------

@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=dt_id)
def test_dlpack_capsule_conversion(dtype):
    """peer: test_dlpack_capsule_conversion: to_dlpack(x) (a legacy capsule) into NumPy and into
    JAX: torch's values, zero-copy where plan says so."""
    x = make_tensor((5,), dtype)
    h = dlinspect.to_host(torch.utils.dlpack.to_dlpack(x))
    np.testing.assert_array_equal(comparable(h), comparable(reference(x)))
    assert h.ctypes.data == x.data_ptr() and not h.flags.writeable   # legacy: read-only
    route, y = to_jax_checked(torch.utils.dlpack.to_dlpack(x), x.data_ptr())
    np.testing.assert_array_equal(comparable(y), comparable(jax_values(x)))
    assert route.kind == ("copy" if dtype in NARROWED else "zero-copy")


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=dt_id)
def test_dlpack_protocol_conversion(dtype):
    """peer: test_dlpack_protocol_conversion / test_from_dlpack / test_from_dlpack_dtype: the
    tensor itself: the dtype kept (to_host: NumPy's or ml_dtypes' equivalent; to_jax: JAX's,
    narrowed with x64 off), torch's values, shared memory where planned; the host view is
    writeable where torch exports versioned capsules (legacy ones cannot say: read-only)."""
    x = make_tensor((5,), dtype)
    h = dlinspect.to_host(x)
    assert h.dtype == reference(x).dtype and h.ctypes.data == x.data_ptr()
    assert h.flags.writeable == TORCH_VERSIONED
    np.testing.assert_array_equal(comparable(h), comparable(reference(x)))
    route, y = to_jax_checked(x, x.data_ptr())
    assert y.dtype == jax.dtypes.canonicalize_dtype(reference(x).dtype)
    np.testing.assert_array_equal(comparable(y), comparable(jax_values(x)))
    assert route.kind == ("copy" if dtype in NARROWED else "zero-copy")


def test_complex32():
    """peer: the chalf (complex32) case torch round-trips on MPS: NumPy holds it through
    ml_dtypes (>= 0.7; before, there is no NumPy dtype for it: UnsupportedDTypeError), JAX
    does not hold it (UnsupportedDTypeError, a BufferError)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "ComplexHalf support is experimental"
        x = torch.tensor([1 + 2j, -3.5 + 0.25j], dtype=torch.complex32)
    if ml_dtypes_has("complex32"):
        h = dlinspect.to_host(x)
        assert h.dtype.itemsize == 4 and h.ctypes.data == x.data_ptr()
        np.testing.assert_array_equal(h.astype(np.complex64), np.array([1 + 2j, -3.5 + 0.25j]))
    else:
        host = dlinspect.plan(x, "host")
        assert isinstance(host.error, UnsupportedDTypeError) and "no NumPy dtype" in str(host.error)
        with pytest.raises(UnsupportedDTypeError):
            dlinspect.to_host(x)
    route = dlinspect.plan(x)
    assert isinstance(route.error, UnsupportedDTypeError) and isinstance(route.error, BufferError)
    with pytest.raises(UnsupportedDTypeError):
        dlinspect.to_jax(x)


@pytest.mark.parametrize("name", NARROW_PRECISION)
def test_dlpack_narrow_precision(name):
    """peer: test_dlpack_conversion_with_streams_narrow_precision (on CPU): uint8 + 1 viewed as
    each float8 dtype comes back with the same bits, the same memory."""
    if not torch_exports_float8():
        pytest.skip("this torch does not export float8")
    if not hasattr(torch, name):
        pytest.skip(f"torch {torch.__version__} has no {name}")
    x = (make_tensor((5,), torch.uint8) + 1).view(getattr(torch, name))
    bits = x.view(torch.uint8).numpy()
    h = dlinspect.to_host(x)
    assert h.dtype.name == name and h.ctypes.data == x.data_ptr()
    np.testing.assert_array_equal(h.view(np.uint8), bits)
    route, y = to_jax_checked(x, x.data_ptr())
    assert route.kind == "zero-copy" and y.dtype.name == name
    np.testing.assert_array_equal(np.asarray(y).view(np.uint8), bits)


def test_float4_e2m1fn_x2_refused():
    """peer: test_dlpack_conversion_with_streams_narrow_precision, float4_e2m1fn_x2.

    deliberate difference from torch: torch.from_dlpack round-trips the packed pairs;
    dlinspect refuses them with UnsupportedDTypeError (a BufferError), for NumPy and JAX,
    because two 4-bit lanes share each byte and cannot become an axis."""
    # deliberate difference from torch: from_dlpack round-trips float4_e2m1fn_x2; dlinspect
    # refuses it (UnsupportedDTypeError): two 4-bit lanes share a byte
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    x = torch.tensor([0x21, 0x43], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    info = dlinspect.peek(x)
    assert (info.dtype.code, info.dtype.bits, info.dtype.lanes) == (17, 4, 2)
    for target, fn in (("host", dlinspect.to_host), ("jax", dlinspect.to_jax)):
        route = dlinspect.plan(x, target)
        assert isinstance(route.error, UnsupportedDTypeError)
        with pytest.raises(UnsupportedDTypeError):
            fn(x)
    assert "share each byte" in str(dlinspect.plan(x, "host").error)


def test_float4_e2m1fn_x2_error_names_the_lanes():
    """peer: test_dlpack_conversion_with_streams_narrow_precision, float4_e2m1fn_x2: the error
    says why (two 4-bit lanes share each byte), for JAX as for NumPy."""
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    x = torch.tensor([0x21, 0x43], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    message = str(dlinspect.plan(x).error)
    assert "share each byte" in message
    assert "UNIMPLEMENTED" not in message


# ---- storage ----------------------------------------------------------------------------------

def test_dlpack_shared_storage():
    """peer: test_dlpack_shared_storage: a write through the imported array shows in the
    tensor (to_host's view; with a torch that exports legacy capsules only, a read-only view
    that shows a write to the tensor); a write to the tensor shows in the zero-copy jax.Array."""
    x = make_tensor((5,), torch.float64)
    z = dlinspect.to_host(torch.utils.dlpack.to_dlpack(x)).copy()   # legacy: read-only view
    v = dlinspect.to_host(x)                                         # versioned: writeable
    assert v.flags.writeable == TORCH_VERSIONED
    if TORCH_VERSIONED:
        v[0] = v[0] + 20.0
    else:
        x[0] += 20.0
    assert x[0].item() == z[0] + 20.0 == v[0]
    f = make_tensor((6,), torch.float32)
    j = dlinspect.to_jax(f)
    assert dlinspect.plan(f).kind == "zero-copy"
    f.mul_(2)
    np.testing.assert_array_equal(np.asarray(j), f.numpy())


def test_use_count():
    """peer: the storage lifetime behind test_dlpack_shared_storage: a zero-copy import holds
    the storage (use count + 1) until it dies; copies and capsules consumed by a copy do not."""
    x = make_tensor((6,), torch.float32)
    base = torch_use_count(x)
    if base is None:
        pytest.skip("this torch has no Tensor._use_count")
    h = dlinspect.to_host(x)
    j = dlinspect.to_jax(x)
    assert torch_use_count(x) == base + 2
    del h, j
    gc.collect()
    assert torch_use_count(x) == base
    c = dlinspect.to_jax(x, copy=True)
    assert torch_use_count(x) == base and c.unsafe_buffer_pointer() != x.data_ptr()
    cap = x.__dlpack__()
    assert torch_use_count(x) == base + 1
    y = dlinspect.to_host(cap, copy=True)
    del cap
    assert torch_use_count(x) == base
    np.testing.assert_array_equal(y, x.numpy())


# ---- layouts ----------------------------------------------------------------------------------

NON_CONTIGUOUS = {
    "x[0]": lambda x: x[0],
    "x[:, 0]": lambda x: x[:, 0],
    "x[1, :]": lambda x: x[1, :],
    "x[1]": lambda x: x[1],
    "x.t()": lambda x: x.t(),
    "x[::2, 1::2]": lambda x: x[::2, 1::2],
    "x.expand": lambda x: x[0:1].expand(3, 5),
    "x[0].expand": lambda x: x[0, 2].expand(4),
}


@pytest.mark.parametrize("view", list(NON_CONTIGUOUS))
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=dt_id)
def test_from_dlpack_noncontiguous(dtype, view):
    """peer: test_from_dlpack_noncontiguous (x[0], x[:, 0], x[1, :], x[1], x.t()), plus gaps and
    expand (stride 0): to_host views torch's memory with torch's strides; to_jax gives the
    same values, sharing memory exactly where plan says (compact views, not gaps or
    broadcast: those are copied; nor x.t() where this jaxlib reads transposed layouts as
    row-major, the permuted_ok dlinspect probed)."""
    x = make_tensor((25,), dtype).reshape(5, 5)
    y = NON_CONTIGUOUS[view](x)
    h = dlinspect.to_host(y)
    assert h.ctypes.data == y.data_ptr() and h.shape == tuple(y.shape)
    np.testing.assert_array_equal(comparable(h), comparable(reference(y.contiguous())))
    if all(n > 1 for n in y.shape):
        assert h.strides == tuple(s * y.element_size() for s in y.stride())
    route, j = to_jax_checked(y, y.data_ptr())
    np.testing.assert_array_equal(comparable(j), comparable(jax_values(y.contiguous())))
    info = dlinspect.peek(y)
    permuted = not y.is_contiguous() and not djax.jax_target().permuted_ok
    assert bool(route.needs & Need.LAYOUT) == (info.has_broadcast or not info.is_compact
                                               or permuted)
    if "expand" in view:
        assert info.has_broadcast and route.kind == "copy"


def test_dlpack_normalize_strides():
    """peer: test_dlpack_normalize_strides: x[::3][:1] has shape (1,) and stride (3,); the
    header keeps what torch wrote, stride 3 ("stride normalization has been removed", torch
    >= 2.10; older torch writes 1: torch.from_dlpack of its own capsule says which), and the
    value is right."""
    x = torch.rand(16)
    y = x[::3][:1]
    written = torch.from_dlpack(y.__dlpack__()).stride()   # the header's strides, read by torch
    assert written in ((3,), (1,))
    info = dlinspect.peek(y)
    assert info.shape == (1,) and info.strides == written
    assert info.is_c_contiguous   # an extent-1 axis constrains nothing
    route, j = to_jax_checked(y, y.data_ptr())
    assert route.kind == "zero-copy"
    np.testing.assert_array_equal(np.asarray(j), y.numpy())
    np.testing.assert_array_equal(dlinspect.to_host(y), y.numpy())


@pytest.mark.parametrize("shape", [(), (0,), (0, 4), (3, 0), (2, 0, 1), (1,), (3, 1), (2, 1, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16],
                         ids=dt_id)
def test_scalars_and_empty(shape, dtype):
    """peer: make_tensor shapes, scalar and empty (torch's dtype tests and JAX's torch tests):
    shape and dtype kept; an empty tensor is never copied, even with copy=False."""
    x = make_tensor(shape, dtype)
    h = dlinspect.to_host(x)
    assert h.shape == shape and h.dtype == reference(x).dtype
    np.testing.assert_array_equal(comparable(h), comparable(reference(x)))
    route, j = to_jax_checked(x, x.data_ptr())
    assert j.shape == shape
    np.testing.assert_array_equal(comparable(j), comparable(jax_values(x)))
    if x.numel() == 0:
        assert route.kind == "zero-copy" and route.needs & Need.EMPTY
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DLInspectWarning)
            assert dlinspect.to_jax(x, copy=False).shape == shape


# ---- refusals ----------------------------------------------------------------------------------

def _refusal_is_clean(t, words):
    """The refusal: ProducerError (a BufferError) in torch's words, the same from plan,
    to_jax, to_host and inside a batch; the tensor is left as it was (its version counter)."""
    version = t._version
    route = dlinspect.plan(t)
    assert route.kind == "error" and isinstance(route.error, ProducerError)
    for fn in (dlinspect.to_jax, dlinspect.to_host):
        with pytest.raises(ProducerError) as info:
            fn(t)
        assert isinstance(info.value, BufferError)
        assert words in str(info.value)
    with pytest.raises(ProducerError) as info:
        dlinspect.to_jax({"batch": [t]})
    assert info.value.key_path == "['batch'][0]"
    assert t._version == version


def test_dlpack_export_requires_grad():
    """peer: test_dlpack_export_requires_grad: refused, in torch's words (dlinspect's error
    caused by torch's own: a BufferError, or on torch 2.3 a RuntimeError); detach() works."""
    x = torch.zeros(10, dtype=torch.float32, requires_grad=True)
    _refusal_is_clean(x, "require gradient")
    with pytest.raises((BufferError, RuntimeError)) as torch_own:
        x.__dlpack__()
    cause = pytest.raises(ProducerError, dlinspect.to_jax, x).value.__cause__
    assert type(cause) is type(torch_own.value) and str(cause) == str(torch_own.value)
    np.testing.assert_array_equal(np.asarray(dlinspect.to_jax(x.detach())), np.zeros(10))
    assert x.requires_grad and x.grad is None


def test_dlpack_export_is_conj():
    """peer: test_dlpack_export_is_conj: the lazy conjugate bit is refused ("conjugate bit");
    resolve_conj() gives the conjugated values."""
    x = torch.tensor([-1 + 1j, -2 + 2j, 3 - 3j])
    y = torch.conj(x)
    _refusal_is_clean(y, "conjugate bit")
    np.testing.assert_array_equal(np.asarray(dlinspect.to_jax(y.resolve_conj())),
                                  np.conj(x.numpy()))


def test_lazy_negative_bit():
    """peer: test_dlpack_export_is_conj's sibling, the negative bit (x.conj().imag).

    deliberate difference from torch: torch's __dlpack__ exports a tensor with the lazy
    negative bit without applying it (torch.from_dlpack and numpy.from_dlpack then read the
    values un-negated); dlinspect refuses it (ProducerError naming resolve_neg())."""
    # deliberate difference from torch: __dlpack__ exports a tensor with the lazy negative bit
    # un-negated; dlinspect refuses it (ProducerError)
    x = torch.tensor([1 + 1j, 2 - 2j, -3 + 0.5j])
    neg = x.conj().imag
    assert neg.is_neg()
    np.testing.assert_array_equal(np.from_dlpack(neg), -neg.numpy(force=True))  # torch's export
    _refusal_is_clean(neg, "resolve_neg()")
    with pytest.raises(ProducerError):
        dlinspect.to_host(neg, copy=True)
    np.testing.assert_array_equal(np.asarray(dlinspect.to_jax(neg.resolve_neg())),
                                  np.array([-1.0, 2.0, -0.5], np.float32))


def test_dlpack_export_non_strided():
    """peer: test_dlpack_export_non_strided: a sparse tensor is refused ("strided")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # torch's sparse-invariants notice
        x = torch.sparse_coo_tensor([[0]], [1.0], size=(1,))
    _refusal_is_clean(x, "strided")


def test_dlpack_unsupported_dtype_error():
    """peer: test_dlpack_unsupported_dtype_error: quantized tensors are refused in torch's
    words ("types are not supported by dlpack")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # quantized creation is deprecated
        x = torch.quantize_per_tensor(torch.randn(()), 0.1, 10, torch.qint8)
    _refusal_is_clean(x, "types are not supported by dlpack")


def test_unsupported_device_error():
    """peer: test_unsupported_device_error: a tensor that says it is on kDLHexagon.

    dlinspect finds the capsule's header (kDLCPU) disagreeing with __dlpack_device__ and
    refuses with ProducerError (a BufferError), reading nothing; a producer really on
    kDLHexagon that cannot give a host copy is an UnsupportedDeviceError listing what was
    tried."""
    w = TensorDLPackWrapper(torch.arange(3.0), (D.kDLHexagon, 0))
    for fn in (dlinspect.peek, dlinspect.to_jax, dlinspect.to_host):
        with pytest.raises(ProducerError) as info:
            fn(w)
        assert "kDLHexagon" in str(info.value) and isinstance(info.value, BufferError)
    p = FakeProducer(np.arange(3, dtype=np.float32), (D.kDLHexagon, 0), host_copy=False)
    assert dlinspect.plan(p).kind == "host-fallback"
    with pytest.raises(UnsupportedDeviceError) as info:
        dlinspect.to_jax(p)
    assert "Tried" in str(info.value) and isinstance(info.value, BufferError)
    assert {"dl_device": (1, 0), "copy": True}.items() <= p.calls[-1].items()


# ---- protocol ---------------------------------------------------------------------------------

def test_automatically_select_in_creation():
    """peer: test_automatically_select_in_creation: an object with only __dlpack__ and
    __dlpack_device__ is taken through them, without a copy."""
    t = torch.rand(10)
    wrap = TensorDLPackWrapper(t)
    route, y = to_jax_checked(wrap, t.data_ptr())
    assert route.kind == "zero-copy"
    np.testing.assert_array_equal(np.asarray(y), t.numpy())
    h = dlinspect.to_host(wrap)
    assert h.ctypes.data == t.data_ptr()
    assert wrap.calls and all(call.get("stream") is None for call in wrap.calls)


def test_dlpack_cpu_stream_is_none():
    """peer: test_dlpack_invalid_cpu_stream / test_dlpack_tensor_invalid_stream: torch asserts
    stream is None on CPU; dlinspect never passes another stream for CPU memory."""
    wrap = TensorDLPackWrapper(torch.ones(4))
    dlinspect.peek(wrap), dlinspect.plan(wrap), dlinspect.to_jax(wrap)
    dlinspect.to_jax(wrap, copy=True), dlinspect.to_host(wrap, copy=True)
    dlinspect.to_jax(wrap, device=jax.devices("cpu")[0])
    assert len(wrap.calls) >= 6 and all(call.get("stream") is None for call in wrap.calls)


@pytest.mark.parametrize("kwargs", [{}, {"max_version": (0, 8)}, {"max_version": (1, 0)},
                                    {"max_version": (2, 0)}], ids=str)
def test_max_version(kwargs):
    """peer: test_max_version: legacy capsules for max_version None and (0, 8), versioned ones
    for (1, 0) and (2, 0); dlinspect reads and takes each (a consumer that knows 1.x takes a
    smaller version's capsule)."""
    inp = make_tensor((5,), torch.float32)
    if kwargs and not TORCH_VERSIONED:
        with pytest.raises(TypeError):
            inp.__dlpack__(**kwargs)
        pytest.skip(f"torch {torch.__version__}'s __dlpack__ takes no max_version")
    versioned = kwargs.get("max_version", (0, 0))[0] >= 1
    name = "dltensor_versioned" if versioned else "dltensor"
    cap = inp.__dlpack__(**kwargs)
    info = dlinspect.peek(cap)
    assert info.capsule_name == name
    assert (info.version is not None and info.version[0] == 1) == versioned
    route, out = to_jax_checked(cap, inp.data_ptr())
    assert route.kind == "zero-copy"
    np.testing.assert_array_equal(np.asarray(out), inp.numpy())
    h = dlinspect.to_host(inp.__dlpack__(**kwargs))
    np.testing.assert_array_equal(h, inp.numpy())
    assert h.flags.writeable == versioned


@pytest.mark.parametrize("dtype", [d for d in TORCH_DTYPES if d is not torch.bfloat16], ids=dt_id)
def test_numpy_dlpack_protocol_conversion(dtype):
    """peer: test_numpy_dlpack_protocol_conversion: torch -> NumPy (to_host), and t.numpy()
    back into a consumer: the same values, the same memory (data_ptr) where planned."""
    t = make_tensor((5,), dtype)
    arr = dlinspect.to_host(t)
    np.testing.assert_array_equal(arr, t.numpy())
    t_arr = t.numpy()
    route, res = to_jax_checked(t_arr, t.data_ptr())
    np.testing.assert_array_equal(comparable(res), comparable(jax_values(t)))
    assert route.kind == ("copy" if dtype in NARROWED else "zero-copy")


@pytest.mark.parametrize("copy", [None, False, True])
@pytest.mark.parametrize("device", [None, "cpu"])
def test_from_dlpack_copy_and_device(device, copy):
    """peer: _test_from_dlpack (test_copy, test_no_copy) on CPU: the result is on the asked
    device; it is moved (same data_ptr) for copy=False or copy=None on the same device, and
    copied for copy=True."""
    inp = make_tensor((5,), torch.float32)
    dev = jax.devices(device)[0] if device else None
    route, out = to_jax_checked(inp, inp.data_ptr(), device=dev, copy=copy)
    np.testing.assert_array_equal(np.asarray(out), inp.numpy())
    assert out.devices() == {jax.devices("cpu")[0]}
    assert (out.unsafe_buffer_pointer() == inp.data_ptr()) == (copy is not True)
    h = dlinspect.to_host(inp, copy=copy)
    assert (h.ctypes.data == inp.data_ptr()) == (copy is not True)


def test_needs_copy_error():
    """peer: test_needs_copy_error: memory on another device with copy=False is a ValueError
    (dlinspect: CopyRequiredError), for JAX and for NumPy, and nothing was asked of the
    producer beyond the export."""
    p = FakeProducer(np.arange(5, dtype=np.float32), (D.kDLCUDA, 0))
    for fn in (dlinspect.to_jax, dlinspect.to_host):
        with pytest.raises(CopyRequiredError) as info:
            fn(p, copy=False)
        assert isinstance(info.value, ValueError)
    assert not any("dl_device" in call for call in p.calls)


# ---- capsules consumed once ---------------------------------------------------------------------

def test_capsule_consumed_twice():
    """peer: torch.from_dlpack's "DLTensor capsules can be consumed only once": a capsule
    dlinspect took is refused by torch (RuntimeError) and by dlinspect (CapsuleConsumedError,
    a ValueError); one torch took is refused by dlinspect before anything is read."""
    t = make_tensor((4,), torch.float32)
    cap = t.__dlpack__()
    y = dlinspect.to_jax(cap)
    np.testing.assert_array_equal(np.asarray(y), t.numpy())
    with pytest.raises(RuntimeError):
        torch.from_dlpack(cap)
    with pytest.raises(CapsuleConsumedError):
        dlinspect.to_jax(cap)
    cap2 = torch_capsule(t, (1, 0))
    back = torch.from_dlpack(cap2)
    assert back.data_ptr() == t.data_ptr()
    for fn in (dlinspect.peek, dlinspect.to_jax, dlinspect.to_host):
        with pytest.raises(CapsuleConsumedError) as info:
            fn(cap2)
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_failed_route_leaves_capsule_for_torch(max_version):
    """peer: the consumed-once rule, on dlinspect's error path: a route that raises
    (a view this jaxlib cannot view, misaligned or strided, with copy=False) leaves the
    capsule for torch.from_dlpack to take."""
    if max_version and not TORCH_VERSIONED:
        pytest.skip(f"torch {torch.__version__}'s __dlpack__ takes no max_version")
    t = make_tensor((9,), torch.float32)
    view = copy_needed_view(t)
    cap = view.__dlpack__(max_version=max_version) if max_version else view.__dlpack__()
    with pytest.raises(CopyRequiredError):
        dlinspect.to_jax(cap, copy=False)
    assert dlinspect.plan(cap, copy=False).kind == "error"
    back = torch.from_dlpack(cap)
    assert back.data_ptr() == view.data_ptr()
    torch.testing.assert_close(back, view)
