"""PaddlePaddle as a DLPack producer: paddle.Tensor.

paddle.Tensor defines the DLPack 1.3 C exchange API (``__dlpack_c_exchange_api__``):
dlinspect reads headers through it (peek makes no capsule), and takes the tensor through
``__dlpack__``, so that paddle's own refusals (requires grad) hold. Its
``__dlpack_device__`` says ``(kDLCPU, None)``: a None device id, which dlinspect takes
from the header and on which ``jax.dlpack.from_dlpack`` raises TypeError. With strided
kernels on (paddle's default), transposes and slices are strided views.
"""

from __future__ import annotations

import numpy as np
import pytest

from interop_helpers import check_all, check_lifetime, check_no_leak, need, record_jax, reference

paddle = need("paddle", "paddlepaddle")

import dlinspect  # noqa: E402

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16", "float32",
          "float64", "complex64", "complex128"]


def tensor(ref, dtype=None):
    import ml_dtypes
    if ref.dtype == ml_dtypes.bfloat16:
        return paddle.to_tensor(ref.astype(np.float32)).astype("bfloat16")
    return paddle.to_tensor(ref)



def test_device_and_exchange_api():
    x = paddle.to_tensor([1.0, 2.0])
    kind, ordinal = x.__dlpack_device__()
    assert int(kind) == 1 and ordinal is None
    assert "__dlpack_c_exchange_api__" in type(x).__dict__
    info = dlinspect.peek(x)
    assert (int(info.device_type), info.device_id) == (1, 0)
    assert info.version is None           # read through the exchange API: no capsule made


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    ref = reference(dtype)
    kinds = check_all("paddle", dtype, lambda: tensor(ref), ref)
    assert kinds[("host", ())] == "zero-copy"
    narrowed = dtype in ("int64", "float64", "complex128")
    assert kinds[("jax", ())] == ("copy" if narrowed else "zero-copy")


@pytest.mark.parametrize("case", ["T", "cols", "step", "rows", "0-d", "empty", "large"])
def test_layouts(case):
    base = reference("float32", (4, 6))
    make, ref = {
        "T": (lambda: tensor(base).T, base.T),
        "cols": (lambda: tensor(base)[:, 1:3], base[:, 1:3]),
        "step": (lambda: tensor(base)[:, ::2], base[:, ::2]),
        "rows": (lambda: tensor(base)[1:3], base[1:3]),
        "0-d": (lambda: paddle.to_tensor(np.float32(2.5)), np.array(2.5, np.float32)),
        "empty": (lambda: paddle.zeros([0, 3]), np.zeros((0, 3), np.float32)),
        "large": (lambda: paddle.arange(1 << 18, dtype="float32").reshape([512, 512]),
                  np.arange(1 << 18, dtype=np.float32).reshape(512, 512)),
    }[case]
    check_all("paddle", case, make, ref)


def test_dunder_dlpack_path_too():
    """paddle's own __dlpack__ capsule (what a consumer without the exchange API gets)."""
    ref = reference("float32")
    x = tensor(ref)
    cap = x.__dlpack__(max_version=(1, 3))
    route = dlinspect.plan(cap)
    y = dlinspect.to_jax(cap)
    assert route.kind == "zero-copy" and np.array_equal(np.asarray(y), ref)


def test_requires_grad_refused_by_paddle():
    x = paddle.to_tensor(np.ones(3, np.float32), stop_gradient=False)
    with pytest.raises(BufferError, match="requires gradients"):
        x.__dlpack__(max_version=(1, 3))
    record_jax("paddle", "requires grad", x, dlinspect.plan(x).kind)


# A regression guarded here: dlinspect took such a tensor through paddle's C exchange API, which
# makes none of __dlpack__'s refusals (the guards existed for torch only).
def test_requires_grad_is_a_producer_error():
    x = paddle.to_tensor(np.ones(3, np.float32), stop_gradient=False)
    route = dlinspect.plan(x)
    assert route.kind == "error" and isinstance(route.error, dlinspect.ProducerError)
    with pytest.raises(dlinspect.ProducerError, match="requires gradients"):
        dlinspect.to_jax(x)


def test_detached_is_fine():
    x = paddle.to_tensor(np.ones(3, np.float32), stop_gradient=False)
    y = dlinspect.to_jax(x.detach())
    assert np.array_equal(np.asarray(y), np.ones(3, np.float32))


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: paddle.to_tensor(ref), ref,
                   churn=lambda: paddle.full([4096], -1.0, dtype="float32"))


def test_no_leak():
    check_no_leak(paddle.arange(1024, dtype="float32"))
