"""A tensor on a device JAX has no backend for, converted through host memory.

A dpnp array lives on a SYCL device (here Intel's OpenCL CPU runtime, installed from
PyPI), and its DLPack export says kDLOneAPI (14). jax.dlpack.from_dlpack refuses it
("unsupported device type"); dlinspect says why, goes through host memory with the
right values, and gives clear errors where asked not to.

Needs: pip install dpctl dpnp intel-opencl-rt   (bash scripts/interop.sh installs them)
Run:   python examples/foreign_device.py
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def point_opencl_at_pip_runtime():
    """intel-opencl-rt's ICD file names its library by a conda placeholder path that pip
    does not rewrite, so the OpenCL ICD loader finds no platform and SYCL no device.
    Naming the library in OCL_ICD_FILENAMES (before dpctl is imported) fixes that."""
    if os.environ.get("OCL_ICD_FILENAMES"):
        return
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        lib = os.path.join(prefix, "lib", "libintelocl.so")
        if os.path.exists(lib):
            os.environ["OCL_ICD_FILENAMES"] = lib
            return


point_opencl_at_pip_runtime()

try:
    import dpctl
    import dpnp
except ImportError as exc:
    sys.exit(f"this example needs dpnp and an OpenCL CPU runtime ({exc}); install them with:\n"
             f"    pip install dpctl dpnp intel-opencl-rt")

import jax
import numpy as np

import dlinspect

if not dpctl.get_devices():
    sys.exit("no SYCL device found: install intel-opencl-rt (the OpenCL CPU runtime), and if "
             "it is installed elsewhere, set OCL_ICD_FILENAMES to its libintelocl.so")


def section(title):
    print(f"\n== {title}")


x = dpnp.arange(12, dtype=dpnp.float32).reshape(3, 4) * 0.5
expected = dpnp.asnumpy(x)
print(f"dpnp {dpnp.__version__}, dpctl {dpctl.__version__}, jax {jax.__version__}, "
      f"dlinspect {dlinspect.__version__}")
print(f"x: dpnp.ndarray {x.dtype}{list(x.shape)} on {x.sycl_device.name!r} "
      f"({x.sycl_device.backend.name}, {x.sycl_device.device_type.name})")
kind, ordinal = x.__dlpack_device__()
print(f"x.__dlpack_device__() = ({int(kind)}, {ordinal})   # {kind!r}")

section("jax.dlpack.from_dlpack(x)")
try:
    jax.dlpack.from_dlpack(x)
    print("returned (unexpected: this JAX takes kDLOneAPI memory)")
except Exception as exc:  # noqa: BLE001 - showing whatever JAX raises
    msg = str(exc).splitlines()[0] if str(exc) else ""
    if ", array:" in msg:   # JAX prints the whole array after this
        msg = msg.split(", array:")[0] + ")"
    print(f"{type(exc).__name__}: {msg}")

section("dlinspect.explain(x)")
print(dlinspect.explain(x))

section("dlinspect.to_jax(x)")
y = dlinspect.to_jax(x)
same = np.array_equal(np.asarray(y), expected)
print(f"route: {dlinspect.plan(x).kind}; got {type(y).__name__} {y.dtype}{list(y.shape)} "
      f"on {y.devices()}; values equal dpnp.asnumpy(x): {same}")
print(np.asarray(y))

section("dlinspect.to_host(x)")
h = dlinspect.to_host(x)
print(f"got numpy.ndarray {h.dtype}{list(h.shape)}; values equal: {np.array_equal(h, expected)}")

for title, options in (('dlinspect.to_jax(x, fallback="raise")', {"fallback": "raise"}),
                       ("dlinspect.to_jax(x, copy=False)", {"copy": False})):
    section(title)
    print(f"plan: {dlinspect.plan(x, **options).kind}")
    try:
        dlinspect.to_jax(x, **options)
        print("returned (unexpected)")
    except dlinspect.DLInspectError as exc:
        builtin = next(b.__name__ for b in (BufferError, ValueError, TypeError)
                       if isinstance(exc, b))
        print(f"{type(exc).__name__} (a {builtin}): {exc}")

if not same:
    sys.exit("the values differ")
