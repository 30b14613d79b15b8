"""tf.data batches into JAX through dlinspect: ``Dataset.as_numpy_iterator()`` batches and
the dataset's own batches of EagerTensors (``for batch in ds``), against
``as_numpy_iterator`` + ``jnp.asarray``.

What was found (tensorflow-cpu 2.21.0): ``as_numpy_iterator`` hands NumPy views of TF's
tensors, flagged read-only (writeable False; NumPy exports them with the DLPack READ_ONLY
flag), so ``to_jax`` copies them by default and ``readonly="share"`` imports them without a
copy (TF's CPU allocator aligns to 64 bytes). The EagerTensors themselves are exported
without a read-only flag (legacy capsules): zero-copy, no option needed. ``tf.string``
features are leaves, kept (bytes object arrays from ``as_numpy_iterator``, EagerTensors from
the dataset). A ``tf.data.Dataset`` is re-iterable (one epoch per ``iter()``, with ``len()``);
``as_numpy_iterator()`` is one pass.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from interop_helpers import convert_and_check, need  # noqa: E402

tf = need("tensorflow", "tensorflow-cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402

N = 200
BATCH = 16
NUMERIC = ("x", "w", "n", "label")


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((N, 8)).astype(np.float32),
            "w": rng.random(N).astype(np.float32),
            "n": np.arange(N, dtype=np.int32),
            "label": rng.integers(0, 10, N),                          # int64
            "text": np.array([f"row{i}".encode() for i in range(N)], dtype=object)}


@pytest.fixture(scope="module")
def ds(table):
    return tf.data.Dataset.from_tensor_slices(table).batch(BATCH)


def tensor_of(leaf):
    return leaf.numpy() if isinstance(leaf, tf.Tensor) else np.asarray(leaf)


@pytest.mark.parametrize("readonly", ["copy", "share"])
def test_numpy_iterator_batches(ds, table, readonly):
    seen = 0
    for batch in ds.as_numpy_iterator():
        out, routes = convert_and_check(batch, tensor_of, readonly=readonly)
        assert routes["text"].kind == "untouched" and out["text"] is batch["text"]
        for key in NUMERIC:
            assert not batch[key].flags.writeable and dlinspect.peek(batch[key]).read_only
            route = routes[key]
            if readonly == "copy":
                assert route.kind == "copy" and "read-only" in route.reason, route
            elif key == "label":                       # int64, x64 off: narrowed
                assert route.kind == "copy" and "read-only" not in route.reason, route
            else:                                      # TF aligns to 64 bytes: views
                assert route.kind == "zero-copy", route
        n = len(batch["w"])
        assert np.array_equal(np.asarray(out["x"]), table["x"][seen:seen + n])
        seen += n
    assert seen == N


def test_eager_batches(ds, table):
    seen = 0
    for batch in ds:
        assert all(isinstance(v, tf.Tensor) for v in batch.values())
        out, routes = convert_and_check(batch, tensor_of)   # the default readonly="copy"
        assert out["text"] is batch["text"] and routes["text"].kind == "untouched"
        # (a TensorFlow tensor proves nothing about who else holds its memory: copied)
        assert {k: routes[k].kind for k in NUMERIC} == {
            "x": "copy", "w": "copy", "n": "copy", "label": "copy"}
        assert all("own its memory" in routes[k].reason for k in ("x", "w", "n"))
        assert out["label"].dtype == jnp.int32
        n = len(out["w"])
        assert np.array_equal(np.asarray(out["w"]), table["w"][seen:seen + n])
        seen += n
    assert seen == N


def test_tuple_elements_rebuilt_as_tuples(table):
    ds = tf.data.Dataset.from_tensor_slices((table["x"], table["n"])).batch(BATCH)
    for source in (ds, ds.as_numpy_iterator()):
        batch = next(iter(source))
        out = dlinspect.to_jax(batch, readonly="share")
        assert type(out) is tuple and len(out) == 2
        assert np.array_equal(np.asarray(out[0]), table["x"][:BATCH])


def test_epochs_reiterate(ds, table):
    loader = dlinspect.prefetch_to_jax(ds, narrow="ok")
    assert len(loader) == -(-N // BATCH)
    for _ in range(2):
        got = [b for b in loader]
        assert len(got) == len(loader)
        assert np.array_equal(np.concatenate([np.asarray(b["x"]) for b in got]), table["x"])
        assert [bytes(t) for b in got for t in b["text"].numpy()] == list(table["text"])
    once = dlinspect.prefetch_to_jax(ds.as_numpy_iterator(), readonly="share", narrow="ok")
    assert len(list(once)) == -(-N // BATCH)   # one pass; a second is refused, with the fix
    with pytest.raises(dlinspect.SourceExhaustedError, match="tf.data.Dataset itself"):
        list(once)


def test_agrees_with_asarray(ds):
    for batch in ds.as_numpy_iterator():
        ours = dlinspect.to_jax(batch, readonly="share", narrow="ok")
        for key in NUMERIC:
            theirs = jnp.asarray(batch[key])
            assert ours[key].dtype == theirs.dtype and ours[key].shape == theirs.shape
            assert np.array_equal(np.asarray(ours[key]), np.asarray(theirs)), key


def test_shared_arrays_outlive_the_batches(table):
    # Shared memory must stay alive with the jax.Array alone, while tf.data (with a map
    # and prefetching) allocates and frees batch after batch.
    ds = (tf.data.Dataset.from_tensor_slices(table["x"]).map(lambda v: v * 2.0)
          .batch(BATCH).prefetch(2))
    kept = [dlinspect.to_jax(b, readonly="share") for b in ds.as_numpy_iterator()]
    kept += [dlinspect.to_jax(b) for b in ds]
    gc.collect()
    for _ in range(3):
        for _ in ds:
            pass
    expected = np.concatenate([table["x"] * 2.0] * 2)
    assert np.array_equal(np.concatenate([np.asarray(k) for k in kept]), expected)


def test_jitted_step(ds):
    @jax.jit
    def step(v, x, y):
        return v - 0.01 * jax.grad(lambda v: jnp.mean((x @ v - y) ** 2))(v)

    v = jnp.zeros(8)
    for batch in dlinspect.prefetch_to_jax(ds, narrow="ok"):
        v = step(v, batch["x"], batch["w"])
    assert np.isfinite(np.asarray(v)).all()


def test_errors_name_key_paths(table):
    ragged = tf.data.Dataset.from_tensor_slices(
        {"tokens": tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7]]),
         "x": table["x"][:4]}).batch(2)
    batch = next(iter(ragged))
    assert isinstance(batch["tokens"], tf.RaggedTensor)
    with pytest.raises(dlinspect.ProducerError, match=r"^\['tokens'\].*to_tensor"):
        dlinspect.to_jax(batch)
    assert dlinspect.plan(batch)["tokens"].kind == "error"
    out = dlinspect.to_jax({**batch, "tokens": batch["tokens"].to_tensor()}, narrow="ok")
    assert np.asarray(out["tokens"]).tolist() == [[1, 2], [3, 0]]
    numpy_batch = next(iter(tf.data.Dataset.from_tensor_slices(table).batch(BATCH)
                            .as_numpy_iterator()))
    with pytest.raises(dlinspect.CopyRequiredError, match=r"^\['w'\].*read-only"):
        dlinspect.to_jax({"w": numpy_batch["w"]}, copy=False)
    with pytest.raises(dlinspect.NotDLPackError, match=r"^\['text'\]"):
        dlinspect.to_jax({"text": numpy_batch["text"]}, leaves="raise")
