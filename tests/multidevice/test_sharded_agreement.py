"""plan(x, sharding=S) says what to_jax(x, sharding=S) then does, as a property over
4 forced CPU devices: 1-D and 2-D meshes, split and replicated specs, uneven splits,
misaligned, strided, read-only and narrowed (int64, x64 off) memory, leaves under and
over the 1 MiB that is copied in C, and copy=None/False/True, readonly="copy"/"share".

- ``plan(...).kind == "error"`` exactly when to_jax raises, and then it raises
  ``type(route.error)``; a failed call consumes nothing;
- ``"zero-copy"`` exactly when every addressable shard views the producer's memory at
  its slice's first element (``unsafe_buffer_pointer``);
- a route with a warning is exactly one that warns, and the values are the producer's
  (narrowed as JAX narrows them where it does), on the sharding asked for.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLInspectWarning  # noqa: E402
from dlinspect.testing import FLAG_READ_ONLY, DeleterCounter, aligned_empty, make_capsule  # noqa: E402

#: The property tests' depth (.ci/run's version stacks draw a tenth).
SCALE = float(os.environ.get("DLINSPECT_AGREEMENT_SCALE", "1"))
MESH_1D = Mesh(np.array(jax.devices()), ("data",))
MESH_2D = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
SPECS = [
    NamedSharding(MESH_1D, P("data")), NamedSharding(MESH_1D, P()),
    NamedSharding(MESH_1D, P(None, "data")), NamedSharding(MESH_2D, P("a", "b")),
    NamedSharding(MESH_2D, P(("a", "b"))), NamedSharding(MESH_2D, P("a")),
    NamedSharding(MESH_2D, P(None, "b")), NamedSharding(MESH_2D, P()),
]
#: (rows, columns): even and uneven splits, small leaves and leaves whose slices are
#: under and over the 1 MiB the core copies in C.
SHAPES = [(8, 4), (4, 6), (6, 4), (12, 2), (8, 3), (8, 65600), (8, 140000)]


@st.composite
def leaves(draw):
    return dict(shape=draw(st.sampled_from(SHAPES)),
                dtype=draw(st.sampled_from(["float32", "float32", "int64", "int32"])),
                misalign=draw(st.sampled_from([0, 0, 4, 16])),
                gaps=draw(st.booleans()), read_only=draw(st.booleans()),
                seed=draw(st.integers(0, 2**16)))


def build(h):
    """``(make, reference, counter)``: ``make()`` is a fresh capsule over the same
    memory, ``reference`` its values."""
    rng = np.random.default_rng(h["seed"])
    dt = np.dtype(h["dtype"])
    rows, cols = h["shape"]
    full = (rows, 2 * cols if h["gaps"] else cols)
    base = aligned_empty((full[0] * full[1] * dt.itemsize,), np.uint8, 64, offset=h["misalign"])
    big = base.view(dt).reshape(full)
    big[...] = rng.integers(-1000, 1000, full).astype(dt)
    view = big[:, ::2] if h["gaps"] else big
    counter = DeleterCounter()
    strides = tuple(s // dt.itemsize for s in view.strides)

    def make(counted=False):
        return make_capsule(base, address=view.__array_interface__["data"][0],
                            shape=view.shape, strides=strides, dtype=dt,
                            flags=FLAG_READ_ONLY if h["read_only"] else 0,
                            counter=counter if counted else None)
    return make, np.array(view), counter


def shares(result, info):
    """Every addressable shard views the producer's memory at its slice's start."""
    item = info.itemsize
    for shard in result.addressable_shards:
        start = info.data_ptr + sum((sl.start or 0) * st_ * item
                                    for sl, st_ in zip(shard.index, info.strides))
        if shard.data.unsafe_buffer_pointer() != start:
            return False
    return True


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(h=leaves(), sharding=st.sampled_from(SPECS), copy=st.sampled_from([None, False, True]),
       readonly=st.sampled_from(["copy", "share"]))
def test_plan_is_what_sharded_to_jax_does(h, sharding, copy, readonly):
    make, reference, counter = build(h)
    info = dlinspect.peek(make())
    route = dlinspect.plan(make(), sharding=sharding, copy=copy, readonly=readonly)
    cap = make(counted=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DLInspectWarning)
        try:
            y = dlinspect.to_jax(cap, sharding=sharding, copy=copy, readonly=readonly)
        except dlinspect.DLInspectError as exc:
            assert route.kind == "error", (route, exc)
            assert type(exc) is type(route.error), (route, exc)
            assert dlinspect._core.capsule_name(cap) == "dltensor_versioned"   # nothing taken
            return
    assert route.kind != "error", (route, h)
    warned = [w for w in caught if issubclass(w.category, DLInspectWarning)]
    assert bool(warned) == (route.warning is not None), (route, warned)
    assert y.sharding.is_equivalent_to(sharding, y.ndim) and y.shape == reference.shape
    assert shares(y, info) == (route.kind == "zero-copy"), (route.reason, h)
    expected = reference
    if route.warning is not None:   # JAX's own narrowing of the same values
        expected = np.asarray(jax.numpy.asarray(reference))
    np.testing.assert_array_equal(np.asarray(y), expected)
    if route.kind == "zero-copy":
        assert counter.calls == 0   # the shards hold the producer's memory
    del y


@pytest.mark.parametrize("rows", [8, 6])
def test_numpy_memory_dlpack_cannot_describe(rows):
    """A big-endian array has no DLPack header: plan and to_jax agree on its sharded
    route (NumPy's one copy, then split), or on the uneven split's ShardingError."""
    x = np.arange(rows * 3, dtype=">f4").reshape(rows, 3)
    sharding = SPECS[0]
    route = dlinspect.plan(x, sharding=sharding)
    if rows % 4:
        assert route.kind == "error" and isinstance(route.error, dlinspect.ShardingError)
        with pytest.raises(dlinspect.ShardingError):
            dlinspect.to_jax(x, sharding=sharding)
        return
    assert route.kind == "copy" and "split over the 4 devices" in route.reason
    y = dlinspect.to_jax(x, sharding=sharding)
    assert y.sharding == sharding
    np.testing.assert_array_equal(np.asarray(y), x.astype("=f4"))
    with pytest.raises(dlinspect.CopyRequiredError):
        dlinspect.to_jax(x, sharding=sharding, copy=False)


@st.composite
def sharding_trees(draw):
    """A pytree of shardings for the batch ``{"a": ..., "b": ..., "id": str}``: one
    sharding for all of it, or one (or None: the default device) per key."""
    one = st.one_of(st.none(), st.sampled_from(SPECS))
    if draw(st.booleans()):
        return draw(st.sampled_from(SPECS))
    return {"a": draw(one), "b": draw(one), "id": None}


@settings(max_examples=max(10, int(150 * SCALE)), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(a=leaves(), b=leaves(), sharding=sharding_trees(),
       copy=st.sampled_from([None, False, True]), readonly=st.sampled_from(["copy", "share"]),
       narrow=st.sampled_from(["warn", "ok"]), leaves_=st.sampled_from(["keep", "raise"]))
def test_plan_of_a_batch_is_what_to_jax_does(a, b, sharding, copy, readonly, narrow, leaves_):
    """plan and to_jax take the same pytree of shardings and every option; each leaf's
    route says what to_jax does with it, and a failed batch takes no capsule."""
    built = {"a": build(a), "b": build(b)}
    options = dict(sharding=sharding, copy=copy, readonly=readonly, narrow=narrow,
                   leaves=leaves_)
    infos = {k: dlinspect.peek(make()) for k, (make, _, _) in built.items()}
    routes = dlinspect.plan({"a": built["a"][0](), "b": built["b"][0](), "id": "x"}, **options)
    batch = {"a": built["a"][0](), "b": built["b"][0](), "id": "x"}
    errors = [r.error for r in routes.values() if r.kind == "error"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DLInspectWarning)
        try:
            out = dlinspect.to_jax(batch, **options)
        except dlinspect.DLInspectError as exc:
            assert type(exc) in {type(e) for e in errors}, (routes, exc)
            for k in ("a", "b"):   # nothing taken
                assert dlinspect._core.capsule_name(batch[k]) == "dltensor_versioned"
            return
    assert not errors, routes
    assert out["id"] == "x" and routes["id"].kind == "untouched"
    warned = [w for w in caught if issubclass(w.category, DLInspectWarning)]
    assert len(warned) == sum(routes[k].warning is not None for k in ("a", "b")), routes
    for k in ("a", "b"):
        y, reference = out[k], built[k][1]
        assert shares(y, infos[k]) == (routes[k].kind == "zero-copy"), (k, routes[k].reason)
        where = sharding if not isinstance(sharding, dict) else sharding[k]
        if where is not None:
            assert y.sharding.is_equivalent_to(where, y.ndim)
        expected = reference
        if routes[k].warning is not None or (narrow == "ok" and reference.dtype == np.int64):
            expected = np.asarray(jax.numpy.asarray(reference))
        np.testing.assert_array_equal(np.asarray(y + 0), expected)
