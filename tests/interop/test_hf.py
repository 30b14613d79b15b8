"""Hugging Face ``datasets`` and ``transformers`` batches into JAX through dlinspect.

Everything is built in memory, offline: ``datasets.Dataset.from_dict`` tables (some over
pyarrow arrays that wrap NumPy memory at a chosen address, one saved to disk and loaded
back memory-mapped) and a WordLevel tokenizer made with the ``tokenizers`` library,
wrapped in transformers' ``PreTrainedTokenizerFast`` (no hub download).

What is checked, per batch leaf: values equal NumPy's (narrowed as JAX narrows with x64
off), zero-copy exactly when ``plan()`` says so (by data pointer), non-numeric columns
kept as they are, containers rebuilt as their own type (``BatchEncoding`` stays a
``BatchEncoding``), errors starting with the leaf's key path, and one epoch per
``iter()`` of ``prefetch_to_jax`` over a re-iterable wrapper of ``Dataset.iter``. For the
page's recipe (``Batches`` over ``with_format("arrow")``): with ``readonly="share"``
every numeric byte of every batch imported zero-copy, by pointer and in the loader's
report; with the defaults, every writable byte zero-copy and every read-only byte counted
under "read-only", with one warning naming ``readonly="share"``.

What was found (datasets 5.2.0, pyarrow 26.0.1, transformers 5.24.0):
``with_format("numpy")`` batches are fresh, writable NumPy allocations, built a row at a
time (whatever ``malloc`` gives: 16-byte aligned for certain, so most are copied in C,
aligned ones imported zero-copy); integer columns arrive as int64 (narrowed, so copied,
with x64 off) whatever their stored type. ``with_format("arrow")`` batches are slices of
the dataset's Arrow memory, which NumPy views read-only: 64-byte aligned where Arrow's
allocator made it, the NumPy array's own address where ``from_dict`` wrapped one, 8-byte
aligned in the memory-mapped files of ``save_to_disk`` / ``map`` (Arrow's file format). A
shuffled dataset's batch is a table of one chunk per row, which ``combine_chunks`` gathers
into fresh (aligned) Arrow memory. ``from_dict`` of a 2-D NumPy array stores a
variable-length list column; ``Array2D`` stores nested variable-length lists.
``Dataset.iter(batch_size)`` is a generator: one pass only. Tokenizer and collator outputs
are int64.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from dlinspect.testing import aligned_array
from interop_helpers import convert_and_check, need, pointer_of

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from doctest_docs import recipe  # noqa: E402

datasets = need("datasets", "datasets")
transformers = need("transformers", "transformers")
tokenizers = need("tokenizers", "tokenizers")
torch = need("torch", "torch")
pa = need("pyarrow", "pyarrow")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
datasets.disable_progress_bars()

N = 200          # rows: 12 full batches of 16 and a last one of 8
BATCH = 16
WORDS = "the a cat dog sat on mat ran fast slow big small red blue and".split()


PAGE = recipe(ROOT / "docs" / "loaders" / "huggingface.md", "to_numpy", "Batches")
to_numpy = PAGE["to_numpy"]      # one column of an Arrow batch as NumPy: the page's own
LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)


class Batches(PAGE["Batches"]):
    """The page's recipe (its own ``Batches``), with ``drop_last_batch`` to choose (the
    page drops the last batch)."""

    def __init__(self, ds, batch_size, drop_last_batch=True):
        super().__init__(ds, batch_size)
        self.drop_last_batch = drop_last_batch

    def __iter__(self):
        if self.drop_last_batch:
            return super().__iter__()
        return ({name: to_numpy(table[name]) for name in table.column_names}
                for table in self.ds.iter(batch_size=self.batch_size))

    def __len__(self):
        if self.drop_last_batch:
            return super().__len__()
        return -(-len(self.ds) // self.batch_size)


class Seen:
    """What the tests compare of a numeric NumPy leaf a Recorded source handed over,
    without holding it (a source that keeps a batch's arrays has dlinspect copy them):
    its address, size, dtype and writability then."""

    def __init__(self, a):
        self.data = a.ctypes.data
        self.nbytes = a.nbytes
        self.dtype = a.dtype
        self.writeable = a.flags.writeable


class Recorded:
    """A source handing over ``source``'s batches and recording each (``seen``: its numeric
    leaves as Seen, the others as they are), so that a loader's output can be compared
    with its input by pointer."""

    def __init__(self, source):
        self.source, self.seen = source, []

    def __iter__(self):
        return map(self.record, self.source)   # (no variable holds a batch handed over)

    def record(self, batch):
        self.seen.append({k: Seen(v) if isinstance(v, np.ndarray) and v.dtype.kind in "iuf" else v
                          for k, v in batch.items()})
        return batch

    def __len__(self):
        return len(self.source)


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
    loader = dlinspect.prefetch_to_jax(Batches(ds, BATCH, drop_last_batch=False), narrow="ok")
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
    ours = Batches(ds, BATCH, drop_last_batch=False)
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


# ---- the page's recipe: Arrow batches ----------------------------------------------------

F = 48   # float32 features a row: 192 bytes, so batch i of BATCH rows starts 64-byte aligned
         # where the column does (int32 labels: BATCH * 4 = 64 bytes a batch)


def arrow_table(shift, seed=0):
    """A Dataset over pyarrow arrays that wrap NumPy memory ``shift`` bytes past a 64-byte
    boundary (from_dict keeps pyarrow arrays as they are): "x" float32 (N, F) as a
    fixed-length list column, "label" int32, "id" strings."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(N * F).astype(np.float32)
    label = rng.integers(0, 10, N).astype(np.int32)
    pad = shift // 4
    x_mem = aligned_array(np.concatenate([np.zeros(pad, np.float32), x]))[pad:]
    label_mem = aligned_array(np.concatenate([np.zeros(pad, np.int32), label]), np.int32)[pad:]
    assert x_mem.ctypes.data % 64 == label_mem.ctypes.data % 64 == shift
    return datasets.Dataset.from_dict({
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x_mem), F),
        "label": pa.array(label_mem), "id": [f"row{i}" for i in range(N)]})


def values_of(column):
    """The values of a column's first chunk (its lists flattened): a pyarrow array."""
    arr = column.chunk(0)
    arr = getattr(arr, "storage", arr)
    while any(is_list(arr.type) for is_list in LISTS):
        arr = arr.flatten()
    return arr


def address(table, name):
    """Where a column's values start in Arrow memory (its first chunk)."""
    arr = values_of(table.column(name))
    return arr.buffers()[1].address + arr.offset * arr.type.byte_width


@pytest.fixture(scope="module")
def sources(tmp_path_factory, tokenizer):
    """Datasets whose memory the recipe meets in practice, by name."""
    aligned = arrow_table(0)
    saved = str(tmp_path_factory.mktemp("hf") / "ds")
    aligned.save_to_disk(saved)
    grids = np.arange(N * 4 * 16, dtype=np.float32).reshape(N, 4, 16)
    raw = datasets.Dataset.from_dict({"text": sentences(N, seed=3),
                                      "label": np.arange(N, dtype=np.int32) % 2})
    return {
        "aligned": aligned,                                   # views of NumPy's memory
        "misaligned": arrow_table(16),                        # every batch 16 past 64
        "from disk": datasets.load_from_disk(saved),           # memory-mapped
        "shuffled": aligned.shuffle(seed=0),                  # gathered per batch
        "Array2D": datasets.Dataset.from_dict(
            {"grid": grids}, features=datasets.Features(
                {"grid": datasets.Array2D((4, 16), "float32")})),
        "padded tokens": raw.map(                             # lists of one length
            lambda b: tokenizer(b["text"], padding="max_length", max_length=16,
                                truncation=True), batched=True, remove_columns=["text"]),
    }


SOURCES = ["aligned", "misaligned", "from disk", "shuffled", "Array2D", "padded tokens"]


def numeric(batch):
    """The batch's numeric NumPy leaves, by key."""
    return {k: v for k, v in batch.items() if isinstance(v, Seen)}


def run_recipe(ds, **options):
    """prefetch_to_jax over the recipe: (the recipe's batches, the loader's, the loader)."""
    source = Recorded(Batches(ds, BATCH))
    loader = dlinspect.prefetch_to_jax(source, narrow="ok", **options)
    out = list(loader)
    assert len(out) == len(source.seen) == N // BATCH
    return source.seen, out, loader


@pytest.mark.parametrize("name", SOURCES)
def test_recipe_shares_every_numeric_byte(sources, name):
    ds = sources[name]
    seen, out, loader = run_recipe(ds, readonly="share")
    theirs = list(ds.with_format("numpy").iter(batch_size=BATCH, drop_last_batch=True))
    total = {}
    for ours, converted, numpy_batch in zip(seen, out, theirs, strict=True):
        leaves = numeric(ours)
        assert set(leaves) == {k for k, v in numpy_batch.items() if v.dtype.kind in "iuf"}
        for key, leaf in leaves.items():
            # zero-copy: the JAX array is the recipe's memory, its values the dataset's
            assert converted[key].unsafe_buffer_pointer() == leaf.data, key
            stored = values_of(ds.data.table.column(key)).type.to_pandas_dtype()
            assert leaf.dtype == stored, key                   # as stored: no widening
            assert np.array_equal(np.asarray(converted[key]), numpy_batch[key]), key
            total[f"['{key}']"] = total.get(f"['{key}']", 0) + leaf.nbytes
        for key in set(ours) - set(leaves):                 # strings: kept as they are
            assert list(converted[key]) == list(numpy_batch[key])
    report = loader.report.as_dict()
    assert {k: r["copied_bytes"] for k, r in report.items()} == {k: {} for k in total}
    assert {k: r["zero_copy_bytes"] for k, r in report.items()} == total


def test_recipe_views_the_dataset_memory_where_aligned(sources):
    # No copy anywhere: each batch's leaves are slices of the dataset's own Arrow memory.
    ds = sources["aligned"]
    seen, out, _ = run_recipe(ds, readonly="share")
    for i, (ours, converted) in enumerate(zip(seen, out)):
        for key, row_bytes in (("x", F * 4), ("label", 4)):
            start = address(ds.data.table, key) + i * BATCH * row_bytes
            assert not ours[key].writeable                      # Arrow's: read-only
            assert ours[key].data == start == converted[key].unsafe_buffer_pointer()


def test_recipe_writes_misaligned_columns_once(sources):
    # Memory XLA:CPU cannot view: written once (dlinspect.stack), writable, 64-byte
    # aligned, and imported without a copy with the defaults too.
    ds = sources["misaligned"]
    seen, out, loader = run_recipe(ds)
    arrow = address(ds.data.table, "x")
    for ours, converted in zip(seen, out):
        x = ours["x"]
        assert x.writeable and x.data % 64 == 0
        assert not arrow <= x.data < arrow + N * F * 4          # not Arrow's memory
        assert converted["x"].unsafe_buffer_pointer() == x.data
    assert all(not r["copied_bytes"] for r in loader.report.as_dict().values())


@pytest.mark.parametrize("name", SOURCES)
def test_recipe_defaults(sources, name):
    # With the defaults: every writable numeric byte imported zero-copy, every read-only
    # one copied and counted under "read-only" (what readonly="share" would save).
    seen, out, loader = run_recipe(sources[name])
    writable, read_only = {}, {}
    for ours, converted in zip(seen, out, strict=True):
        for key, leaf in numeric(ours).items():
            path = f"['{key}']"
            shared = converted[key].unsafe_buffer_pointer() == leaf.data
            assert shared == leaf.writeable, (key, leaf.data % 64)
            into = writable if leaf.writeable else read_only
            into[path] = into.get(path, 0) + leaf.nbytes
    report = loader.report.as_dict()
    for path, row in report.items():
        assert row["zero_copy_bytes"] == writable.get(path, 0), path
        # (Arrow's memory: read-only, and not the batch's own)
        assert row["copied_bytes"] == ({"read-only, aliased": read_only[path]} if path in read_only
                                       else {}), path
    if name in ("aligned", "shuffled"):      # Arrow's memory, aligned: all of it read-only
        assert not writable and read_only
    if name == "misaligned":                 # all of it written once by the recipe
        assert writable and not read_only


def test_read_only_copies_are_named_once():
    # A read-only leaf of 64 KiB or more copied in each of the first 8 batches: one
    # DLInspectWarning naming readonly="share"; with it, no copy and no warning.
    rows, width = 32 * 8, 1024                              # 128 KiB of "x" a batch
    x = aligned_array(np.ones(rows * width, np.float32))
    ds = datasets.Dataset.from_dict({"x": pa.FixedSizeListArray.from_arrays(pa.array(x),
                                                                            width)})
    loader = dlinspect.prefetch_to_jax(Batches(ds, 32))
    with pytest.warns(dlinspect.DLInspectWarning, match=r"^\['x'\]: copied in every one.*"
                                                        r"read-only.*readonly=\"share\""):
        list(loader)
    assert loader.report.as_dict()["['x']"]["copied_bytes"] == {"read-only, aliased": rows * width * 4}
    shared = dlinspect.prefetch_to_jax(Batches(ds, 32), readonly="share")
    with warnings.catch_warnings():
        warnings.simplefilter("error", dlinspect.DLInspectWarning)
        list(shared)
    assert shared.report.as_dict()["['x']"] == {"batches": 8, "zero_copy_bytes": rows * width * 4,
                                                "copied_bytes": {}}


def test_recipe_keeps_what_it_cannot_view():
    ds = datasets.Dataset.from_dict({
        "ragged": [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]],
        "with_null": [1.5, None, 2.5, 3.5],
        "flag": [True, False, True, True],
        "wide": np.arange(4, dtype=np.int64),
        "mask": pa.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], pa.list_(pa.int8())),
        "id": ["a", "b", "c", "d"]})
    batch = next(iter(Batches(ds, 4)))
    assert batch["ragged"].dtype == object and [list(r) for r in batch["ragged"]] == \
        [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
    assert batch["with_null"].dtype == np.float64 and np.isnan(batch["with_null"][1])
    assert batch["flag"].dtype == np.bool_ and batch["id"].dtype == object
    assert batch["wide"].dtype == np.int64                  # stored int64: kept
    assert batch["mask"].dtype == np.int8 and batch["mask"].shape == (4, 3)
    out = dlinspect.to_jax(batch, narrow="ok")
    assert out["ragged"] is batch["ragged"] and out["id"] is batch["id"]   # kept as leaves
    assert out["wide"].dtype == jnp.int32 and out["mask"].tolist() == batch["mask"].tolist()


def test_numpy_format_copies_arrow_format_views(sources):
    # The facts the recipe stands on: the NumPy format builds new memory (int32 widened
    # to int64); the Arrow format hands out slices of the dataset's memory, which Arrow's
    # file format (a memory-mapped dataset) aligns to 8 bytes.
    ds = sources["aligned"]
    arrow = address(ds.data.table, "x")
    numpy_batch = next(ds.with_format("numpy").iter(batch_size=BATCH))
    assert numpy_batch["x"].flags.owndata and numpy_batch["x"].flags.writeable
    assert numpy_batch["x"].ctypes.data != arrow and numpy_batch["label"].dtype == np.int64
    second = list(ds.with_format("arrow").iter(batch_size=BATCH))[1]
    assert address(second, "x") == arrow + BATCH * F * 4       # batch 1: a slice, no copy
    assert not to_numpy(second["label"]).flags.writeable
    mapped = sources["from disk"].data.table
    for name in ("x", "label"):
        assert all(values_of(pa.chunked_array([c])).buffers()[1].address % 8 == 0
                   for c in mapped.column(name).chunks)


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
    out, _ = convert_and_check(feature, numpy_of)
    assert type(out) is transformers.BatchFeature and list(out) == ["pixel_values", "labels"]
    # A new one converted where it is made: nothing outside the batch holds the tensor, and
    # torch's CPU allocator aligns to 64, so it is shared (through convert_and_check, the
    # batch is its caller's too: copied).
    made = transformers.BatchFeature({"pixel_values": torch.rand(2, 3, 4, 4)})
    assert dlinspect.plan(made)["pixel_values"].kind == "zero-copy"
    shared = dlinspect.to_jax(made)
    assert pointer_of(shared["pixel_values"]) == dlinspect.peek(made["pixel_values"]).data_ptr


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
