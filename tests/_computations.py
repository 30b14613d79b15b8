"""The differential oracle: what ``to_jax`` returns is right when computations on it are.

A value that reads back right with ``np.asarray`` can still compute wrong (a buffer whose
layout JAX lost reads back in its own order and computes in another), so results are
checked the way users use them: elementwise, indexed, reduced along each axis, flattened
and under ``jax.jit``, each against the same computation on ``jnp.asarray(np.asarray(x))``.

``views()`` draws a tensor the way users make them: a producer's array (NumPy, torch, or
a producer on a device JAX lacks, whose host copy keeps the view's memory order),
then a view of it (a transpose or permutation, F order, a slice with gaps, a reversed
axis, a broadcast, an added axis of extent 1), misaligned, read-only, 0-d or empty, of any
dtype the producers share with JAX. It gives the tensor and its NumPy reference, made by
the same operations on the same values.
"""

from __future__ import annotations

import warnings

import numpy as np

import jax
import jax.numpy as jnp

from dlinspect import DLInspectWarning
from dlinspect.testing import aligned_empty

DTYPES = ["float32", "float64", "int64", "int32", "int8", "uint8", "bool", "float16",
          "complex64", "bfloat16"]
LAYOUTS = ["C", "transpose", "permute", "F", "gaps", "reversed", "broadcast", "new-axis"]
#: "device": a producer on a device JAX has no backend for (a FakeProducer on kDLVulkan)
#: over the NumPy view: a host fallback, whose host copy keeps the view's memory order.
PRODUCERS = ["numpy", "torch", "device"]


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def views(producers=PRODUCERS):
    """A hypothesis strategy of views: ``dict`` of what to build (see :func:`build`).
    (hypothesis is imported here: the oracle alone needs none.)"""
    from hypothesis import strategies as st
    return st.composite(_draw_view)(producers)


def _draw_view(draw, producers):
    from hypothesis import strategies as st
    producer = draw(st.sampled_from(producers))
    name = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.integers(0 if draw(st.integers(0, 9)) == 0 else 1, 5))
                  for _ in range(ndim))
    layout = draw(st.sampled_from(LAYOUTS)) if ndim else "C"
    if producer == "torch" and layout == "reversed":
        layout = "gaps"   # torch has no negative strides
    return dict(producer=producer, name=name, shape=shape, layout=layout,
                perm=draw(st.permutations(range(ndim))),
                misalign=draw(st.sampled_from([0, 0, 0, 4, 16, 32])),
                read_only=producer == "numpy" and draw(st.booleans()),
                copy_into=producer == "device" and draw(st.booleans()),
                seed=draw(st.integers(0, 2**16)))


def _values(rng, dtype, n):
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind == "c":
        return (rng.integers(-50, 50, n) + 1j * rng.integers(-50, 50, n)).astype(dtype)
    if dtype.kind == "u":
        return rng.integers(0, 200, n).astype(dtype)
    if dtype.kind == "i" and dtype.itemsize == 8:   # beyond 32 bits: narrowing shows
        return rng.integers(-2**40, 2**40, n).astype(dtype)
    return rng.integers(-100, 100, n).astype(dtype)


def _view(a, h, lib):
    """The view ``h["layout"]`` of array ``a`` (NumPy or torch), by the library's own ops."""
    layout, perm = h["layout"], list(h["perm"])
    nd = a.ndim
    if layout == "transpose":
        return a.T if lib == "numpy" else a.permute(*range(nd - 1, -1, -1))
    if layout == "permute":
        return a.transpose(perm) if lib == "numpy" else a.permute(*perm)
    if layout == "gaps":
        return a[tuple(slice(None, None, 2) for _ in range(nd))]
    if layout == "reversed":
        return a[::-1]
    if layout == "new-axis":
        t = a.T if lib == "numpy" else a.permute(*range(nd - 1, -1, -1))
        return t[:, None] if lib == "numpy" else t.unsqueeze(1)
    return a


def build(h):
    """``(make, reference)``: ``make()`` gives the tensor (a fresh one each call, over the
    same memory), ``reference`` a NumPy array of its values."""
    rng = np.random.default_rng(h["seed"])
    dtype = np_dtype(h["name"])
    layout, shape = h["layout"], h["shape"]
    if layout == "broadcast":   # one row, repeated along a new leading axis
        base_shape = shape[1:]
    elif layout == "gaps":
        base_shape = tuple(2 * s for s in shape)
    elif layout == "F":
        base_shape = shape[::-1]
    else:
        base_shape = shape
    n = int(np.prod(base_shape))
    # dlinspect.stack's allocator: 64-byte aligned, or misaligned by h["misalign"] bytes
    offset = h["misalign"] // dtype.itemsize * dtype.itemsize   # elements stay whole
    base = aligned_empty(base_shape, dtype, 64, offset=offset)
    base[...] = _values(rng, dtype, n).reshape(base_shape)
    if layout == "F":
        ref_base = base.T
    else:
        ref_base = base
    if layout == "broadcast":
        reference = np.broadcast_to(ref_base, shape)
    else:
        reference = _view(ref_base, h, "numpy")
    if h["producer"] in ("numpy", "device"):
        if h["read_only"]:
            base.flags.writeable = False
        arr = base.T if layout == "F" else base
        out = np.broadcast_to(arr, shape) if layout == "broadcast" else _view(arr, h, "numpy")
        if h["producer"] == "device":
            from dlinspect.testing import DLDeviceType, FakeProducer
            return (lambda: FakeProducer(out, (DLDeviceType.kDLVulkan, 0),
                                         copy_into=h.get("copy_into", False))), np.array(reference)
        return (lambda: out), np.array(reference)
    t = _torch_of(base)
    if layout == "F":
        t = t.permute(*range(t.ndim - 1, -1, -1))
    out = t.expand(*shape) if layout == "broadcast" else _view(t, h, "torch")
    return (lambda: out), np.array(reference)


def _torch_of(base):
    import torch
    if base.dtype.name == "bfloat16":   # torch.from_numpy has no bfloat16: same bits
        return torch.from_numpy(base.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(base)


def computations(a):
    """What users compute with an array, by name (each a jax.Array)."""
    out = {"values": a, "a + 0": a + 0 if a.dtype != jnp.bool_ else a | False,
           "reshape(-1)": a.reshape(-1),
           "jit": jax.jit(lambda v: (v.reshape(-1), jnp.flip(v), v * 2))(a)}
    if a.ndim and a.shape[0]:
        out["a[-1]"] = a[-1]
    if a.ndim > 1 and a.shape[1]:
        out["a[:, 0]"] = a[:, 0]
    for axis in range(a.ndim):   # reductions whose value does not depend on their order
        if not a.size:
            out[f"sum(axis={axis})"] = jnp.sum(a, axis=axis)
        else:
            out[f"max(axis={axis})"] = jnp.max(jnp.abs(a) if a.dtype.kind == "c" else a,
                                               axis=axis)
    return out


def moves(a, want):
    """Where users take an array, by name: ``a`` as it stands, put on another device (or
    one device), put replicated over every device (where there are several), and through a
    jitted function together with a ``jnp`` array (``want``, the reference's, of ``a``'s
    shape and dtype)."""
    out = {"where it stands": a,
           "jit with a jnp array": jax.jit(lambda v, w: jnp.where(w == w, v, w))(a, want)}
    devices = jax.devices()
    if len(devices) > 1:
        # (a sharded array spans every device: gathered onto one)
        other = next((d for d in devices if d not in a.devices()), devices[-1])
        out[f"device_put to {other}"] = jax.device_put(a, other)
        mesh = jax.sharding.Mesh(np.array(devices), ("all",))
        out["device_put replicated"] = jax.device_put(
            a, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return out


def assert_computes_like(result, reference, what=""):
    """Every computation on ``result`` (a jax.Array) equals the same computation on
    ``jnp.asarray(reference)`` (NumPy values; JAX narrows 64-bit dtypes alike), where it
    stands and wherever it is moved (:func:`moves`)."""
    with warnings.catch_warnings():
        # jnp.asarray narrowing 64 bits (UserWarning; RuntimeWarning where a float64
        # overflows float32, as the result's narrowing did)
        warnings.simplefilter("ignore")
        want = jnp.asarray(reference)
    assert result.shape == want.shape and result.dtype == want.dtype, (
        what, result.shape, result.dtype, want.shape, want.dtype)
    want_all = computations(want)
    for where, moved in moves(result, want).items():
        for name, got in computations(moved).items():
            for g, w in zip(jax.tree_util.tree_leaves(got),
                            jax.tree_util.tree_leaves(want_all[name])):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w),
                                              err_msg=f"{what}: {name}, {where}")


def quietly(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with dlinspect's narrowing warning ignored (the oracle
    compares with JAX's own narrowing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DLInspectWarning)
        return fn(*args, **kwargs)


def _batch(x, **options):
    import dlinspect
    return dlinspect.to_jax({"x": x, "label": "a"}, **options)["x"]


def _prefetched(x, **options):
    import dlinspect
    (batch,) = list(dlinspect.prefetch_to_jax([{"x": x}], **options))
    return batch["x"]


def entry_points():
    """Every single-device entry point: name -> convert(x) (``device=``: the first CPU device)."""
    import dlinspect
    cpu = jax.devices("cpu")[0]
    return {
        "to_jax": lambda x: dlinspect.to_jax(x),
        "device=": lambda x: dlinspect.to_jax(x, device=cpu),
        "copy=True": lambda x: dlinspect.to_jax(x, copy=True),
        "readonly=share": lambda x: dlinspect.to_jax(x, readonly="share"),
        "batch": _batch,
        "batch device=": lambda x: _batch(x, device=cpu),
        "prefetch_to_jax": _prefetched,
    }
