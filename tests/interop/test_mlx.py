"""MLX (the Linux CPU wheel, ``mlx[cpu]``) as a DLPack producer: mlx.core.array.

MLX exports host memory (kDLCPU) as legacy "dltensor" capsules, with real strides for
its views (transposes, slices, reversals, broadcasts). Its CPU allocator puts a header
before each buffer, so data pointers are only 8-byte aligned: JAX (XLA:CPU, 64-byte
alignment) never views them, dlinspect copies once and NumPy views them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from interop_helpers import check_all, check_lifetime, check_no_leak, need, reference

mx = need("mlx.core", "mlx[cpu]")

import dlinspect  # noqa: E402

DTYPES = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64"]



def array(ref):
    import ml_dtypes
    if ref.dtype == ml_dtypes.bfloat16:
        return mx.array(ref.astype(np.float32)).astype(mx.bfloat16)
    if ref.dtype == np.float64:
        return mx.array(ref, dtype=mx.float64)
    return mx.array(ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    ref = reference(dtype)
    x = array(ref)
    assert x.itemsize == ref.itemsize
    kinds = check_all("mlx", dtype, lambda: array(ref), ref)
    assert kinds[("host", ())] == "zero-copy"


@pytest.mark.parametrize("case", ["T", "cols", "step", "reversed", "broadcast", "0-d", "empty",
                                  "lazy", "large"])
def test_layouts(case):
    base = reference("float32", (4, 6))
    make, ref = {
        "T": (lambda: array(base).T, base.T),
        "cols": (lambda: array(base)[:, 1:3], base[:, 1:3]),
        "step": (lambda: array(base)[:, ::2], base[:, ::2]),
        "reversed": (lambda: array(base)[::-1], base[::-1]),
        "broadcast": (lambda: mx.broadcast_to(array(base[0]), (4, 6)),
                      np.broadcast_to(base[0], (4, 6))),
        "0-d": (lambda: mx.array(2.5), np.array(2.5, np.float32)),
        "empty": (lambda: mx.zeros((0, 3)), np.zeros((0, 3), np.float32)),
        "lazy": (lambda: array(base) * 2 + 1, base * 2 + 1),       # evaluated by __dlpack__
        "large": (lambda: mx.arange(1 << 18, dtype=mx.float32).reshape(512, 512),
                  np.arange(1 << 18, dtype=np.float32).reshape(512, 512)),
    }[case]
    check_all("mlx", case, make, ref)


def test_eight_byte_alignment_is_explained():
    x = mx.arange(1024, dtype=mx.float32)
    info = dlinspect.peek(x)
    route = dlinspect.plan(x)
    if info.alignment < 64:
        assert route.kind == "copy" and dlinspect.Need.ALIGN in route.needs
        assert "aligned" in route.reason


def test_broadcast_host_view_is_read_only():
    h = dlinspect.to_host(mx.broadcast_to(mx.arange(3, dtype=mx.float32), (4, 3)))
    assert h.strides[0] == 0 and not h.flags.writeable


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: mx.array(ref), ref,
                   churn=lambda: mx.eval(mx.full((4096,), -1.0)) or mx.full((4096,), -1.0))


def test_no_leak():
    x = mx.arange(1024, dtype=mx.float32)
    mx.eval(x)
    check_no_leak(x)


SHARDED = textwrap.dedent("""
    import json, os, sys, warnings
    import numpy as np, jax, dlinspect, mlx.core as mx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("data",))
    ref = np.arange(64, dtype=np.float32).reshape(16, 4)
    out = {"devices": len(jax.devices()), "cases": []}
    for spec in (P("data"), P()):
        s = NamedSharding(mesh, spec)
        for copy in (None, False):
            x = mx.array(ref)
            info = dlinspect.peek(x)
            route = dlinspect.plan(x, sharding=s, copy=copy)
            case = {"spec": str(spec), "copy": copy, "plan": route.kind}
            try:
                y = dlinspect.to_jax(x, sharding=s, copy=copy)
            except dlinspect.DLInspectError as exc:
                case.update(raised=type(exc).__name__, message=str(exc),
                            plan_error=type(route.error).__name__)
            else:
                ptrs = [d.data.unsafe_buffer_pointer() for d in y.addressable_shards]
                case.update(values=bool(np.array_equal(np.asarray(y), ref)),
                            views=sum(info.data_ptr <= p < info.data_ptr + info.nbytes
                                      for p in ptrs), shards=len(ptrs))
            out["cases"].append(case)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def sharded():
    """mlx arrays sharded over 4 forced CPU devices (in a subprocess: the device count
    must be set before JAX starts)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", SHARDED], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    return out["cases"]


def test_sharded_agrees_with_plan(sharded):
    for case in sharded:
        if "raised" in case:
            assert case["plan"] == "error" and case["plan_error"] == case["raised"], case
        else:
            assert case["values"], case
            # mlx's 8-byte aligned memory: every shard is a copy
            assert case["plan"] == "copy" and case["views"] == 0, case
    assert [c["raised"] for c in sharded if c["copy"] is False] == ["CopyRequiredError"] * 2


# A regression guarded here: the CopyRequiredError described one (4, 4) shard of the (16, 4)
# tensor, without saying it was a shard.
def test_sharded_copy_error_names_the_tensor(sharded):
    for case in sharded:
        if case["copy"] is False:
            assert "(16, 4)" in case["message"] or "shard" in case["message"], case["message"]
