"""plan() says what to_jax() / to_host() then do: one decision, checked as a property.

For generated headers over real memory (every layout, alignment, dtype, flag and
host device) and for real NumPy, torch and JAX tensors, through both JAX import
paths (jaxlib's own function and the public ``jax.dlpack.from_dlpack``):

- ``plan(x).kind == "zero-copy"`` exactly when the result shares the producer's
  memory (``unsafe_buffer_pointer()`` / the NumPy data pointer against
  ``peek(x).data_ptr``; an empty tensor, which has no memory, counts as shared);
- ``plan(x).kind == "error"`` exactly when the conversion raises, and then it
  raises ``type(plan(x).error)``;
- a route with a warning is exactly one that warns, and the values are the
  producer's (cast as JAX narrows them where it does).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import DLInspectWarning  # noqa: E402
from dlinspect import _core as djax  # noqa: E402
from dlinspect.testing import FLAG_READ_ONLY, FakeProducer, aligned_empty, make_capsule  # noqa: E402
from _computations import assert_computes_like  # noqa: E402

#: Generated headers per import path (two paths: twice this many in all).
EXAMPLES = int(1000 * float(os.environ.get("DLINSPECT_AGREEMENT_SCALE", "1")))

DTYPES = ["float32", "float64", "int64", "int8", "bool", "float16", "complex64", "uint16",
          "bfloat16", "float32x4", "int4"]
LAYOUTS = ["C", "F", "perm", "gaps", "broadcast", "negative"]


def _np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@st.composite
def headers(draw):
    """A capsule factory over real memory, and the NumPy view that holds its values."""
    name = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, 4)) for _ in range(ndim))
    layout = draw(st.sampled_from(LAYOUTS)) if name not in ("float32x4", "int4") else \
        draw(st.sampled_from(["C", "gaps"]))
    misalign = draw(st.sampled_from([0, 0, 2, 4, 8, 16, 32]))
    offset_in_header = draw(st.booleans())
    versioned = draw(st.booleans())
    read_only = versioned and draw(st.booleans())
    device = draw(st.sampled_from([D.kDLCPU, D.kDLCPU, D.kDLCUDAHost, D.kDLCUDAManaged]))
    seed = draw(st.integers(0, 2**16))
    return dict(name=name, shape=shape, layout=layout, misalign=misalign,
                offset_in_header=offset_in_header, versioned=versioned, read_only=read_only,
                device=device, seed=seed)


def build(h):
    """``(make, reference)``: ``make()`` gives a fresh capsule of header ``h``; ``reference``
    is a NumPy array of the values it describes (lanes as a trailing axis)."""
    rng = np.random.default_rng(h["seed"])
    shape, layout, name = h["shape"], h["layout"], h["name"]
    if name == "int4":
        n = int(np.prod(shape))
        packed = aligned_empty(((n + 1) // 2 + 64,), np.uint8, 64, offset=h["misalign"])
        packed[...] = rng.integers(0, 256, packed.shape, dtype=np.uint8)
        lo, hi = packed & 0xF, packed >> 4
        vals = np.stack([lo, hi], axis=1).reshape(-1)[:n].astype(np.int8)
        vals = np.where(vals > 7, vals - 16, vals).reshape(shape)
        kw = dict(shape=shape, dtype=(0, 4, 1))
        return (lambda: make_capsule(packed, device=(h["device"], 0), versioned=h["versioned"],
                                     flags=FLAG_READ_ONLY if h["read_only"] else 0, **kw)), vals
    lanes = 4 if name == "float32x4" else 1
    dt = np.dtype(np.float32) if lanes > 1 else _np_dtype(name)
    full = tuple(2 * s + 1 for s in shape) + ((lanes,) if lanes > 1 else ())
    base = aligned_empty((int(np.prod(full)) * dt.itemsize + 64,), np.uint8, 64,
                         offset=h["misalign"])
    base[...] = rng.integers(0, 256, base.shape, dtype=np.uint8)
    big = base[:int(np.prod(full)) * dt.itemsize].view(dt).reshape(full)
    if dt == np.bool_:
        big[...] = big.view(np.uint8) & 1
    n = int(np.prod(shape))
    lane_axis = (lanes,) if lanes > 1 else ()
    flat = big.reshape(-1)
    if layout == "C":
        view = flat[:n * lanes].reshape(shape + lane_axis)
    elif layout == "gaps":
        view = big[tuple(slice(0, 2 * s, 2) for s in shape) + (Ellipsis,)]   # 0-d: a view
    elif layout in ("F", "perm"):
        # a dense block, its axes permuted: reversed (F order) or rotated by one
        order = (tuple(range(len(shape)))[::-1] if layout == "F"
                 else tuple(range(1, len(shape))) + (0,) if shape else ())
        dense = flat[:n].reshape(tuple(shape[a] for a in order))
        view = dense.transpose(np.argsort(order)) if shape else dense
    elif layout == "broadcast":
        view = np.broadcast_to(flat[:1].reshape((1,) * len(shape)), shape)
    else:  # negative
        view = big[tuple(slice(s - 1, None, -1) if s else slice(0, 0) for s in shape)
                   + (Ellipsis,)]
    if lanes > 1:
        elem_strides = tuple(st_ // (4 * lanes) for st_ in view.strides[:-1])
        vshape = view.shape[:-1]
        kw = dict(shape=vshape, strides=elem_strides, dtype=(2, 32, lanes))
    else:
        kw = dict(shape=view.shape, strides=tuple(st_ // dt.itemsize for st_ in view.strides),
                  dtype=dt)
    address = view.__array_interface__["data"][0]
    byte_offset = 0
    if h["offset_in_header"] and view.size:
        byte_offset = address % 64
        address -= byte_offset
    flags = FLAG_READ_ONLY if h["read_only"] else 0
    keep = [base]

    def make():
        return make_capsule(keep[0], address=address, byte_offset=byte_offset,
                            device=(h["device"], 0), versioned=h["versioned"], flags=flags, **kw)
    return make, np.array(view)


def pointer_of(result):
    if isinstance(result, np.ndarray):
        return result.__array_interface__["data"][0]
    return result.addressable_data(0).unsafe_buffer_pointer()


def _on_cpu(make):
    """An uncommitted jax.Array on the CPU (where JAX's default device is a TPU too)."""
    with jax.default_device(jax.devices("cpu")[0]):
        return make()


def check(make, reference, target, **options):
    """plan() on one export, the conversion on another: they must agree."""
    info = dlinspect.peek(make())
    route = dlinspect.plan(make(), target, **options)
    convert = dlinspect.to_jax if target == "jax" else dlinspect.to_host
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DLInspectWarning)
        try:
            result = convert(make(), **options)
        except dlinspect.DLInspectError as exc:
            assert route.kind == "error", (route, exc)
            assert type(exc) is type(route.error), (route, exc)
            return route
    assert route.kind != "error", (route, info)
    warned = [w for w in caught if issubclass(w.category, DLInspectWarning)]
    assert bool(warned) == (route.warning is not None), (route, warned)
    if info.size == 0:
        assert route.kind == "zero-copy" and result.size == 0
        return route
    shares = pointer_of(result) == info.data_ptr
    assert shares == (route.kind == "zero-copy"), (route, info, shares)
    got = np.asarray(result)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference
        if route.warning is not None:   # JAX's own narrowing of the same values
            expected = np.asarray(jax.numpy.asarray(np.array(reference, order="C")))
        if got.dtype.name == "int4":
            got = got.astype(np.int8)
        assert got.shape == expected.shape, (route, got.shape, expected.shape)
        same_bits = (np.array(got, order="C").tobytes()
                     == np.array(expected.astype(got.dtype), order="C").tobytes())
        assert same_bits or np.array_equal(got, expected, equal_nan=True), (route, info)
    if target == "jax" and result.dtype.name != "int4":
        # and what users compute with it (a lost layout reads back right, computes wrong)
        assert_computes_like(result, reference, f"{route} {info}")
    return route


@pytest.mark.parametrize("path", ["direct", "public"])
def test_generated_headers(path):
    djax.force_public_api(path == "public")
    seen: dict[str, int] = {}
    try:
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(h=headers(), copy=st.sampled_from([None, False, True]),
               readonly=st.sampled_from(["copy", "share"]), tgt=st.sampled_from(["jax", "host"]))
        def run(h, copy, readonly, tgt):
            make, reference = build(h)
            options = dict(copy=copy)
            if tgt == "jax":
                options["readonly"] = readonly
            route = check(make, reference, tgt, **options)
            seen[route.kind] = seen.get(route.kind, 0) + 1
        run()
    finally:
        djax.force_public_api(False)
    assert set(seen) == {"zero-copy", "copy", "error"}, seen


def _numpy_cases():
    from dlinspect.testing import aligned_array
    ro = aligned_array(np.arange(6.0).reshape(2, 3), np.float32)
    ro.flags.writeable = False
    cases = {
        "aligned": aligned_array(np.arange(12.0).reshape(3, 4)),
        "misaligned": aligned_empty((3, 4), np.float32, 64, offset=16),
        "gaps": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
        "negative": np.arange(8, dtype=np.float32)[::-1],
        "broadcast": np.broadcast_to(np.float32(3), (2, 3)),
        "read-only": ro,
        "int64": aligned_array([1, 2**40], np.int64),
        "bool": np.array([True, False]),
        "empty": np.zeros((0, 2), np.float32),
        "0-d": np.array(5.0, np.float32),
    }
    cases["misaligned"][...] = 2
    return cases


@pytest.mark.parametrize("path", ["direct", "public"])
@pytest.mark.parametrize("tgt", ["jax", "host"])
@pytest.mark.parametrize("copy", [None, False, True])
def test_real_tensors(path, tgt, copy):
    import ml_dtypes
    djax.force_public_api(path == "public")
    try:
        makers = {name: (lambda a=a: a) for name, a in _numpy_cases().items()}
        makers["bfloat16 numpy"] = lambda: np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
        makers["jax"] = lambda: _on_cpu(lambda: jax.numpy.arange(6.0).reshape(2, 3))
        makers["vulkan"] = lambda: FakeProducer(np.arange(3, dtype=np.float32), (D.kDLVulkan, 0))
        makers["refusing"] = lambda: FakeProducer(np.ones(2), refuse=TypeError("nulls"))
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            makers.update({
                "torch": lambda: torch.arange(12.0).reshape(3, 4),
                "torch.t()": lambda: torch.arange(12.0).reshape(3, 4).t(),
                "torch expand": lambda: torch.tensor([1.0, 2.0]).expand(3, 2),
                "torch requires_grad": lambda: torch.ones(2, requires_grad=True),
                "torch neg": lambda: torch.arange(3.0)._neg_view(),
                "torch bf16": lambda: torch.arange(3, dtype=torch.bfloat16),
                "torch int64": lambda: torch.arange(3),
            })
        for name, make in makers.items():
            x = make()
            try:
                reference = dlinspect.to_host(x, copy=True)
            except dlinspect.DLInspectError:
                reference = None
            options = dict(copy=copy)
            route = dlinspect.plan(x, tgt, **options)
            if reference is None:
                assert route.kind == "error", name
                continue
            check(lambda: x, reference, tgt, **options)  # noqa: B023 (one tensor: one memory)
    finally:
        djax.force_public_api(False)


# ---- batches: zero-copy exactly where the batch owns its memory ----------------------------

#: Who else holds a leaf of a batch, or its memory: no one; the converting code's own
#: variable; a source (a list, an attribute); a new object over kept memory (a view, a
#: detached torch tensor, torch.from_numpy, np.frombuffer of a bytearray); a container a
#: source holds. Only the first two leave the leaf the batch's own.
HOLDERS = {"numpy": ["nobody", "variable", "list", "attribute", "view", "frombuffer",
                     "container"],
           "torch": ["nobody", "variable", "list", "attribute", "view", "detach", "from_numpy",
                     "container"]}
OWN = {"nobody", "variable"}


class _Source:
    """What a source keeps of the batches it hands over, and writes again."""

    def __init__(self):
        self.kept = []

    def write(self):
        torch = _torch()
        for mem in self.kept:
            if isinstance(mem, bytearray):
                mem[:] = b"\xff" * len(mem)
            elif isinstance(mem, dict):
                for v in mem.values():
                    v[...] = -1
            elif torch is not None and isinstance(mem, torch.Tensor):
                mem.fill_(-1)
            else:
                mem[...] = -1


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _leaf(holder, producer, i, source, variables):
    """A 64-byte aligned float32 leaf of values ``i``, held as ``holder`` says."""
    torch = _torch()
    values = np.full((4, 16), i, np.float32)
    if holder == "frombuffer":
        raw = bytearray(values.nbytes + 64)
        source.kept.append(raw)
        start = -np.frombuffer(raw, np.uint8).ctypes.data % 64
        out = np.frombuffer(raw, np.float32, values.size, start).reshape(values.shape)
        out[...] = values
        return out
    if producer == "torch" and holder != "from_numpy":
        kept = torch.from_numpy(values.copy()).clone()
        if holder == "detach":
            source.kept.append(kept)
            return kept.detach()
    else:
        kept = aligned_empty(values.shape, np.float32, 64)
        kept[...] = values
        if holder == "from_numpy":
            source.kept.append(kept)
            return torch.from_numpy(kept)
    if holder == "view":
        source.kept.append(kept)
        return kept[...]
    if holder in ("list", "attribute"):
        source.kept.append(kept)
    elif holder == "variable":
        variables.append(kept)
    return kept


@st.composite
def owned_batches(draw):
    producers = ["numpy"] + (["torch"] if _torch() is not None else [])
    out = []
    for _ in range(draw(st.integers(1, 4))):
        producer = draw(st.sampled_from(producers))
        out.append((draw(st.sampled_from(HOLDERS[producer])), producer, draw(st.booleans())))
    return out


@settings(max_examples=max(20, EXAMPLES // 10), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(recipe=owned_batches(), copy=st.sampled_from([None, None, False, True]))
def test_batches_zero_copy_exactly_where_they_own_their_memory(recipe, copy):
    """plan(batch) says zero-copy exactly where to_jax(batch) shares a leaf's memory; with
    copy=None that is exactly where nothing but the batch and the converting code's own
    variables holds the leaf and its memory; and whatever the source then writes, every leaf
    that was not shared on purpose (copy=False) keeps its values."""
    source, variables = _Source(), []
    flat, nested = {}, {}
    for i, (holder, producer, deep) in enumerate(recipe):
        (nested if deep else flat)[f"k{i}"] = _leaf(holder, producer, i, source, variables)
    batch = {"flat": flat, "deep": [nested]}
    del flat, nested
    if any(holder == "container" for holder, _, _ in recipe):
        source.kept.append(batch["flat"])    # a source holding an inner container
    # the converting code's own variables (not a list: the list would be a holder)
    v0, v1, v2, v3 = (variables + [None] * 4)[:4]
    del variables
    # (here, in the frame holding the variables: the converting code's own)
    routes = dlinspect.plan(batch, copy=copy, narrow="ok")
    out = dlinspect.to_jax(batch, copy=copy, narrow="ok")
    for i, (holder, _, deep) in enumerate(recipe):
        key = f"k{i}"
        where = ("deep", 0, key) if deep else ("flat", key)
        route, result, leaf = routes, out, batch
        for k in where:
            route, result, leaf = route[k], result[k], leaf[k]
        shared = pointer_of(result) == dlinspect.peek(leaf).data_ptr
        assert shared == (route.kind == "zero-copy"), (recipe, key, route)
        if copy is None:
            held_inside = not deep and any(h == "container" for h, _, _ in recipe)
            # ("container": the source holds the flat dict, whoever's leaf it is)
            owned = (holder in OWN or holder == "container") and not held_inside
            assert shared == owned, (recipe, key, route.reason)
    del v0, v1, v2, v3
    source.write()
    for i, (_, _, deep) in enumerate(recipe):
        result = out["deep"][0][f"k{i}"] if deep else out["flat"][f"k{i}"]
        if copy is not False:
            assert_computes_like(result, np.full((4, 16), i, np.float32), f"{recipe} {key}")
