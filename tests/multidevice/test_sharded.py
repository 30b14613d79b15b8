"""to_jax(..., sharding=...) and prefetch_to_jax over 4 forced CPU devices."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import dlinspect
from dlinspect import DLDeviceType as D
from dlinspect import CopyRequiredError, DLInspectWarning, ShardingError, plan, to_jax
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_array, aligned_empty, make_capsule

if len(jax.devices()) != 4:
    pytest.fail(f"expected 4 forced CPU devices, found {jax.devices()}", pytrace=False)

MESH = Mesh(np.array(jax.devices()), ("data",))
DATA = NamedSharding(MESH, P("data"))
REPLICATED = NamedSharding(MESH, P())


def aligned(values, dtype=np.float32):
    return aligned_array(values, dtype)


def shard_pointers(arr):
    return {s.device: s.data.unsafe_buffer_pointer() for s in arr.addressable_shards}


def test_aligned_batch_splits_zero_copy():
    x = aligned(np.arange(8 * 3 * 4 * 4).reshape(8, 3, 4, 4))
    route = plan(x, sharding=DATA)
    assert route.kind == "zero-copy" and route.copy_bytes == 0 and len(route.shards) == 4
    assert all(r.zero_copy for _, _, r in route.shards)
    y = to_jax(x, sharding=DATA)
    assert y.shape == x.shape and y.sharding == DATA
    np.testing.assert_array_equal(np.asarray(y), x)
    row = x[0].nbytes
    assert shard_pointers(y) == {d: x.ctypes.data + 2 * k * row for k, d in enumerate(jax.devices())}
    x[1, 0, 0, 0] = -1.0   # shard 0
    x[7, 2, 3, 3] = -2.0   # shard 3
    assert float(y[1, 0, 0, 0]) == -1.0 and float(y[7, 2, 3, 3]) == -2.0


def _xla_alignment():
    from dlinspect._core import jax_caps as caps
    return caps().cpu_alignment


def test_plan_predicts_which_shards_copy():
    # 12 rows of one float32: shards start every 12 bytes; only the first is 64-aligned.
    if _xla_alignment() <= 4:
        pytest.skip(f"XLA:CPU here views {_xla_alignment()}-byte aligned memory: every shard "
                    f"is a view (jaxlib 0.4)")
    x = aligned(np.arange(12).reshape(12, 1))
    route = plan(x, sharding=DATA)
    kinds = [r.kind for _, _, r in route.shards]
    assert kinds == ["zero-copy", "copy", "copy", "copy"] and route.kind == "copy"
    assert route.copy_bytes == 3 * 12
    y = to_jax(x, sharding=DATA)
    x[0, 0] = 100.0   # the zero-copy shard sees it
    x[3, 0] = 300.0   # the copied ones do not
    assert float(y[0, 0]) == 100.0 and float(y[3, 0]) == 3.0
    text = dlinspect.explain(x, sharding=DATA)
    assert "shard [3:6, :] -> " in text and "1 of 4 shards" in text


def test_torch_batch(torch):
    t = torch.arange(16 * 32, dtype=torch.float32).reshape(16, 32)
    assert plan(t, sharding=DATA).kind == "zero-copy"
    y = to_jax(t, sharding=DATA)
    t[15, 31] = -3.0
    assert float(y[15, 31]) == -3.0 and y.sharding == DATA


def test_uneven_batch():
    x = aligned(np.ones((10, 2)))
    route = plan(x, sharding=DATA)
    assert route.kind == "error" and isinstance(route.error, ShardingError)
    with pytest.raises(ShardingError, match=r"10 elements.*4 shards.*drop_last=True"):
        to_jax(x, sharding=DATA)
    with pytest.raises(ShardingError, match="dimensions"):
        to_jax(aligned(np.float32(1.0)), sharding=DATA)


MESH_2X2 = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))


@pytest.mark.parametrize("values, sharding, words", [
    (np.arange(6.0), DATA, r"6 elements.*4 shards"),
    (np.arange(4.0), NamedSharding(MESH, P(None, "data")), "does not fit a tensor of 1 dimensions"),
    (np.arange(16.0), NamedSharding(MESH_2X2, P("a", "b")), "does not fit a tensor of 1 dimensions"),
    (np.arange(8.0), NamedSharding(MESH_2X2, P(None, None)), "PartitionSpec has 2 entries"),
])
@pytest.mark.parametrize("kind", ["jax.Array", "jax.Array on cpu:1", "NumPy array"])
def test_sharding_that_does_not_fit_is_planned_sharding_error(values, sharding, words, kind):
    """A sharding that cannot cut the array (an axis that does not divide, a PartitionSpec
    with more entries than the array has dimensions) is the same planned ShardingError for
    a jax.Array, wherever it is, as for a NumPy array: plan says error, explain words it,
    to_jax raises it, and nothing raw escapes."""
    x = {"jax.Array": lambda: jax.numpy.asarray(values),
         "jax.Array on cpu:1": lambda: jax.device_put(values, jax.devices()[1]),
         "NumPy array": lambda: aligned(values)}[kind]()
    route = plan(x, sharding=sharding)
    assert route.kind == "error" and isinstance(route.error, ShardingError)
    assert "ShardingError" in dlinspect.explain(x, sharding=sharding)
    with pytest.raises(ShardingError, match=words):
        to_jax(x, sharding=sharding)
    with pytest.raises(ShardingError, match=words):
        to_jax({"x": x}, sharding=sharding)


def test_replicated_leaf_shares_memory():
    x = aligned(np.arange(6))
    y = to_jax(x, sharding=REPLICATED)
    assert y.sharding == REPLICATED
    assert set(shard_pointers(y).values()) == {x.ctypes.data}
    np.testing.assert_array_equal(np.asarray(y), x)


def test_mixed_dtypes_and_sharding_prefix_tree():
    batch = {"images": aligned(np.random.default_rng(0).random((8, 4, 4))),
             "labels": np.arange(8, dtype=np.int64),
             "mask": np.array([True, False] * 4),
             "meta": {"scale": aligned(np.ones(3))}}
    shardings = {"images": DATA, "labels": DATA, "mask": DATA, "meta": REPLICATED}
    with pytest.warns(DLInspectWarning, match="int64"):
        out = to_jax(batch, sharding=shardings)
    assert out["images"].dtype == np.float32 and out["labels"].dtype == np.int32
    assert out["mask"].dtype == np.bool_ and out["meta"]["scale"].sharding == REPLICATED
    for key in ("images", "labels", "mask"):
        np.testing.assert_array_equal(np.asarray(out[key]), batch[key])
        assert out[key].sharding == DATA


def test_one_sharding_for_a_whole_tree():
    out = to_jax({"a": aligned(np.ones((4, 2))), "b": [aligned(np.zeros(8))]}, sharding=DATA)
    assert out["a"].sharding == DATA and out["b"][0].sharding == DATA


def test_deleter_runs_once_after_the_last_shard():
    counter = DeleterCounter()
    cap = make_capsule(aligned(np.arange(8)), counter=counter)
    y = to_jax(cap, sharding=DATA)
    gc.collect()
    assert counter.calls == 0
    shards = [s.data for s in y.addressable_shards]
    del y
    gc.collect()
    assert counter.calls == 0       # single-device arrays still view the memory
    del shards
    gc.collect()
    assert counter.calls == 1


def test_failed_split_leaves_capsule_unconsumed():
    counter = DeleterCounter()
    cap = make_capsule(aligned(np.ones((6, 2))), counter=counter)
    with pytest.raises(ShardingError):
        to_jax(cap, sharding=DATA)
    assert dlinspect._core.capsule_name(cap) == "dltensor_versioned" and counter.calls == 0


def test_a_shard_that_fails_in_a_route_each_leaves_capsule_unconsumed(monkeypatch):
    # copy=True gives every slice a route of its own; the third shard's copy fails (a
    # MemoryError, say): the caller's capsule still owns its tensor, whole and readable.
    from dlinspect import _core
    done = []

    def third_fails(route, cap, x, tg, opts):
        done.append(route)
        if len(done) == 3:
            raise MemoryError("no memory for the third shard")
        return copy(route, cap, x, tg, opts)
    copy = _core.EXECUTORS[_core.HOST_COPY]
    monkeypatch.setitem(_core.EXECUTORS, _core.HOST_COPY, third_fails)
    counter = DeleterCounter()
    src = aligned(np.arange(8))
    cap = make_capsule(src, counter=counter)
    with pytest.raises(MemoryError, match="third shard"):
        to_jax(cap, sharding=DATA, copy=True)
    gc.collect()
    assert len(done) == 3
    assert dlinspect._core.capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(to_jax(cap, sharding=DATA) + 0), src)


def test_small_slices_copied_in_c_in_the_one_pass(monkeypatch):
    # A misaligned leaf and int64 labels (x64 off): every slice copied in C, in the one
    # sharded pass, not by the general route's executors; plan's copy bytes, the
    # producer's deleter at once (nothing views its memory), one warning per leaf, and
    # -W error on that warning leaves the capsule as it was.
    from dlinspect import _core
    for action in (_core.IMPORT, _core.HOST_COPY, _core.HOST_VIEW):
        monkeypatch.setitem(_core.EXECUTORS, action,
                            lambda *a, **k: pytest.fail("general route"))
    src = aligned_empty((8, 16), np.float32, 64, offset=16)   # every slice 16-byte aligned
    src[...] = np.arange(128).reshape(8, 16)
    counter = DeleterCounter()
    cap = make_capsule(src, counter=counter)
    route = plan(make_capsule(src), sharding=DATA)
    if _xla_alignment() > 16:
        assert route.kind == "copy" and route.copy_bytes == src.nbytes
    y = to_jax(cap, sharding=DATA)
    gc.collect()
    assert counter.calls == (1 if route.kind == "copy" else 0)
    np.testing.assert_array_equal(np.asarray(y), src)
    assert y.sharding == DATA
    labels = np.arange(8, dtype=np.int64)
    if not jax.config.jax_enable_x64:
        with pytest.warns(DLInspectWarning, match="int64") as record:
            z = to_jax({"label": labels}, sharding=DATA)["label"]
        assert len([w for w in record if w.category is DLInspectWarning]) == 1
        assert z.dtype == np.int32 and z.tolist() == list(range(8)) and z.sharding == DATA
        counter = DeleterCounter()
        cap = make_capsule(labels, counter=counter)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DLInspectWarning)
            with pytest.raises(DLInspectWarning):
                to_jax(cap, sharding=DATA)
        assert dlinspect._core.capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
        with warnings.catch_warnings():
            warnings.simplefilter("error", DLInspectWarning)
            assert to_jax(cap, sharding=DATA, narrow="ok").tolist() == list(range(8))


def test_copy_false_and_copy_true():
    misaligned = aligned_empty((8,), np.float32, 64, offset=4)
    misaligned[:] = 1
    if _xla_alignment() > 4:
        # The message is about the caller's tensor first, then the shard (found with mlx).
        with pytest.raises(CopyRequiredError, match=r"^a float32 tensor of shape \(8,\) .*its "
                                                    r"shard \[0:2\] for .* needs a copy"):
            to_jax(misaligned, sharding=DATA, copy=False)
    x = aligned(np.arange(8))
    y = to_jax(x, sharding=DATA, copy=True)
    x[0] = -1
    assert float(y[0]) == 0.0


def test_a_jax_array_copied_goes_where_it_is_asked_to():
    """copy=True with a device or a sharding: a copy there (committed), not one left on the
    array's own device; already there, a copy still (its own buffers)."""
    x = jax.numpy.arange(8.0)
    for where, placed in ((jax.devices()[1], lambda y: y.devices() == {jax.devices()[1]}),
                          (DATA, lambda y: y.sharding.is_equivalent_to(DATA, 1)),
                          (jax.devices()[0], lambda y: y.devices() == {jax.devices()[0]})):
        key = "device" if hasattr(where, "platform") else "sharding"
        route = plan(x, **{key: where}, copy=True)
        assert route.kind == "copy" and "copy=True" in route.reason
        y = to_jax(x, **{key: where}, copy=True)
        assert placed(y) and y._committed and y is not x
        assert set(shard_pointers(y).values()).isdisjoint(shard_pointers(x).values())
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a + 0)(y)), np.arange(8.0))


def test_read_only_copies_unless_shared():
    x = aligned(np.arange(8 * 16).reshape(8, 16))
    x.flags.writeable = False
    assert plan(x, sharding=DATA).kind == "copy"
    assert plan(x, sharding=DATA, readonly="share").kind == "zero-copy"
    np.testing.assert_array_equal(np.asarray(to_jax(x, sharding=DATA)), x)


def test_device_without_backend_goes_whole_then_device_put():
    p = FakeProducer(np.arange(8, dtype=np.float32), (D.kDLVulkan, 0))
    route = plan(p, sharding=DATA)
    assert route.kind == "copy" and route.shards == () and "device_put" in route.reason
    y = to_jax(p, sharding=DATA)
    assert y.sharding == DATA and y.tolist() == list(range(8))


def test_two_dimensional_mesh():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    s = NamedSharding(mesh, P("data", "model"))
    x = aligned(np.arange(4 * 32).reshape(4, 32))
    route = plan(x, sharding=s)
    assert len(route.shards) == 4   # column halves are strided: copied, values right
    y = to_jax(x, sharding=s)
    np.testing.assert_array_equal(np.asarray(y), x)
    assert y.sharding == s


def test_device_and_sharding_together_is_an_error():
    with pytest.raises(ValueError, match="not both"):
        to_jax(np.ones(4), device=jax.devices()[0], sharding=DATA)


def test_prefetch_with_sharding():
    batches = [{"x": aligned(np.full((8, 2), i))} for i in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = list(dlinspect.prefetch_to_jax(batches, sharding=DATA))
    assert [float(b["x"][0, 0]) for b in out] == [0, 1, 2, 3, 4]
    assert all(b["x"].sharding == DATA for b in out)


def test_process_local_data_path(monkeypatch):
    """A sharding spanning several processes: x is this process's part, and JAX's
    make_array_from_process_local_data builds the global array (in one process the
    global array is that part)."""
    from dlinspect import _core
    monkeypatch.setattr(_core, "spans_processes", lambda sharding: True)
    monkeypatch.setattr(_core, "_layouts", {})   # layouts cached by earlier tests
    monkeypatch.setattr(_core, "_split_views", {})   # and splits
    x = aligned(np.arange(8 * 3).reshape(8, 3))
    route = plan(x, sharding=DATA)
    assert route.kind == "copy" and "make_array_from_process_local_data" in route.reason
    y = to_jax(x, sharding=DATA)
    assert y.sharding == DATA
    np.testing.assert_array_equal(np.asarray(y), x)


class TestSplitSeenBefore:
    """A batch of a header and sharding split before (the same shape, strides, dtype,
    flags and device, at an address as aligned) is viewed as that split was, at its own
    address, without deciding it again; anything else is decided afresh."""

    @pytest.fixture(autouse=True)
    def fresh(self, monkeypatch):
        monkeypatch.setattr(dlinspect._core, "_split_views", {})

    @staticmethod
    def batch(k, offset=0):
        image = aligned_empty((8, 3, 32, 32), np.float32, 64, offset=offset)
        image[...] = np.arange(image.size, dtype=np.float32).reshape(image.shape) + k
        label = aligned_empty((64,), np.int32, 64, offset=offset)
        label[...] = np.arange(64) * (k + 1)
        return {"image": image, "label": label}

    def check(self, out, batch, views):
        from _computations import assert_computes_like
        for key, x in batch.items():
            assert out[key].sharding == DATA
            assert_computes_like(out[key], x, key)
            rows = x.shape[0] // 4
            at = {d: x.ctypes.data + k * rows * x[0].nbytes for k, d in enumerate(jax.devices())}
            assert (shard_pointers(out[key]) == at) == views, key

    def test_the_same_header_again_is_viewed_at_its_own_address(self):
        first = self.batch(0)
        self.check(to_jax(first, sharding=DATA), first, views=True)
        assert len(dlinspect._core._split_views) == 2   # one per leaf
        for k in range(1, 4):
            b = self.batch(k)
            assert plan(b, sharding=DATA)["image"].kind == "zero-copy"
            self.check(to_jax(b, sharding=DATA), b, views=True)
        assert len(dlinspect._core._split_views) == 2

    def test_another_alignment_is_decided_again(self):
        if _xla_alignment() <= 16:
            pytest.skip(f"XLA:CPU here views {_xla_alignment()}-byte aligned memory")
        first = self.batch(0)
        self.check(to_jax(first, sharding=DATA), first, views=True)
        b = self.batch(1, offset=16)
        assert plan(b, sharding=DATA)["image"].kind == "copy"
        self.check(to_jax(b, sharding=DATA), b, views=False)

    def test_another_layout_dtype_or_flag_is_decided_again(self):
        b = self.batch(0)
        to_jax(b, sharding=DATA)
        image = b["image"]
        other = {"F order": np.asfortranarray(image),
                 "float64 view": image.view(np.float64)}
        for what, x in other.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DLInspectWarning)
                y = to_jax(x, sharding=DATA)
            np.testing.assert_array_equal(np.asarray(y), x.astype(y.dtype), err_msg=what)
        image.flags.writeable = False   # the header's READ_ONLY flag: copied unless shared
        y = to_jax(image, sharding=DATA)
        assert set(shard_pointers(y).values()).isdisjoint(
            image.ctypes.data + k * 2 * image[0].nbytes for k in range(4))
        assert not y.addressable_shards[0].data.unsafe_buffer_pointer() == image.ctypes.data
        shared = to_jax(image, sharding=DATA, readonly="share")
        assert shard_pointers(shared)[jax.devices()[0]] == image.ctypes.data
        np.testing.assert_array_equal(np.asarray(y), image)

    def test_x64_turned_off_narrows_again(self):
        x = aligned(np.arange(32).reshape(8, 4), np.float64)
        jax.config.update("jax_enable_x64", True)
        try:
            y = to_jax(x, sharding=DATA)
            assert y.dtype == np.float64 and shard_pointers(y)[jax.devices()[0]] == x.ctypes.data
        finally:
            jax.config.update("jax_enable_x64", False)
        with pytest.warns(DLInspectWarning, match="narrowed"):
            y = to_jax(x, sharding=DATA)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(y), x.astype(np.float32))

    def test_deleter_runs_once_and_the_report_counts_copies_of_bare_capsules(self):
        # A bare capsule proves nothing of who else holds its memory: each batch's is copied
        # (the report's 'aliased'), and its deleter still runs once.
        counter = DeleterCounter()
        loader = dlinspect.prefetch_to_jax(
            ({"x": make_capsule(aligned(np.arange(64 * k, 64 * (k + 1)).reshape(8, 8)),
                                counter=counter)} for k in range(4)),
            sharding=DATA, size=1)
        got = [np.asarray(b["x"]) for b in loader]
        assert [g[0, 0] for g in got] == [0, 64, 128, 192]
        assert loader.report.as_dict()["['x']"]["copied_bytes"] == {"aliased": 4 * 256}
        gc.collect()
        assert counter.calls == 4


class TestLeafShapesAndPlacements:
    """Leaves of every shape and placement a batch has: negative strides, 0-d, memory kinds,
    one-device shardings, None in a sharding tree, empty batches, narrowed leaves."""

    def test_negative_strides(self):
        x = aligned(np.arange(8))[::-1]
        assert plan(x, sharding=DATA).kind == "copy"
        np.testing.assert_array_equal(np.asarray(to_jax(x, sharding=DATA)), x)
        y = aligned(np.arange(32).reshape(4, 8))[:, ::-1]
        col = NamedSharding(MESH, P(None, "data"))
        np.testing.assert_array_equal(np.asarray(to_jax(y, sharding=col)), y)

    def test_zero_d_leaf_replicated(self, torch):
        for x in (aligned(np.float32(3.0)), torch.tensor(3.0)):
            y = to_jax(x, sharding=REPLICATED)
            assert y.shape == () and float(y) == 3.0 and y.sharding == REPLICATED
        counter = DeleterCounter()
        cap = make_capsule(aligned(np.float32(2.0)), counter=counter)
        assert plan(cap, sharding=REPLICATED).kind == "zero-copy"
        assert float(to_jax(cap, sharding=REPLICATED)) == 2.0

    def test_memory_kind_is_kept(self):
        x = aligned(np.arange(8 * 4).reshape(8, 4))
        for kind in ("pinned_host", "unpinned_host"):
            try:
                s = NamedSharding(MESH, P("data"), memory_kind=kind)
            except ValueError:
                continue  # not offered by this backend
            expected = jax.device_put(x, s)
            y = to_jax(x, sharding=s)
            assert y.sharding.memory_kind == expected.sharding.memory_kind == kind
            np.testing.assert_array_equal(np.asarray(y), x)
            one = jax.sharding.SingleDeviceSharding(jax.devices()[1], memory_kind=kind)
            assert to_jax(x, sharding=one).sharding.memory_kind == kind

    def test_one_device_named_sharding_is_kept(self):
        s = NamedSharding(Mesh(np.array(jax.devices()[2:3]), ("data",)), P("data"))
        x = aligned(np.ones((8, 4)))
        y = to_jax(x, sharding=s)
        assert y.sharding == s == jax.device_put(x, s).sharding
        assert plan(x, sharding=s).kind == "zero-copy"

    def test_none_in_a_sharding_tree_is_default_placement(self):
        x = aligned(np.ones((8, 4)))
        out = to_jax({"a": x, "b": x}, sharding={"a": DATA, "b": None})
        assert out["a"].sharding == DATA and out["b"].devices() == {jax.devices()[0]}

    @pytest.mark.parametrize("call", [plan, to_jax])
    def test_bad_sharding_arguments(self, call):
        """plan refuses exactly the sharding arguments to_jax refuses, with its error."""
        x = aligned(np.ones((8, 4)))
        with pytest.raises(ValueError, match="prefix of the batch"):
            call(x, sharding={"a": DATA})
        with pytest.raises(ValueError, match="prefix of the batch"):
            call({"a": x}, sharding={"b": DATA})
        with pytest.raises(TypeError, match="jax.sharding.Sharding"):
            call(x, sharding="data")
        with pytest.raises(TypeError, match="jax.sharding.Sharding"):
            call({"a": x}, sharding={"a": "data"})

    def test_empty_batch(self):
        x = np.zeros((0, 3), np.float32)
        route = plan(x, sharding=DATA)
        assert route.kind == "zero-copy" and route.zero_copy and route.copy_bytes == 0
        y = to_jax(x, sharding=DATA, copy=False)
        assert y.shape == (0, 3) and y.sharding == DATA

    def test_one_warning_per_narrowed_leaf(self):
        with pytest.warns(DLInspectWarning) as record:
            to_jax(np.arange(8, dtype=np.int64), sharding=DATA)
        assert len(record) == 1 and record[0].filename == __file__


def test_sharded_plan_pickles():
    """A sharded plan travels with its slices' routes; each device is found again."""
    import pickle
    sharding = DATA
    x = dlinspect.testing.aligned_array(np.arange(32, dtype=np.float32).reshape(8, 4))
    route = plan(x, sharding=sharding)
    back = pickle.loads(pickle.dumps(route))
    assert back.reason == route.reason and back.jax_device == route.jax_device
    assert [(d, idx, r.kind, r.reason) for d, idx, r in back.shards] == \
        [(d, idx, r.kind, r.reason) for d, idx, r in route.shards]
    assert len(back.shards) == 4
