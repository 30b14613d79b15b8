"""A loader's source that reuses memory: never a kept batch silently changed.

Each source below yields batches that JAX can view zero-copy (64-byte aligned, row-major,
writable), the way a ring buffer, a pinned staging tensor or a C extension's output does;
every kept batch is checked by computation against the values it had when yielded.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax)")
jnp = jax.numpy

from dlinspect import DLInspectWarning, MemoryReuseError, prefetch_to_jax  # noqa: E402
from dlinspect.testing import aligned_empty  # noqa: E402

THREADS = [False, True, None]
N = 6


def values(i):
    return np.arange(12, dtype=np.float32).reshape(3, 4) * 10 + i


def refilled(n=N, through_base=False):
    """One aligned buffer refilled in place before each yield (through the array itself,
    or through another view of the same memory: ``base[...] = ...``)."""
    base = aligned_empty((3, 4), np.float32, 64)
    view = base[...]
    for i in range(n):
        (base if through_base else view)[...] = values(i)
        yield {"x": view, "i": i}


def ring(slots, n=N):
    """A ring buffer of ``slots`` batches (each slot 64-byte aligned, as JAX views it),
    written through the ring, handed out as views."""
    buf = aligned_empty((slots, 16), np.float32, 64)
    for i in range(n):
        buf[i % slots, :12] = values(i).ravel()
        yield {"x": buf[i % slots, :12].reshape(3, 4), "i": i}


def fresh(n=N):
    for i in range(n):
        x = aligned_empty((3, 4), np.float32, 64)
        x[...] = values(i)
        yield {"x": x, "i": i}


def computed(batch):
    """The batch's values as computations on its JAX array see them."""
    x = batch["x"]
    return np.asarray(jax.jit(lambda a: a * 1 + 0)(x + 0)), float(jnp.sum(x)), float(x[2, 3])


def holds_its_values(batch):
    want = values(batch["i"])
    arr, total, last = computed(batch)
    return np.array_equal(arr, want) and total == float(want.sum()) and last == want[2, 3]


def kept(loader):
    """Every batch kept; the error the loader raised, if any."""
    out = []
    try:
        for b in loader:
            out.append(b)
    except MemoryReuseError as exc:
        return out, exc
    return out, None


@pytest.mark.parametrize("thread", THREADS)
@pytest.mark.parametrize("source", [refilled, lambda: refilled(through_base=True),
                                    lambda: ring(2), lambda: ring(3)],
                         ids=["same-array", "through-base", "ring-2", "ring-3"])
def test_reused_memory_never_silently_changes_a_kept_batch(thread, source):
    out, error = kept(prefetch_to_jax(source(), thread=thread))
    assert error is not None, "every batch kept, memory reused: the loader must say so"
    assert len(out) < 4   # by the second batch a reuse is there (a ring of 3: the fourth)
    text = str(error)
    assert "To fix" in text and "copy=True" in text and "batch" in text
    if "refused" in text:   # the write failed: every kept batch holds its values
        assert all(holds_its_values(b) for b in out)
    else:                   # found after the write: the error names the batch it changed
        assert f"batch {out[-1 if len(out) else 0]['i'] + 1}" in text or "batch 1" in text


@pytest.mark.parametrize("thread", THREADS)
def test_same_array_refill_is_refused_in_the_source(thread):
    out, error = kept(prefetch_to_jax(refilled(), thread=thread))
    assert isinstance(error, MemoryReuseError) and isinstance(error, BufferError)
    assert "refused" in str(error) and isinstance(error.__cause__, ValueError)
    assert [b["i"] for b in out] == [0] and holds_its_values(out[0])


@pytest.mark.parametrize("thread", THREADS)
@pytest.mark.parametrize("source", [refilled, lambda: ring(2)], ids=["same-array", "ring-2"])
def test_copy_true_keeps_every_batch(thread, source):
    loader = prefetch_to_jax(source(), thread=thread, copy=True)
    out = list(loader)
    assert [b["i"] for b in out] == list(range(N))
    assert all(holds_its_values(b) for b in out)
    assert loader.report.as_dict()["['x']"]["zero_copy_bytes"] == 0


@pytest.mark.parametrize("thread", THREADS)
def test_reuse_copy_warns_once_then_copies(thread):
    loader = prefetch_to_jax(ring(2), thread=thread, reuse="copy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = list(loader)
    said = [w for w in caught if issubclass(w.category, DLInspectWarning)]
    assert len(said) == 1 and "From now on those leaves are copied" in str(said[0].message)
    assert "batch 1 (and any batch viewing that memory) may hold batch 3's values" in str(
        said[0].message)
    # batches 1 and 2 were viewed before the reuse showed (the ring refills them); every
    # batch from the reuse on is a copy
    assert all(holds_its_values(b) for b in out[2:])
    assert not holds_its_values(out[0])
    row = loader.report.as_dict()["['x']"]
    assert row["copied_bytes"]["reused memory"] == 48 * (N - 2)
    assert row["zero_copy_bytes"] == 48 * 2


@pytest.mark.parametrize("thread", THREADS)
def test_fresh_memory_per_batch_stays_zero_copy(thread):
    loader = prefetch_to_jax(fresh(), thread=thread)
    out = list(loader)
    assert all(holds_its_values(b) for b in out)
    assert loader.report.as_dict()["['x']"] == {
        "batches": N, "zero_copy_bytes": 48 * N, "copied_bytes": {}}


def test_batches_dropped_before_the_refill_are_no_reuse():
    """A ring of 2 whose consumer drops each batch before asking for the next: the memory
    comes back only once no batch views it (thread=False: nothing converted ahead)."""
    loader = prefetch_to_jax(ring(2), thread=False)
    got = []
    it = iter(loader)
    for _ in range(N):
        b = next(it)
        got.append(float(jnp.sum(b["x"])))
        del b
        gc.collect()
    assert got == [float(values(i).sum()) for i in range(N)]


def test_a_second_epoch_over_the_same_arrays_is_no_reuse():
    arrays = list(fresh())
    loader = prefetch_to_jax(arrays, thread=False)
    first = list(loader)
    second = list(loader)    # the same memory again, unchanged: the first epoch's still live
    assert all(holds_its_values(b) for b in first + second)


def test_protected_arrays_are_writable_again_once_their_views_die():
    batches = list(fresh(2))
    loader = prefetch_to_jax(batches, thread=False)
    out = list(loader)
    assert not batches[0]["x"].flags.writeable   # JAX views it: a write would change a batch
    del out
    gc.collect()
    assert batches[0]["x"].flags.writeable and batches[1]["x"].flags.writeable


def test_torch_staging_tensor_refilled_in_place():
    torch = pytest.importorskip("torch")

    def staged():
        t = torch.empty((3, 4), dtype=torch.float32)
        while t.data_ptr() % 64:
            t = torch.empty((3, 4), dtype=torch.float32)
        for i in range(N):
            t.copy_(torch.from_numpy(values(i)))
            yield {"x": t, "i": i}

    out, error = kept(prefetch_to_jax(staged(), thread=False))
    assert error is not None and "batch 2's leaf ['x']" in str(error)
    assert "batch 1's leaf ['x']" in str(error)


def test_reuse_must_be_error_or_copy():
    with pytest.raises(ValueError, match="reuse must be"):
        prefetch_to_jax([], reuse="warn")
