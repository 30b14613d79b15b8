"""array-api-strict as a DLPack producer: the array API standard's reference namespace.

It wraps NumPy arrays and exports them with NumPy's ``__dlpack__`` (DLPack 1.0
versioned capsules, the READ_ONLY flag for read-only memory); all of its test devices
("CPU_DEVICE", "device1", "device2"...) report kDLCPU. No float16 or bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest

from interop_helpers import check_all, check_lifetime, check_no_leak, need, reference

xp = need("array_api_strict", "array-api-strict")

import dlinspect  # noqa: E402

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128"]



@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    ref = reference(dtype)
    kinds = check_all("array_api_strict", dtype, lambda: xp.asarray(ref), ref)
    assert kinds[("host", ())] == "zero-copy"


@pytest.mark.parametrize("case", ["mT", "cols", "step", "reversed", "0-d", "empty", "aligned",
                                  "read-only", "read-only aligned"])
def test_layouts(case):
    base = reference("float32", (4, 6))
    aligned = dlinspect.testing.aligned_array(base, np.float32)
    ro = base.copy()
    ro.flags.writeable = False
    ro_aligned = dlinspect.testing.aligned_array(base, np.float32)
    ro_aligned.flags.writeable = False
    make, ref = {
        "mT": (lambda: xp.asarray(base).mT, base.T),
        "cols": (lambda: xp.asarray(base)[:, 1:3], base[:, 1:3]),
        "step": (lambda: xp.asarray(base)[:, ::2], base[:, ::2]),
        "reversed": (lambda: xp.flip(xp.asarray(base), axis=0), base[::-1]),
        "0-d": (lambda: xp.asarray(2.5, dtype=xp.float32), np.array(2.5, np.float32)),
        "empty": (lambda: xp.zeros((0, 3), dtype=xp.float32), np.zeros((0, 3), np.float32)),
        "aligned": (lambda: xp.asarray(aligned), base),
        "read-only": (lambda: xp.asarray(ro), base),
        "read-only aligned": (lambda: xp.asarray(ro_aligned), base),
    }[case]
    kinds = check_all("array_api_strict", case, make, ref)
    if case == "aligned":
        assert kinds[("jax", ())] == "zero-copy"
    if case.startswith("read-only"):
        assert dlinspect.peek(make()).read_only is True
        assert kinds[("jax", ())] == "copy"
    if case == "read-only aligned":
        assert kinds[("jax", (("readonly", "share"),))] == "zero-copy"


@pytest.mark.parametrize("device", ["CPU_DEVICE", "device1", "device2"])
def test_devices_are_host(device):
    dev = next(d for d in xp.__array_namespace_info__().devices() if device in str(d))
    x = xp.asarray([1.0, 2.0], dtype=xp.float32, device=dev)
    assert int(x.__dlpack_device__()[0]) == 1
    check_all("array_api_strict", f"device {device}",
              lambda: xp.asarray([1.0, 2.0], dtype=xp.float32, device=dev),
              np.array([1.0, 2.0], np.float32))


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: xp.asarray(ref.copy()), ref,
                   churn=lambda: xp.full((4096,), -1.0, dtype=xp.float32))


def test_no_leak():
    check_no_leak(xp.asarray(dlinspect.testing.aligned_array(np.arange(1024.0), np.float32)))
