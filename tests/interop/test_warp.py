"""NVIDIA Warp (warp-lang) as a DLPack producer: warp arrays on its "cpu" device.

Warp's ``__dlpack__(self, stream=None)`` predates the array API's ``max_version``,
``dl_device`` and ``copy``: it raises TypeError for them, and dlinspect calls it again
without keywords. It exports legacy "dltensor" capsules; vector and matrix dtypes
(vec3, mat22) arrive as trailing axes of their scalar type, and its views (rows,
columns, transposes) carry their strides.
"""

from __future__ import annotations

import numpy as np
import pytest

from interop_helpers import check_all, check_lifetime, check_no_leak, need, reference

wp = need("warp", "warp-lang")
wp.config.quiet = True
wp.init()

import dlinspect  # noqa: E402

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]


def array(ref, dtype=None):
    return wp.array(ref, dtype=dtype or getattr(wp, ref.dtype.name), device="cpu")


def test_old_signature():
    x = array(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="max_version"):
        x.__dlpack__(max_version=(1, 3))
    info = dlinspect.peek(x)           # called again without keywords
    assert info.version is None and info.shape == (3,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    ref = reference(dtype)
    kinds = check_all("warp", dtype, lambda: array(ref), ref)
    assert kinds[("host", ())] == "zero-copy"
    narrowed = dtype in ("int64", "uint64", "float64")
    assert kinds[("jax", ())] == ("copy" if narrowed else "zero-copy")   # warp aligns to 64


@pytest.mark.parametrize("case", ["vec3", "mat22", "T", "row", "rows", "cols", "empty", "large"])
def test_layouts(case):
    base = reference("float32", (4, 6))
    make, ref = {
        "vec3": (lambda: array(base.reshape(8, 3), wp.vec3), base.reshape(8, 3)),
        "mat22": (lambda: array(base.reshape(6, 2, 2), wp.mat22), base.reshape(6, 2, 2)),
        "T": (lambda: array(base).transpose(), base.T),
        "row": (lambda: array(base)[1], base[1]),
        "rows": (lambda: array(base)[1:3], base[1:3]),
        "cols": (lambda: array(base)[:, 1:3], base[:, 1:3]),
        "empty": (lambda: wp.zeros((0, 3), dtype=wp.float32, device="cpu"),
                  np.zeros((0, 3), np.float32)),
        "large": (lambda: array(np.arange(1 << 18, dtype=np.float32).reshape(512, 512)),
                  np.arange(1 << 18, dtype=np.float32).reshape(512, 512)),
    }[case]
    check_all("warp", case, make, ref)


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: array(ref), ref,
                   churn=lambda: wp.full(4096, -1.0, dtype=wp.float32, device="cpu"))


def test_no_leak():
    check_no_leak(array(np.arange(1024, dtype=np.float32)), n=10_000)
