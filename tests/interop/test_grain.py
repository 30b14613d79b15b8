"""grain (Google's data loader for JAX): ``dlinspect.grain.device_put`` on real grain
pipelines, and grain's ``DataLoader`` through ``dlinspect.prefetch_to_jax``.

grain batches with ``np.stack`` (memory from ``malloc``, 16-byte aligned for sure, 64-byte
aligned by chance) in this process, and into shared memory (``SharedMemoryArray``, an
ndarray subclass over an ``mmap``, page-aligned and writable) in worker processes
(``mp_prefetch``, ``DataLoader(worker_count=...)``). Every test checks that a converted
leaf shares the batch's memory exactly when ``dlinspect.plan(batch)`` says "zero-copy",
and its values against NumPy's.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from interop_helpers import jax_reference, need, pointer_of, same_values

grain = need("grain", "grain")

import dlinspect
import dlinspect.grain
import jax
from dlinspect.testing import aligned_empty

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SHAPE = (3, 8, 8)


def _parse_absl_flags() -> None:
    # grain 0.2.18's worker processes read an absl flag and raise UnparsedFlagAccessError
    # where no program parsed flags (google/grain#1355, fixed after 0.2.18).
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


_parse_absl_flags()


# ---- sources and references ----------------------------------------------------------

def example(i: int) -> dict:
    """Example ``i``: values from its index, so that any batch's reference is known."""
    return {"image": (np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) + 1000 * i),
            "label": np.int64(i), "id": f"ex{i}"}


class Examples:
    """A grain data source (random access) of :func:`example` s."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return example(int(i))

    def __repr__(self) -> str:
        return f"Examples({self.n})"


def reference(indices) -> dict:
    """The batch of examples ``indices`` as NumPy makes it (labels as JAX holds them)."""
    items = [example(int(i)) for i in indices]
    return {"image": np.stack([e["image"] for e in items]),
            "label": jax_reference(np.array([e["label"] for e in items])),
            "id": np.array([e["id"] for e in items])}


def indices_of(batch) -> np.ndarray:
    return (np.asarray(batch["image"])[:, 0, 0, 0] // 1000).astype(int)


def check_batch(got, indices=None) -> None:
    """``got`` (a converted batch) holds the values of the examples it says it holds."""
    idx = indices_of(got) if indices is None else indices
    ref = reference(idx)
    assert isinstance(got["image"], jax.Array) and isinstance(got["label"], jax.Array)
    assert got["label"].dtype == ref["label"].dtype          # int64 narrowed, x64 off
    assert same_values(got["image"], ref["image"])
    assert same_values(got["label"], ref["label"])
    assert isinstance(got["id"], np.ndarray) and got["id"].tolist() == ref["id"].tolist()


def aligned_stack(values):
    """A grain ``batch_fn``: ``np.stack`` into 64-byte aligned memory (every batch
    viewable by XLA:CPU)."""
    def stack(*xs):
        first = np.asarray(xs[0])
        if first.dtype.kind in "US":
            return np.stack(xs)
        out = aligned_empty((len(xs), *first.shape), first.dtype, alignment=64)
        np.stack(xs, out=out)
        return out
    return jax.tree_util.tree_map(stack, *values)


def int32_labels(e: dict) -> dict:
    """A grain map: the example with an int32 label (nothing for JAX to narrow)."""
    return {**e, "label": np.int32(e["label"])}


def aligned_batches(n: int, batch: int = 8):
    """Examples as a MapDataset of 64-byte aligned batches, labels int32 (nothing to
    narrow): every numeric leaf viewable by XLA:CPU."""
    return grain.MapDataset.source(Examples(n)).map(int32_labels).batch(batch,
                                                                        batch_fn=aligned_stack)


class Recorder:
    """A grain map recording, for each batch, each leaf's pointer, alignment, flags and
    type, keyed by the batch's first example (grain may make batches on several threads:
    the order they pass here need not be the order they come out)."""

    def __init__(self) -> None:
        self.seen: dict[int, dict] = {}

    def __call__(self, batch):
        facts = {}
        for key in ("image", "label"):
            leaf = batch[key]
            ptr = leaf.__array_interface__["data"][0]
            facts[key] = {"ptr": ptr, "align": ptr & -ptr, "type": type(leaf).__name__,
                          "writeable": leaf.flags.writeable}
        self.seen[int(indices_of(batch)[0])] = facts
        return batch

    def facts(self, got) -> dict:
        """What was recorded of the batch ``got`` was converted from."""
        return self.seen[int(indices_of(got)[0])]


def check_sharing(out: list, rec: Recorder, expect, report=None) -> dict:
    """Every converted leaf shares its batch's memory exactly where ``expect(key, facts)``
    says "zero-copy", and the stage's ``report`` (where given) counts those bytes as
    zero-copy; returns ``{(leaf, kind): count}``."""
    assert len(out) == len(rec.seen)
    counts: dict = {}
    shared_bytes: dict = {}
    for got in out:
        facts = rec.facts(got)
        for key in ("image", "label"):
            f = facts[key]
            shares = pointer_of(got[key]) == f["ptr"]
            kind = expect(key, f)
            assert shares == (kind == "zero-copy"), (key, f, kind)
            counts[key, kind] = counts.get((key, kind), 0) + 1
            shared_bytes[key] = shared_bytes.get(key, 0) + shares * got[key].nbytes
    if report is not None:
        zero = {k.strip("[']"): v["zero_copy_bytes"] for k, v in report.as_dict().items()}
        assert all(zero[k] == v for k, v in shared_bytes.items()), (zero, shared_bytes)
    return counts


def viewed(key, facts):
    """Every leaf viewed (aligned batches, int32 labels, nothing the source keeps)."""
    return "zero-copy"


def quiet():
    """int64 labels narrowed with x64 off: no warning in tests that are not about it."""
    return dict(narrow="ok")


# ---- the stage on in-process pipelines ---------------------------------------------------

def test_map_dataset_two_epochs_values():
    ds = grain.MapDataset.source(Examples(40)).batch(8)          # a MapDataset: converted
    out_ds = dlinspect.grain.device_put(ds, **quiet())
    assert isinstance(out_ds, grain.IterDataset)
    for epoch in range(2):
        batches = list(out_ds)
        assert len(batches) == 5
        for k, got in enumerate(batches):
            check_batch(got, range(8 * k, 8 * k + 8))


@pytest.mark.parametrize("cpu_buffer_size,device_buffer_size", [(4, 2), (0, 2), (4, 0), (0, 0)])
def test_iter_pipeline_matches_grain_device_put(cpu_buffer_size, device_buffer_size):
    """A shuffled, mapped IterDataset: the same elements, in the same order, as the
    pipeline itself gives, and as grain.experimental.device_put gives (on the batches
    without their string ids, which jax.device_put refuses)."""
    def pipeline(ids=True):
        ds = (grain.MapDataset.source(Examples(50)).shuffle(seed=3)
              .map(lambda e: {**e, "image": e["image"] * 2}).to_iter_dataset()
              .batch(8, drop_remainder=False))
        return ds if ids else ds.map(lambda b: {k: v for k, v in b.items() if k != "id"})
    buffers = dict(cpu_buffer_size=cpu_buffer_size, device_buffer_size=device_buffer_size)
    plain = list(pipeline())
    ours = list(dlinspect.grain.device_put(pipeline(), **buffers, **quiet()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # jax.device_put narrowing int64 with x64 off
        theirs = list(grain.experimental.device_put(pipeline(ids=False), jax.devices()[0],
                                                    **buffers))
    assert [b["image"].shape[0] for b in ours] == [8] * 6 + [2]
    for p, o, t in zip(plain, ours, theirs, strict=True):
        assert same_values(o["image"], p["image"]) and same_values(o["image"], t["image"])
        assert same_values(o["label"], jax_reference(p["label"]))
        assert o["label"].dtype == t["label"].dtype
        assert o["id"].tolist() == p["id"].tolist()


def test_string_leaves_kept_where_grain_device_put_raises():
    """A batch with string ids: grain.experimental.device_put raises (jax.device_put
    takes numeric arrays only); dlinspect keeps them as they are (leaves="keep")."""
    ds = grain.MapDataset.source(Examples(8)).batch(4)
    with pytest.raises(TypeError, match="not a valid JAX array type"):
        list(grain.experimental.device_put(ds.to_iter_dataset(), jax.devices()[0]))
    got = list(dlinspect.grain.device_put(ds, jax.devices()[0], **quiet()))
    assert [b["id"].tolist() for b in got] == [[f"ex{i}" for i in range(k, k + 4)]
                                              for k in (0, 4)]


def test_np_stack_batches_zero_copy_exactly_when_planned():
    """grain's own np.stack batches in this process: malloc's memory, at least 16-byte
    aligned; a leaf is viewed where it happens to be 64-byte aligned, else copied once."""
    rec = Recorder()
    ds = grain.MapDataset.source(Examples(256)).batch(8).map(rec)
    # (no host buffer: its thread still holds the batch it handed over last, a copy)
    stage = dlinspect.grain.device_put(ds, cpu_buffer_size=0, **quiet())
    out = list(stage)
    for got in out:
        check_batch(got)

    def expect(key, f):   # float32 viewed exactly where 64-byte aligned; int64 narrowed
        return "zero-copy" if key == "image" and f["align"] >= 64 else "copy"
    counts = check_sharing(out, rec, expect, stage.report)
    for facts in rec.seen.values():
        for f in facts.values():
            assert f["type"] == "ndarray" and f["writeable"] and f["align"] >= 16, f
    assert sum(counts.values()) == 2 * 32


def test_aligned_batches_zero_copy_and_copy_false():
    """With a batch_fn stacking into 64-byte aligned memory every leaf is viewed, and
    copy=False holds (no copy anywhere)."""
    rec = Recorder()
    ds = aligned_batches(32).map(rec)
    out = list(dlinspect.grain.device_put(ds, copy=False))
    assert check_sharing(out, rec, viewed) == {("image", "zero-copy"): 4,
                                               ("label", "zero-copy"): 4}
    for got in out:
        check_batch(got)


def test_dlinspect_stack_as_batch_fn_is_zero_copy_and_reported():
    """batch_fn=dlinspect.stack: np.stack's values, every numeric leaf born aligned and
    viewed; the stage's report counts it (and, for np.stack's batches, the copies)."""
    rec = Recorder()
    ds = (grain.MapDataset.source(Examples(64)).map(int32_labels)
          .batch(8, batch_fn=dlinspect.stack).map(rec))
    stage = dlinspect.grain.device_put(ds, cpu_buffer_size=0)
    out = list(stage)
    for got in out:
        check_batch(got)
    assert check_sharing(out, rec, viewed, stage.report) == {("image", "zero-copy"): 8,
                                                             ("label", "zero-copy"): 8}
    report = stage.report.as_dict()
    assert stage.report.batches == 8 and set(report) == {"['image']", "['label']"}
    assert all(r["copied_bytes"] == {} for r in report.values())
    image_bytes = 8 * 8 * int(np.prod(SHAPE)) * 4
    assert report["['image']"]["zero_copy_bytes"] == image_bytes
    plain = dlinspect.grain.device_put(grain.MapDataset.source(Examples(64)).batch(8),
                                       cpu_buffer_size=0, **quiet())
    list(plain)
    got = plain.report.as_dict()["['image']"]
    assert got["zero_copy_bytes"] + sum(got["copied_bytes"].values()) == image_bytes
    assert set(got["copied_bytes"]) <= {"alignment"}


def test_device_given_as_grain_users_pass_it():
    """``device_put(ds, jax.devices()[0])`` (grain's positional device): arrays on that
    device, zero-copy kept (converted as device=None, to_jax's batch fast path)."""
    device = jax.devices()[0]
    rec = Recorder()
    ds = aligned_batches(16).map(rec)
    out = list(dlinspect.grain.device_put(ds, device, cpu_buffer_size=0))
    for got in out:
        check_batch(got)
        assert got["image"].devices() == {device} and got["label"].devices() == {device}
    check_sharing(out, rec, viewed)
    # A single-device sharding is that device, as in jax.device_put.
    single = jax.sharding.SingleDeviceSharding(device)
    for got in dlinspect.grain.device_put(ds, single):
        assert got["image"].devices() == {device}


def test_jax_array_leaves_pass_through():
    """A pipeline that already holds jax.Arrays (a map calling jnp): kept as they are."""
    ds = grain.MapDataset.source(Examples(8)).batch(4).map(
        lambda b: {**b, "image": jax.numpy.asarray(b["image"])})
    for device in (None, jax.devices()[0]):
        for got in dlinspect.grain.device_put(ds, device, **quiet()):
            check_batch(got)


# ---- worker processes: batches in shared memory --------------------------------------------

def test_mp_prefetch_shared_memory_zero_copy_and_lifetime():
    """``mp_prefetch`` workers hand batches over in shared memory (grain's
    SharedMemoryArray: page-aligned, writable): every leaf is viewed, and stays
    valid after grain's iterator is closed and the batch objects are gone."""
    rec = Recorder()
    ds = (grain.MapDataset.source(Examples(64)).map(int32_labels).to_iter_dataset().batch(8)
          .mp_prefetch(grain.MultiprocessingOptions(num_workers=2)).map(rec))
    it = iter(dlinspect.grain.device_put(ds, copy=False))
    out = list(it)
    it.close()
    del it
    gc.collect()
    assert len(out) == 8
    counts = check_sharing(out, rec, viewed)
    assert counts == {("image", "zero-copy"): 8, ("label", "zero-copy"): 8}
    for facts in rec.seen.values():
        for f in facts.values():
            assert f["type"] == "SharedMemoryArray" and f["writeable"] and f["align"] >= 4096, f
    churn = [np.full((8, *SHAPE), -1, np.float32) for _ in range(64)]   # reuse freed memory
    assert sorted(int(i) for b in out for i in indices_of(b)) == list(range(64))
    for got in out:
        check_batch(got)
    del churn


def test_dataloader_through_prefetch_to_jax():
    """A grain.DataLoader is no dataset: ``prefetch_to_jax(loader)`` is its route. Two
    epochs, values right; len() raises TypeError only when called; device_put refuses
    it naming prefetch_to_jax."""
    sampler = grain.samplers.IndexSampler(24, shuffle=False, num_epochs=1,
                                          shard_options=grain.sharding.NoSharding())
    loader = grain.DataLoader(data_source=Examples(24), sampler=sampler, worker_count=2,
                              operations=[grain.transforms.Batch(8)])
    with pytest.raises(TypeError, match=r"prefetch_to_jax\(loader"):
        dlinspect.grain.device_put(loader)
    jax_loader = dlinspect.prefetch_to_jax(loader, **quiet())       # no len() asked: fine
    with pytest.raises(TypeError, match=r"the source of this PrefetchLoader \(DataLoader\) "
                                        r"has no len\(\)"):
        len(jax_loader)
    # Each worker batches its own records (0, 2, 4... and 1, 3, 5...): the order is
    # grain's, the same through prefetch_to_jax.
    expected = [b["label"].tolist() for b in loader]
    assert sorted(sum(expected, [])) == list(range(24))
    for epoch in range(2):
        batches = list(jax_loader)
        assert [b["label"].tolist() for b in batches] == expected
        for got in batches:
            check_batch(got)


def test_dataloader_batches_copied_as_planned():
    """The DataLoader's batches from its worker processes, converted one by one: in
    shared memory, page-aligned, writable, over an mmap that nothing proves this batch
    alone holds (the worker mapped it too): copied, as plan says, the int64 labels
    narrowed to int32 (x64 off); with copy=False the images are viewed."""
    sampler = grain.samplers.IndexSampler(16, shuffle=False, num_epochs=1,
                                          shard_options=grain.sharding.NoSharding())
    loader = grain.DataLoader(data_source=Examples(16), sampler=sampler, worker_count=2,
                              operations=[grain.transforms.Batch(8)])
    rec = Recorder()
    kinds, out = [], []
    for batch in loader:
        kinds.append(dlinspect.plan(rec(batch), **quiet())["image"].kind)
        out.append(dlinspect.to_jax(batch, **quiet()))
    assert kinds == ["copy", "copy"]
    assert check_sharing(out, rec, lambda key, f: "copy") == {("image", "copy"): 2,
                                                              ("label", "copy"): 2}
    for batch in loader:
        got = dlinspect.to_jax({"image": rec(batch)["image"]}, copy=False)
        assert pointer_of(got["image"]) == rec.facts(got)["image"]["ptr"]
    assert all(f["type"] == "SharedMemoryArray" and f["align"] >= 4096
               for facts in rec.seen.values() for f in facts.values())
    for got in out:
        check_batch(got)


# ---- errors, warnings, options ------------------------------------------------------------

def test_error_names_key_path_at_its_batch():
    """An error about one leaf, raised at the batch where it happens (the batches before
    it are yielded first), names the leaf's key path."""
    def nest(b):
        image = b["image"] if b["label"][0] < 16 else b["image"][..., ::2]   # strided
        return {"inputs": {"pixels": image}, "label": b["label"]}
    ds = aligned_batches(32).map(nest)
    got = []
    with pytest.raises(dlinspect.CopyRequiredError) as info:
        for batch in dlinspect.grain.device_put(ds, copy=False):
            got.append(batch)
    assert len(got) == 2
    assert str(info.value).startswith("['inputs']['pixels']: ")
    assert "strides" in str(info.value)


def test_leaves_raise_names_key_path():
    ds = grain.MapDataset.source(Examples(8)).batch(4)
    with pytest.raises(dlinspect.NotDLPackError, match=r"^\['id'\]"):
        list(dlinspect.grain.device_put(ds, leaves="raise", **quiet()))


def test_options_checked_when_built():
    ds = grain.MapDataset.source(Examples(8)).batch(4)
    for bad in (dict(cpu_buffer_size=-1), dict(device_buffer_size=1.5),
                dict(readonly="view"), dict(copy="no")):
        with pytest.raises(ValueError):
            dlinspect.grain.device_put(ds, **bad)
    with pytest.raises(ValueError, match="not both"):
        dlinspect.grain.device_put(ds, jax.devices()[0], sharding=jax.sharding.SingleDeviceSharding(
            jax.devices()[0]))
    with pytest.raises(TypeError, match=r"prefetch_to_jax\(iterable"):
        dlinspect.grain.device_put([{"x": np.ones(3)}])
    with pytest.raises(TypeError, match="jax.Device"):
        dlinspect.grain.device_put(ds, "cpu")


@pytest.mark.parametrize("device_buffer_size", [2, 0])
def test_narrowing_warns_at_the_consumer_line(device_buffer_size):
    """The int64 labels' DLInspectWarning comes on the consumer's thread, attributed to
    the line iterating the dataset, whichever thread converted."""
    ds = grain.MapDataset.source(Examples(16)).batch(8)
    stage = dlinspect.grain.device_put(ds, device_buffer_size=device_buffer_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [b for b in stage]
    ours = [w for w in caught if issubclass(w.category, dlinspect.DLInspectWarning)]
    assert len(ours) == 2 and "int64 is narrowed to int32" in str(ours[0].message)
    assert all(w.filename == __file__ for w in ours), [(w.filename, w.lineno) for w in ours]
    for got in batches:
        check_batch(got)


@pytest.mark.parametrize("device_buffer_size", [2, 0])
def test_x64_mode_of_the_caller_on_the_worker_thread(device_buffer_size):
    """A conversion thread uses the x64 mode the caller had at device_put()
    (jax.enable_x64 is thread-local): int64 labels stay int64."""
    enable = getattr(jax, "enable_x64", None)
    if enable is None:
        pytest.skip("this jax has no jax.enable_x64 context")
    ds = grain.MapDataset.source(Examples(16)).batch(8)
    with enable(True):
        stage = dlinspect.grain.device_put(ds, device_buffer_size=device_buffer_size)
        labels = [b["label"] for b in stage]
    assert [x.dtype for x in labels] == [np.dtype("int64")] * 2


def test_checkpoint_state_through_the_stage():
    """get_state/set_state of grain's iterator work through the stage: restored, it
    continues from the batch after the checkpoint."""
    ds = grain.MapDataset.source(Examples(48)).shuffle(seed=1).batch(8)
    stage = dlinspect.grain.device_put(ds, **quiet())
    it = iter(stage)
    first = [next(it) for _ in range(2)]
    state = it.get_state()
    rest = list(it)
    it2 = iter(stage)
    it2.set_state(state)
    again = list(it2)
    assert len(first) == 2 and len(rest) == len(again) == 4
    for a, b in zip(rest, again):
        assert indices_of(a).tolist() == indices_of(b).tolist()
        check_batch(b)


def test_import_dlinspect_imports_no_grain_and_hint_without_grain():
    code = textwrap.dedent("""
        import sys
        import dlinspect, dlinspect.grain
        assert "grain" not in sys.modules, "import dlinspect.grain imported grain"
        sys.modules["grain"] = None          # as if grain were not installed
        try:
            dlinspect.grain.device_put(object())
        except ImportError as exc:
            print(str(exc))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = proc.stdout.strip()
    assert "\n" not in message and message.endswith("pip install grain"), message


# ---- several devices (a subprocess with 4 forced CPU devices) ---------------------------

def _multidevice_child() -> dict:
    """Run in a subprocess with 4 CPU devices: a sharding given as grain's ``device``
    and as ``sharding=``; aligned batches split in place (zero-copy shards); values
    against NumPy and against grain.experimental.device_put; a non-default device;
    an uneven batch."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    assert len(jax.devices()) == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    data = NamedSharding(mesh, P("data"))
    result: dict = {}

    def pipeline(batch=8, n=32):
        return aligned_batches(n, batch)

    for how in ("device", "sharding"):
        rec = Recorder()
        # (no host buffer: its thread still holds the batch it handed over last, a copy)
        stage = (dlinspect.grain.device_put(pipeline().map(rec), data, cpu_buffer_size=0)
                 if how == "device" else
                 dlinspect.grain.device_put(pipeline().map(rec), sharding=data,
                                            cpu_buffer_size=0))
        shared = 0
        for got in stage:
            facts = rec.facts(got)
            check_batch(got)
            assert got["image"].sharding == data and got["label"].sharding == data
            assert len(got["image"].addressable_shards) == 4
            # Each device views its slice of the (aligned) batch: shard k starts at the
            # batch's pointer plus k slices.
            ptrs = [s.data.unsafe_buffer_pointer() for s in got["image"].addressable_shards]
            step = 2 * int(np.prod(SHAPE)) * 4
            starts = sorted(p - facts["image"]["ptr"] for p in ptrs)
            shared += starts == [k * step for k in range(4)]
        result[how] = shared
    # grain's own device_put on the same pipeline: the same values and sharding.
    no_ids = pipeline().map(lambda b: {k: v for k, v in b.items() if k != "id"})
    for ours, theirs in zip(dlinspect.grain.device_put(pipeline(), data),
                            grain.experimental.device_put(no_ids.to_iter_dataset(), data),
                            strict=True):
        assert same_values(ours["image"], np.asarray(theirs["image"]))
        assert ours["image"].sharding == theirs["image"].sharding
    # A pytree of shardings, as jax.device_put takes: labels replicated.
    tree = {"image": data, "label": NamedSharding(mesh, P()), "id": NamedSharding(mesh, P())}
    for got in dlinspect.grain.device_put(pipeline(), tree):
        assert got["label"].sharding.is_fully_replicated
        check_batch(got)
    # A device that is not the default one.
    other = jax.devices()[2]
    for got in dlinspect.grain.device_put(pipeline(), other):
        assert got["image"].devices() == {other} and got["label"].devices() == {other}
        check_batch(got)
    # The default device, with a leaf already a jax.Array on another device: moved.
    first, last = jax.devices()[0], jax.devices()[3]
    elsewhere = pipeline().map(lambda b: {**b, "image": jax.device_put(b["image"], last)})
    for got in dlinspect.grain.device_put(elsewhere, first):
        assert got["image"].devices() == {first} and got["label"].devices() == {first}
        check_batch(got)
    # An uneven batch: ShardingError naming the key path, at the batch.
    try:
        list(dlinspect.grain.device_put(pipeline(batch=6, n=12), data))
    except dlinspect.ShardingError as exc:
        result["uneven"] = str(exc)
    return result


def test_sharded_over_four_devices():
    code = ("import sys, json; sys.path.insert(0, %r); import test_grain; "
            "print('RESULT', json.dumps(test_grain._multidevice_child()))" % str(HERE))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    assert result["device"] == result["sharding"] == 4        # every batch's shards viewed
    assert result["uneven"].startswith("['image']: "), result["uneven"]
    assert "6" in result["uneven"] and "4" in result["uneven"]


def test_a_transposing_map_computes_right():
    """A pipeline that transposes its batches (NCHW -> NHWC, as before a flax convolution):
    every batch out of the stage computes (a + 0, indexing, reductions, jit) as
    jnp.asarray(np.asarray(batch)) does, a permuted order viewed or not."""
    from _computations import assert_computes_like
    ds = (grain.MapDataset.source(Examples(16)).batch(4, batch_fn=dlinspect.stack)
          .map(lambda b: {**b, "image": b["image"].transpose(0, 2, 3, 1)}))
    plain = list(ds)
    for k, got in enumerate(dlinspect.grain.device_put(ds, **quiet())):
        assert_computes_like(got["image"], plain[k]["image"], f"batch {k}")


class Refilled:
    """A map that puts every element into one aligned buffer, refilled in place: a
    source that reuses its memory."""

    def __init__(self):
        self.buf = aligned_empty((4, 3, 8, 8), np.float32, 64)

    def __call__(self, b):
        self.buf[...] = b["image"]
        return {"image": self.buf, "label": b["label"]}


@pytest.mark.parametrize("device_buffer_size", [0, 2])
def test_a_source_that_refills_one_buffer_never_changes_a_kept_element(device_buffer_size):
    """Kept elements of a map that refills one buffer each hold their own values (checked
    by computation), with no error: the buffer is the map's, so every element is copied
    (with no host buffer: one lets the source run ahead and refill before any copy)."""
    want = [b["image"].copy() for b in grain.MapDataset.source(Examples(16)).batch(4)]
    # (the map after to_iter_dataset: a MapDataset's own maps run ahead on threads)
    for copy in (None, True):
        ds = grain.MapDataset.source(Examples(16)).batch(4).to_iter_dataset().map(Refilled())
        stage = dlinspect.grain.device_put(ds, copy=copy, device_buffer_size=device_buffer_size,
                                           cpu_buffer_size=0, narrow="ok")
        kept = list(stage)
        assert [float(jax.numpy.sum(k["image"] + 0)) for k in kept] == [float(w.sum()) for w in want]
        assert [float(k["image"][1, 2, 3, 4]) for k in kept] == [float(w[1, 2, 3, 4]) for w in want]
        copied = stage.report.as_dict()["['image']"]["copied_bytes"]
        assert copied == ({"aliased": 4 * want[0].nbytes} if copy is None
                          else {"copy=True": 4 * want[0].nbytes})
