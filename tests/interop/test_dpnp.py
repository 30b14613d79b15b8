"""dpnp / dpctl on a real SYCL device: Intel's OpenCL CPU runtime (intel-opencl-rt).

The seed failure of this project: dpnp arrays export kDLOneAPI (14) memory, which no
JAX here has a backend for; ``jax.dlpack.from_dlpack`` raises TypeError ("unsupported
device type"). dlinspect routes them through host memory: it asks dpnp for a host copy
(``__dlpack__(dl_device=(kDLCPU, 0), copy=True)``), which dpnp gives, and imports that.

conftest.py points OCL_ICD_FILENAMES at the runtime pip installed before dpctl loads.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from interop_helpers import check, check_all, check_lifetime, check_no_leak, need, record_jax, reference

dpctl = need("dpctl", "dpctl")
dpnp = need("dpnp", "dpnp")

import dlinspect  # noqa: E402

ROOT = Path(__file__).parents[2]

if not dpctl.get_devices():
    pytest.skip("no SYCL device: intel-opencl-rt is not installed (pip install intel-opencl-rt) "
                f"or OCL_ICD_FILENAMES={os.environ.get('OCL_ICD_FILENAMES')!r} does not name "
                "its libintelocl.so", allow_module_level=True)

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
NARROWED = {"int64", "uint64", "float64", "complex128"}

# A regression guarded here: plan(x).warning was None on a host-fallback
# route while to_jax warned DLInspectWarning for the narrowing; check() asserts they agree.



def test_device_is_sycl_cpu():
    x = dpnp.ones(3)
    assert x.sycl_device.device_type.name == "cpu"
    kind, ordinal = x.__dlpack_device__()
    assert (int(kind), ordinal) == (14, 0)
    info = dlinspect.peek(x)
    assert str(info.device_type) == "kDLOneAPI" and not info.host_accessible


def test_jax_refuses_with_type_error():
    """What this project was started for: JAX's own consumer refuses the device."""
    import jax
    x = dpnp.arange(4, dtype=dpnp.float32)
    with pytest.raises(TypeError, match="unsupported device type"):
        jax.dlpack.from_dlpack(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    ref = reference(dtype)
    kinds = check_all("dpnp", dtype, lambda: dpnp.asarray(ref), ref)
    assert kinds[("jax", ())] == "host-fallback"
    assert kinds[("host", ())] == "host-fallback"
    assert kinds[("jax", (("copy", False),))] == "error"


@pytest.mark.parametrize("dtype", sorted(NARROWED))
def test_narrowed_values_and_no_plan_error(dtype):
    """The narrowed dtypes: JAX's values, on every option, and the plan warns as to_jax does."""
    import warnings
    ref = reference(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        for options in ({}, {"copy": True}, {"readonly": "share"}):
            route = dlinspect.plan(dpnp.asarray(ref), **options)
            y = dlinspect.to_jax(dpnp.asarray(ref), **options)
            assert route.kind == "host-fallback" and route.warning is not None
            import jax.numpy as jnp
            assert np.array_equal(np.asarray(y), np.asarray(jnp.asarray(ref)))
    check(dpnp.asarray(ref), ref, "host")


@pytest.mark.parametrize("case", ["T", "cols", "step", "reversed", "broadcast", "0-d", "empty",
                                  "large"])
def test_layouts(case):
    base = reference("float32", (4, 6))
    make, ref = {
        "T": (lambda: dpnp.asarray(base).T, base.T),
        "cols": (lambda: dpnp.asarray(base)[:, 1:3], base[:, 1:3]),
        "step": (lambda: dpnp.asarray(base)[:, ::2], base[:, ::2]),
        "reversed": (lambda: dpnp.asarray(base)[::-1], base[::-1]),
        "broadcast": (lambda: dpnp.broadcast_to(dpnp.asarray(base[0]), (4, 6)),
                      np.broadcast_to(base[0], (4, 6))),
        "0-d": (lambda: dpnp.asarray(np.float32(2.5)), np.array(2.5, np.float32)),
        "empty": (lambda: dpnp.zeros((0, 3), dtype=dpnp.float32), np.zeros((0, 3), np.float32)),
        "large": (lambda: dpnp.arange(1 << 18, dtype=dpnp.float32).reshape(512, 512),
                  np.arange(1 << 18, dtype=np.float32).reshape(512, 512)),
    }[case]
    kinds = check_all("dpnp", case, make, ref)
    assert kinds[("jax", ())] == ("zero-copy" if case == "empty" else "host-fallback")


@pytest.mark.parametrize("usm_type", ["device", "shared", "host"])
def test_usm_types(usm_type):
    ref = reference("float32")
    x = dpnp.asarray(ref, usm_type=usm_type)
    assert x.usm_type == usm_type
    assert int(x.__dlpack_device__()[0]) == 14     # every USM kind says kDLOneAPI
    check_all("dpnp", f"usm {usm_type}", lambda: dpnp.asarray(ref, usm_type=usm_type), ref)


def test_read_only():
    ref = reference("float32")

    def make():
        x = dpnp.asarray(ref)
        x.flags.writable = False
        return x
    assert dlinspect.peek(make()).read_only is True
    check_all("dpnp", "read-only", make, ref)


def test_refusals_are_clear():
    x = dpnp.arange(6, dtype=dpnp.float32)
    route = dlinspect.plan(x, fallback="raise")
    assert route.kind == "error"
    with pytest.raises(dlinspect.UnsupportedDeviceError) as raised:
        dlinspect.to_jax(x, fallback="raise")
    msg = str(raised.value)
    assert "kDLOneAPI" in msg and "fallback" in msg and "To fix" in msg
    assert isinstance(raised.value, BufferError)
    with pytest.raises(dlinspect.CopyRequiredError, match="copy=False") as raised:
        dlinspect.to_jax(x, copy=False)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(dlinspect.CopyRequiredError, match="copy=False"):
        dlinspect.to_host(x, copy=False)


def test_explain_says_host_fallback():
    text = dlinspect.explain(dpnp.ones((2, 2), dtype=dpnp.float32))
    assert "kDLOneAPI" in text and "host-fallback" in text and "dl_device=(kDLCPU, 0)" in text


def test_pytree_and_device():
    import jax
    batch = {"x": dpnp.ones((2, 3), dtype=dpnp.float32), "y": dpnp.arange(2, dtype=dpnp.int32)}
    out = dlinspect.to_jax(batch, device=jax.devices("cpu")[0])
    assert out["x"].shape == (2, 3) and out["y"].tolist() == [0, 1]


def test_prefetch():
    batches = [dpnp.full((4, 2), i, dtype=dpnp.float32) for i in range(5)]
    got = [float(b.sum()) for b in dlinspect.prefetch_to_jax(iter(batches))]
    assert got == [8.0 * i for i in range(5)]


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: dpnp.asarray(ref), ref,
                   churn=lambda: dpnp.full(4096, -1.0, dtype=dpnp.float32))


def test_device_memory_freed():
    """The device array goes when the caller lets go of it (only the host copy lives)."""
    import weakref
    x = dpnp.arange(1 << 16, dtype=dpnp.float32)
    usm = x.get_array()
    ref = weakref.ref(usm)
    y = dlinspect.to_jax(x)
    del x, usm
    gc.collect()
    assert ref() is None
    assert float(y[-1]) == (1 << 16) - 1


def test_no_leak():
    check_no_leak(dpnp.arange(1024, dtype=dpnp.float32))


def test_example_foreign_device():
    env = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_FILENAMES", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning",
                           str(ROOT / "examples" / "foreign_device.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "x.__dlpack_device__() = (14, 0)" in out
    assert "TypeError: Array passed to from_dlpack is on unsupported device type" in out
    assert "route to jax: host-fallback" in out
    assert "route: host-fallback" in out and "values equal dpnp.asnumpy(x): True" in out
    assert "UnsupportedDeviceError (a BufferError)" in out
    assert "CopyRequiredError (a ValueError)" in out
    record_jax("dpnp", "example", dpnp.ones(2), "host-fallback")
