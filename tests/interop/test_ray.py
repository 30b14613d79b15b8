"""Ray Data batches into JAX through dlinspect: ``Dataset.iter_batches(batch_format="numpy")``
into ``to_jax``/``prefetch_to_jax``, against Ray's own ``Dataset.iter_jax_batches``.

Ray runs locally (``ray.init(num_cpus=2, include_dashboard=False)`` on 127.0.0.1, usage
stats off), once for the module: its start-up takes several seconds.

What was found (ray 2.60.0): the NumPy batches of scalar and tensor columns are mostly
views of Arrow memory, flagged read-only (NumPy exports them with the DLPack READ_ONLY
flag), so ``to_jax`` copies them by default and ``readonly="share"`` imports them without a
copy where they are 64-byte aligned; a batch that spans blocks is concatenated into fresh,
writable memory. Whether a slice is aligned depends on the batch size and the item size
(row offset * item size). ``iter_batches()`` returns a re-iterable (a new pass per
``iter()``, no ``len()``). ``iter_jax_batches`` raises on a string column; dlinspect keeps
it as a leaf.
"""

from __future__ import annotations

import gc
import os
import warnings

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from interop_helpers import convert_and_check, need, pointer_of  # noqa: E402

ray = need("ray", "ray[data]")
ray_data = need("ray.data", "ray[data]")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402

# Ray's own deprecation notices (its DataContext, its executor) are not this suite's.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                        "ignore::FutureWarning")

N = 192
BATCH = 16
NUMERIC = ("x", "w", "n", "label")


@pytest.fixture(scope="module")
def ray_session():
    started = not ray.is_initialized()
    if started:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                     log_to_driver=False, configure_logging=False)
    ray_data.DataContext.get_current().enable_progress_bars = False
    yield ray_data
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((N, 8)).astype(np.float32),    # a tensor column
            "w": rng.random(N).astype(np.float32),
            "n": np.arange(N, dtype=np.int32),
            "label": rng.integers(0, 10, N),                           # int64
            "id": np.array([f"row{i}" for i in range(N)], dtype=object)}


def rows(table):
    return [{k: v[i] for k, v in table.items()} for i in range(N)]


@pytest.fixture(scope="module")
def ds(ray_session, table):
    """One block: every batch a slice of the same Arrow buffers."""
    return ray_session.from_items(rows(table), override_num_blocks=1).materialize()


@pytest.fixture(scope="module")
def ds_blocks(ray_session, table):
    """Five blocks: batches that span two blocks are concatenated by Ray."""
    return ray_session.from_items(rows(table), override_num_blocks=5).materialize()


@pytest.mark.parametrize("blocks", ["one block", "five blocks"])
@pytest.mark.parametrize("readonly", ["copy", "share"])
def test_numpy_batches(ds, ds_blocks, table, readonly, blocks):
    source = ds if blocks == "one block" else ds_blocks
    seen = 0
    kinds = set()
    for batch in source.iter_batches(batch_size=BATCH, batch_format="numpy"):
        out, routes = convert_and_check(batch, readonly=readonly)
        assert routes["id"].kind == "untouched" and out["id"] is batch["id"]
        for key in NUMERIC:
            info = dlinspect.peek(batch[key])
            assert info.read_only is (not batch[key].flags.writeable)
            route = routes[key]
            kinds.add((key, info.read_only, route.kind))
            if info.read_only and readonly == "copy":
                assert route.kind == "copy" and "read-only" in route.reason, route
            if readonly == "share" and info.read_only and info.alignment >= 64 and key != "label":
                assert route.kind == "zero-copy", route   # (Ray's own concatenations: as proven)
            if key == "label":
                assert route.kind == "copy" and out[key].dtype == jnp.int32
        n = len(batch["w"])
        assert np.array_equal(np.asarray(out["x"]), table["x"][seen:seen + n])
        seen += n
    assert seen == N
    if blocks == "one block":   # slices of Arrow buffers: read-only, all of them
        assert {ro for _, ro, _ in kinds} == {True}
    if readonly == "copy":
        assert not any(ro and kind == "zero-copy" for _, ro, kind in kinds)
    else:
        assert any(ro and kind == "zero-copy" for _, ro, kind in kinds)


def test_alignment_follows_the_batch_size(ds):
    # A slice starts row_offset * itemsize past the start of its Arrow buffer: batches of
    # 20 float32 rows start 80 bytes apart, so at most one in four is 64-byte aligned and
    # the others are copied even with readonly="share"; batches of 16 rows start 64
    # bytes apart, all as aligned as the buffer.
    for size, step in ((20, 80), (16, 64)):
        batches = [b["w"] for b in ds.iter_batches(batch_size=size, batch_format="numpy")]
        starts = [b.ctypes.data for b in batches]
        assert [p - starts[0] for p in starts] == [i * step for i in range(len(starts))]
        kinds = [dlinspect.plan(b, readonly="share").kind for b in batches]
        assert kinds == ["zero-copy" if p % 64 == 0 else "copy" for p in starts]
        if size == 20:
            assert kinds.count("copy") >= 3 * len(kinds) // 4
        else:
            assert len(set(kinds)) == 1


def test_epochs_reiterate(ds, table):
    loader = dlinspect.prefetch_to_jax(ds.iter_batches(batch_size=BATCH, batch_format="numpy"),
                                       readonly="share", narrow="ok")
    for _ in range(2):
        got = [np.asarray(b["x"]) for b in loader]
        assert len(got) == N // BATCH
        assert np.array_equal(np.concatenate(got), table["x"])
    with pytest.raises(TypeError, match="no len"):
        len(loader)


def test_shared_arrays_outlive_the_batches(ds, table):
    # readonly="share": each jax.Array keeps its NumPy view, so Ray's buffer, alive.
    kept = []
    for batch in ds.iter_batches(batch_size=BATCH, batch_format="numpy"):
        out = dlinspect.to_jax(batch, readonly="share", narrow="ok")
        kept.append((out["x"], out["w"]))
    del batch, out
    gc.collect()
    for _ in range(2):   # more passes through Ray's executor and object store
        for _ in ds.iter_batches(batch_size=BATCH, batch_format="numpy"):
            pass
    gc.collect()
    assert np.array_equal(np.concatenate([np.asarray(x) for x, _ in kept]), table["x"])
    assert np.array_equal(np.concatenate([np.asarray(w) for _, w in kept]), table["w"])


def test_agrees_with_iter_jax_batches(ds):
    numeric = ds.select_columns(list(NUMERIC))
    ours = dlinspect.prefetch_to_jax(numeric.iter_batches(batch_size=BATCH,
                                                          batch_format="numpy"),
                                     readonly="share", narrow="ok")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = list(numeric.iter_jax_batches(batch_size=BATCH))
    for a, b in zip(ours, theirs, strict=True):
        for key in NUMERIC:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key


def test_string_columns_kept(ds, table):
    batch = dlinspect.to_jax(next(iter(ds.iter_batches(batch_size=BATCH, batch_format="numpy"))),
                             narrow="ok")
    assert list(batch["id"]) == list(table["id"][:BATCH])
    # Ray's own JAX iterator refuses them (ray 2.60: TypeError from jax.device_put).
    with warnings.catch_warnings(), pytest.raises(TypeError, match="object"):
        warnings.simplefilter("ignore")
        next(iter(ds.iter_jax_batches(batch_size=BATCH)))


def test_jitted_step(ds):
    @jax.jit
    def step(v, x, y):
        return v - 0.01 * jax.grad(lambda v: jnp.mean((x @ v - y) ** 2))(v)

    v = jnp.zeros(8)
    for batch in dlinspect.prefetch_to_jax(ds.iter_batches(batch_size=BATCH,
                                                           batch_format="numpy"),
                                           readonly="share", narrow="ok"):
        v = step(v, batch["x"], batch["w"])
    assert np.isfinite(np.asarray(v)).all()


def test_errors_name_key_paths(ds):
    batch = next(iter(ds.iter_batches(batch_size=BATCH, batch_format="numpy")))
    nested = {"cols": {"w": batch["w"]}}
    with pytest.raises(dlinspect.CopyRequiredError,
                       match=r"^\['cols'\]\['w'\].*read-only") as info:
        dlinspect.to_jax(nested, copy=False)
    assert info.value.key_path is not None
    shared = dlinspect.to_jax(nested, copy=False, readonly="share")   # aligned: a view
    assert pointer_of(shared["cols"]["w"]) == batch["w"].ctypes.data
    with pytest.raises(dlinspect.NotDLPackError, match=r"^\['id'\]"):
        dlinspect.to_jax(batch, leaves="raise", narrow="ok")
