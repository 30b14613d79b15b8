"""apache-tvm-ffi as a DLPack producer: tvm_ffi.Tensor (made with tvm_ffi.from_dlpack).

A tvm_ffi.Tensor re-exports the tensor it took, on any device, as DLPack 1.3 versioned
capsules. It cannot make copies: ``__dlpack__(dl_device=(kDLCPU, 0), copy=True)`` of a
non-CPU tensor raises BufferError, so a foreign-device tvm_ffi.Tensor has no host copy
to give, and dlinspect says so (UnsupportedDeviceError with tvm's words).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from interop_helpers import check, check_all, check_lifetime, check_no_leak, need, record_jax, reference

tvm_ffi = need("tvm_ffi", "apache-tvm-ffi")

import dlinspect  # noqa: E402
from dlinspect.testing import DeleterCounter, aligned_array, make_capsule  # noqa: E402

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]



@pytest.mark.parametrize("aligned", [False, True], ids=["numpy-aligned", "64-byte"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype, aligned):
    ref = reference(dtype)
    src = aligned_array(ref, ref.dtype) if aligned else ref.copy()
    kinds = check_all("tvm_ffi", f"{dtype}{' aligned' if aligned else ''}",
                      lambda: tvm_ffi.from_dlpack(src), ref)
    assert kinds[("host", ())] == "zero-copy"
    if aligned:
        narrowed = dtype in ("int64", "uint64", "float64", "complex128")
        assert kinds[("jax", ())] == ("copy" if narrowed else "zero-copy")


def test_bfloat16():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import ml_dtypes
    ref = (np.arange(12) - 5).astype(ml_dtypes.bfloat16).reshape(3, 4)
    src = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) - 5
    kinds = check_all("tvm_ffi", "bfloat16 (torch)", lambda: tvm_ffi.from_dlpack(src), ref)
    assert kinds[("jax", ())] == "zero-copy"


@pytest.mark.parametrize("case", ["F", "cols", "step", "reversed", "broadcast", "0-d", "empty"])
def test_layouts(case):
    base = aligned_array(reference("float32", (4, 6)), np.float32)
    ref = {"F": base.T, "cols": base[:, 1:3], "step": base[:, ::2], "reversed": base[::-1],
           "broadcast": np.broadcast_to(base[0], (4, 6)),
           "0-d": aligned_array(np.float32(2.5), np.float32).reshape(()),
           "empty": base[:0]}[case]
    if case == "broadcast":
        # NumPy exports broadcast views read-only, which tvm_ffi takes only from a
        # versioned capsule: give it one.
        make = lambda: tvm_ffi.from_dlpack(ref.__dlpack__(max_version=(1, 0)))  # noqa: E731
    else:
        make = lambda: tvm_ffi.from_dlpack(ref)  # noqa: E731
    check_all("tvm_ffi", case, make, ref)


def test_foreign_device_without_host_copy():
    """A tvm_ffi.Tensor over kDLVulkan memory (a dlinspect.testing capsule): no JAX device,
    and tvm_ffi cannot copy it to the host."""
    src = np.arange(4, dtype=np.float32)
    counter = DeleterCounter()
    x = tvm_ffi.from_dlpack(make_capsule(src, device=(7, 0), counter=counter))
    assert tuple(map(int, x.__dlpack_device__())) == (7, 0)
    with pytest.raises(BufferError):
        x.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=True)
    # plan cannot know the host copy will fail (it asks for none): documented in plan()
    for target, convert in (("jax", dlinspect.to_jax), ("host", dlinspect.to_host)):
        route = dlinspect.plan(x, target)
        assert route.kind == "host-fallback"
        with pytest.raises(dlinspect.UnsupportedDeviceError) as info:
            convert(x)
        assert "kDLVulkan" in str(info.value)
        assert "dl_device of different type not supported" in str(info.value)   # tvm's words
    check(x, src, "jax", fallback="raise")          # an UnsupportedDeviceError route
    check(x, src, "jax", copy=False)                # a CopyRequiredError route
    with pytest.raises(dlinspect.UnsupportedDeviceError, match="fallback='raise'"):
        dlinspect.to_jax(x, fallback="raise")
    with pytest.raises(dlinspect.CopyRequiredError):
        dlinspect.to_jax(x, copy=False)
    outcome = record_jax("tvm_ffi", "kDLVulkan", x, "error")
    assert outcome[0] == "raised"
    del x, info, route   # (the ExceptionInfo's traceback holds frames that hold x)
    gc.collect()
    assert counter.calls == 1


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: tvm_ffi.from_dlpack(aligned_array(ref, np.float32)), ref,
                   churn=lambda: aligned_array(np.full(4096, -1.0), np.float32))


def test_no_leak():
    check_no_leak(tvm_ffi.from_dlpack(aligned_array(np.arange(1024.0), np.float32)))
