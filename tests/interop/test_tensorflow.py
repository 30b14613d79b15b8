"""TensorFlow (tensorflow-cpu) as a DLPack producer: EagerTensor.__dlpack__.

TF exports dense C-order host tensors (kDLCPU) as legacy "dltensor" capsules (it takes
``max_version`` but returns no versioned capsule); slices are new tensors, so there are
no strided exports. Its ``__dlpack__`` raises RuntimeError for ``dl_device`` or
``copy=True``, which dlinspect only passes for a host copy of device memory.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from interop_helpers import check_all, check_lifetime, check_no_leak, need, reference  # noqa: E402

tf = need("tensorflow", "tensorflow-cpu")

import dlinspect  # noqa: E402

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]



@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    ref = reference(dtype)
    kinds = check_all("tensorflow", dtype, lambda: tf.constant(ref), ref)
    assert kinds[("host", ())] == "zero-copy"
    narrowed = dtype in ("int64", "uint64", "float64", "complex128")
    # TF's CPU allocator aligns to 64 bytes: every other dtype is a view for JAX
    assert kinds[("jax", ())] == ("copy" if narrowed else "zero-copy")


@pytest.mark.parametrize("case", ["0-d", "empty", "slice", "transpose", "large", "row"])
def test_layouts(case):
    base = reference("float32", (8, 6))
    make, ref = {
        "0-d": (lambda: tf.constant(np.float32(2.5)), np.array(2.5, np.float32)),
        "empty": (lambda: tf.zeros((0, 3)), np.zeros((0, 3), np.float32)),
        "slice": (lambda: tf.constant(base)[:, 1:3], base[:, 1:3]),        # a new tensor in TF
        "transpose": (lambda: tf.transpose(tf.constant(base)), base.T),
        "large": (lambda: tf.reshape(tf.range(1 << 18, dtype=tf.float32), (512, 512)),
                  np.arange(1 << 18, dtype=np.float32).reshape(512, 512)),
        "row": (lambda: tf.constant(base)[3], base[3]),
    }[case]
    check_all("tensorflow", case, make, ref)


def test_legacy_capsule_without_flags():
    x = tf.constant([1.0, 2.0])
    info = dlinspect.peek(x)
    assert info.version is None and info.read_only is None   # a "dltensor" capsule
    assert dlinspect.peek(tf.experimental.dlpack.to_dlpack(x)).shape == (2,)


def test_exported_capsule():
    x = tf.constant(reference("float32"))
    route = dlinspect.plan(tf.experimental.dlpack.to_dlpack(x))
    y = dlinspect.to_jax(tf.experimental.dlpack.to_dlpack(x))
    assert route.kind == "zero-copy"
    assert np.array_equal(np.asarray(y), x.numpy())


@pytest.mark.parametrize("make, fix", [
    (lambda: tf.Variable([1.0, 2.0]), "read_value"),
    (lambda: tf.ragged.constant([[1.0], [2.0, 3.0]]), "to_tensor"),
    (lambda: tf.sparse.SparseTensor([[0, 0]], [1.0], [2, 2]), "to_dense"),
])
def test_tensors_without_dlpack_form_are_refused(make, fix):
    # Numeric TF tensors DLPack cannot carry are refused with the fix, never passed over
    # silently as non-tensor leaves (the producer table, issue 16).
    x = make()
    for call in (dlinspect.to_jax, dlinspect.peek, dlinspect.to_host,
                 lambda v: dlinspect.to_jax({"f": v})):
        with pytest.raises(dlinspect.ProducerError, match=fix):
            call(x)
    assert dlinspect.plan({"f": x})["f"].kind == "error"
    v = tf.Variable([1.0, 2.0])
    assert np.array_equal(np.asarray(dlinspect.to_jax(v.read_value())), [1.0, 2.0])


@pytest.mark.parametrize("dtype", ["string"])
def test_non_numeric_tensors_are_leaves(dtype):
    # TensorFlow's __dlpack__ aborts the process on tf.string (SIGABRT): the producer
    # table refuses it from its dtype before any export, in peek too.
    s = tf.constant(["a", "bc"])
    with pytest.raises(dlinspect.NotNumericError, match="tf.string"):
        dlinspect.peek(s)
    with pytest.raises(dlinspect.NotNumericError):
        dlinspect.to_host(s)
    assert dlinspect.to_jax(s) is s and dlinspect.plan(s).kind == "untouched"
    batch = {"text": s, "x": tf.constant([1.0, 2.0])}
    out = dlinspect.to_jax(batch)
    assert out["text"] is s and np.array_equal(np.asarray(out["x"]), [1.0, 2.0])
    with pytest.raises(dlinspect.NotDLPackError, match=r"^\['text'\]"):
        dlinspect.to_jax(batch, leaves="raise")


def test_lifetime():
    ref = np.arange(4096, dtype=np.float32)
    check_lifetime(lambda: tf.constant(ref), ref, churn=lambda: tf.fill((4096,), -1.0))


def test_no_leak():
    check_no_leak(tf.constant(np.arange(1024, dtype=np.float32)))
