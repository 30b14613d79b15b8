"""Hugging Face ``datasets`` and ``transformers`` batches into JAX through dlinspect.

Everything is built in memory, offline: a ``datasets.Dataset.from_dict`` table and a
WordLevel tokenizer made with the ``tokenizers`` library, wrapped in transformers'
``PreTrainedTokenizerFast`` (no hub download).

What is checked, per batch leaf: values equal NumPy's (narrowed as JAX narrows with x64
off), zero-copy exactly when ``plan()`` says so (by data pointer), non-numeric columns
kept as they are, containers rebuilt as their own type (``BatchEncoding`` stays a
``BatchEncoding``), errors starting with the leaf's key path, and one epoch per
``iter()`` of ``prefetch_to_jax`` over a re-iterable wrapper of ``Dataset.iter``.

What was found (datasets 5.2.0, transformers 5.24.0): ``with_format("numpy")`` batches are
fresh, writable NumPy allocations (whatever ``malloc`` gives: often only 16- or 32-byte
aligned, so small ones are copied in C, aligned ones imported zero-copy); integer columns
arrive as int64 (narrowed, so copied, with x64 off); tokenizer and collator outputs are
int64 too. ``Dataset.iter(batch_size)`` is a generator: one pass only.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from interop_helpers import convert_and_check, need

datasets = need("datasets", "datasets")
transformers = need("transformers", "transformers")
tokenizers = need("tokenizers", "tokenizers")
torch = need("torch", "torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
datasets.disable_progress_bars()

N = 200          # rows: 12 full batches of 16 and a last one of 8
BATCH = 16
WORDS = "the a cat dog sat on mat ran fast slow big small red blue and".split()


class Batches:
    """One epoch of ``ds.iter(batch_size)`` per ``iter()``: ``Dataset.iter`` is a generator
    (one pass only), this makes it re-iterable for ``prefetch_to_jax``. (The README's
    recipe.)"""

    def __init__(self, ds, batch_size, drop_last_batch=False):
        self.ds = ds.with_format("numpy")
        self.batch_size = batch_size
        self.drop_last_batch = drop_last_batch

    def __iter__(self):
        return self.ds.iter(batch_size=self.batch_size, drop_last_batch=self.drop_last_batch)

    def __len__(self):
        n, rest = divmod(len(self.ds), self.batch_size)
        return n + (1 if rest and not self.drop_last_batch else 0)


def numpy_of(leaf):
    """A leaf's NumPy values (torch tensors through .numpy())."""
    return leaf.numpy() if isinstance(leaf, torch.Tensor) else np.asarray(leaf)


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((N, 8)).astype(np.float32),
            "w": rng.random(N).astype(np.float32),
            "label": rng.integers(0, 10, N),                      # int64
            "id": [f"row{i}" for i in range(N)]}


@pytest.fixture(scope="module")
def ds(table):
    return datasets.Dataset.from_dict(table)


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]",
                                                unk_token="[UNK]")


def sentences(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS + ["zebra"], size=rng.integers(1, 12)))
            for _ in range(n)]


# ---- datasets.Dataset ---------------------------------------------------------------

def test_numpy_batches(ds, table):
    kinds = {"x": set(), "w": set(), "label": set()}
    rows = 0
    for batch in ds.with_format("numpy").iter(batch_size=BATCH):
        assert isinstance(batch, dict)
        for key in kinds:    # fresh, writable NumPy memory: nothing read-only to share
            assert batch[key].flags.writeable and dlinspect.peek(batch[key]).read_only is False
        assert batch["label"].dtype == np.int64     # integer columns arrive as int64
        out, routes = convert_and_check(batch, numpy_of, narrow="ok")
        for key in kinds:
            kinds[key].add(routes[key].kind)
        assert routes["id"].kind == "untouched" and batch["id"].dtype.kind in "UO"
        assert np.array_equal(np.asarray(out["x"]), table["x"][rows:rows + len(out["w"])])
        assert out["label"].dtype == jnp.int32      # x64 off: narrowed
        rows += len(out["w"])
    assert rows == N
    assert kinds["label"] == {"copy"}               # narrowing is a copy
    assert kinds["x"] <= {"zero-copy", "copy"} and kinds["w"] <= {"zero-copy", "copy"}


def test_int32_columns_arrive_as_int64():
    # datasets' NumPy formatter widens integer columns to int64: with x64 off, JAX narrows
    # them back, a copy in every batch (whatever the memory's alignment).
    small = datasets.Dataset.from_dict({"n": np.arange(8, dtype=np.int32)})
    assert small.features["n"].dtype == "int32"
    batch = next(small.with_format("numpy").iter(batch_size=8))
    assert batch["n"].dtype == np.int64
    route = dlinspect.plan(batch)["n"]
    assert route.kind == "copy" and "narrows int64 to int32" in route.reason
    assert dlinspect.to_jax(batch, narrow="ok")["n"].dtype == jnp.int32


def test_plan_says_why_a_numpy_batch_is_copied(ds):
    batch = next(ds.with_format("numpy").iter(batch_size=BATCH))
    for key in ("x", "w"):
        route = dlinspect.plan(batch[key])
        aligned = dlinspect.peek(batch[key]).data_ptr % 64 == 0
        assert route.kind == ("zero-copy" if aligned else "copy"), route
        if not aligned:
            assert "aligned" in route.reason and "read-only" not in route.reason


def test_epochs_reiterate(ds, table):
    loader = dlinspect.prefetch_to_jax(Batches(ds, BATCH), narrow="ok")
    assert len(loader) == -(-N // BATCH)
    epochs = []
    for _ in range(2):
        xs = [np.asarray(b["x"]) for b in loader]
        assert len(xs) == len(loader)
        epochs.append(np.concatenate(xs))
    assert np.array_equal(epochs[0], table["x"]) and np.array_equal(epochs[1], table["x"])
    # drop_last_batch: every batch full
    full = dlinspect.prefetch_to_jax(Batches(ds, BATCH, drop_last_batch=True), narrow="ok")
    assert [b["w"].shape[0] for b in full] == [BATCH] * (N // BATCH)


def test_a_bare_generator_is_one_epoch(ds):
    # Dataset.iter() is a generator: prefetch_to_jax over it gives its batches once (as
    # prefetch_to_jax documents), hence the re-iterable wrapper above; a second epoch is
    # refused, naming the fix, not an epoch of no batches.
    loader = dlinspect.prefetch_to_jax(ds.with_format("numpy").iter(batch_size=BATCH),
                                       narrow="ok")
    assert len(list(loader)) == -(-N // BATCH)
    with pytest.raises(dlinspect.SourceExhaustedError, match="generator"):
        list(loader)


def test_agrees_with_with_format_jax(ds):
    ours = Batches(ds, BATCH)
    theirs = ds.with_format("jax").iter(batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        for a, b in zip(dlinspect.prefetch_to_jax(ours), theirs, strict=True):
            for key in ("x", "w", "label"):
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape
                assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
            assert list(a["id"]) == list(b["id"])   # theirs: a list of str; ours: str array


def test_jitted_step(ds):
    @jax.jit
    def step(w, x, y):
        return w - 0.01 * jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)

    w = jnp.zeros(8)
    for batch in dlinspect.prefetch_to_jax(Batches(ds, BATCH, drop_last_batch=True),
                                           narrow="ok"):
        w = step(w, batch["x"], batch["label"].astype(jnp.float32))
    assert np.isfinite(np.asarray(w)).all()


def test_shared_arrays_outlive_the_batches(ds, table):
    kept = [dlinspect.to_jax(b, narrow="ok")["x"]
            for b in ds.with_format("numpy").iter(batch_size=BATCH)]
    for _ in ds.with_format("numpy").iter(batch_size=BATCH):   # churn NumPy's allocator
        pass
    assert np.array_equal(np.concatenate([np.asarray(k) for k in kept]), table["x"])


# ---- tokenizer and collator outputs: BatchEncoding --------------------------------------

@pytest.mark.parametrize("tensors", ["np", "pt"])
def test_tokenizer_batch_encoding(tokenizer, tensors):
    texts = sentences(6)
    enc = tokenizer(texts, padding=True, return_tensors=tensors)
    assert isinstance(enc, transformers.BatchEncoding)
    out, routes = convert_and_check(enc, numpy_of, narrow="ok")
    assert type(out) is transformers.BatchEncoding
    assert {route.kind for route in routes.values()} == {"copy"}   # int64, x64 off
    assert out["input_ids"].dtype == jnp.int32
    ref = tokenizer(texts, padding=True, return_tensors="np")
    assert np.array_equal(np.asarray(out["input_ids"]), ref["input_ids"])
    assert np.array_equal(np.asarray(out["attention_mask"]), ref["attention_mask"])


def test_batch_feature_stays_batch_feature():
    # What image and audio processors return: a BatchFeature (a UserDict too).
    feature = transformers.BatchFeature({"pixel_values": torch.rand(2, 3, 4, 4),
                                         "labels": np.arange(2, dtype=np.int32)})
    out, routes = convert_and_check(feature, numpy_of)
    assert type(out) is transformers.BatchFeature and list(out) == ["pixel_values", "labels"]
    assert routes["pixel_values"].kind == "zero-copy"   # torch's CPU allocator aligns to 64


def test_batch_encoding_keeps_no_fast_tokenizer_encodings(tokenizer):
    # BatchEncoding is rebuilt as type(m)(dict_of_values), as accelerate does: the fast
    # tokenizer's per-sequence Encodings (word_ids(), offsets) stay with the input.
    enc = tokenizer(sentences(2), padding=True, return_tensors="np")
    assert enc.encodings is not None and enc.word_ids(0) is not None
    out = dlinspect.to_jax(enc, narrow="ok")
    assert type(out) is transformers.BatchEncoding and out.encodings is None


@pytest.mark.parametrize("tensors", ["np", "pt"])
def test_collator(tokenizer, tensors):
    features = [{**tokenizer(t), "label": i % 2} for i, t in enumerate(sentences(5, seed=1))]
    collator = transformers.DataCollatorWithPadding(tokenizer, return_tensors=tensors)
    batch = collator(features)
    assert isinstance(batch, transformers.BatchEncoding) and "labels" in batch
    out, _ = convert_and_check(batch, numpy_of, narrow="ok")
    assert type(out) is transformers.BatchEncoding
    assert np.asarray(out["labels"]).tolist() == [i % 2 for i in range(5)]
    assert out["input_ids"].shape[1] == max(len(f["input_ids"]) for f in features)


@pytest.mark.parametrize("tensors", ["np", "pt"])
def test_tokenized_dataset_through_collator_epochs(tokenizer, tensors):
    # The usual training input: a tokenized Dataset, a torch DataLoader with the collator
    # (re-iterable: one epoch per iter()), each batch a BatchEncoding.
    texts = sentences(40, seed=2)
    raw = datasets.Dataset.from_dict({"text": texts, "label": [i % 3 for i in range(40)]})
    tokenized = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])
    collator = transformers.DataCollatorWithPadding(tokenizer, padding="max_length",
                                                    max_length=16, return_tensors=tensors)
    loader = torch.utils.data.DataLoader(tokenized, batch_size=8, collate_fn=collator)
    batches = dlinspect.prefetch_to_jax(loader, narrow="ok")
    ref = tokenizer(texts, padding="max_length", max_length=16, return_tensors="np")

    @jax.jit
    def tokens(batch):
        return (batch["input_ids"] * batch["attention_mask"]).sum()

    for _ in range(2):
        seen = list(batches)
        assert len(seen) == 5 and all(type(b) is transformers.BatchEncoding for b in seen)
        # A BatchEncoding is no JAX pytree: jit takes dict(batch) (or its fields).
        with pytest.raises(TypeError):
            tokens(seen[0])
        assert sum(int(tokens(dict(b))) for b in seen) == int(
            (ref["input_ids"] * ref["attention_mask"]).sum())
        ids = np.concatenate([np.asarray(b["input_ids"]) for b in seen])
        assert np.array_equal(ids, ref["input_ids"])
        assert np.concatenate([np.asarray(b["labels"]) for b in seen]).tolist() == \
            [i % 3 for i in range(40)]


def test_errors_name_key_paths(tokenizer):
    enc = tokenizer(sentences(3), padding=True, return_tensors="np")
    with pytest.raises(dlinspect.CopyRequiredError, match=r"^\['input_ids'\]") as info:
        dlinspect.to_jax(enc, copy=False)           # narrowing int64 is a copy
    assert info.value.key_path is not None
    grads = transformers.BatchEncoding({"pixel_values": torch.ones(2, 3, requires_grad=True)})
    with pytest.raises(dlinspect.ProducerError, match=r"^\['pixel_values'\].*detach"):
        dlinspect.to_jax(grads)
    nested = {"inputs": enc, "meta": {"w": torch.ones(2, requires_grad=True)}}
    with pytest.raises(dlinspect.ProducerError, match=r"^\['meta'\]\['w'\]"):
        dlinspect.to_jax(nested, narrow="ok")
    with pytest.raises(dlinspect.NotDLPackError, match=r"^\['id'\]"):
        dlinspect.to_jax({"id": np.array(["a", "b"]), "x": np.ones(2, np.float32)},
                         leaves="raise")
