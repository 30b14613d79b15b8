"""Batches as data loaders make them: mixed leaves, key paths in errors, jax.Arrays, epochs;
and a batch decided whole, then executed: a failure consumes nothing, whatever the order of
its leaves; containers keep every value they had; the producer's host copies are checked
against the header; a batch that cannot be walked is one clear error."""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import os
import re
import subprocess
import sys
import textwrap
import types
import warnings
from collections import UserDict
from collections.abc import Mapping

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import (  # noqa: E402
    ContainerError,
    CopyRequiredError,
    DLInspectWarning,
    NotDLPackError,
    ProducerError,
    UnsupportedDeviceError,
    plan,
    prefetch_to_jax,
    to_host,
    to_jax,
)
from dlinspect._core import capsule_name  # noqa: E402
from _computations import assert_computes_like  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_array, make_capsule  # noqa: E402


class TestMixedLeaves:
    """A batch that mixes tensors with strings, lists and numbers (``{"image": t, "id":
    ["a", "b"], "lr": 0.1}``, once refused whole by an error that named no field): tensors
    are converted, every other leaf is left as it is (or refused, naming its key path)."""

    def batch(self, torch):
        return {"image": torch.ones(2, 3), "id": ["a", "b"], "lr": 0.1, "m": np.float32(1),
                "caption": b"bytes", "none": None, "obj": object, "n": 3}

    def test_other_leaves_untouched(self, torch):
        b = self.batch(torch)
        out = to_jax(b)
        assert isinstance(out["image"], jax.Array) and out["image"].shape == (2, 3)
        for key in ("id", "lr", "m", "caption", "none", "obj", "n"):
            assert out[key] is b[key] or out[key] == b[key], key
        assert out["id"] == ["a", "b"]

    @pytest.mark.parametrize("make", [
        lambda torch: {"w2": torch.ones(2), "w1": np.ones(3, np.float32), "id": "x",
                       "none": None, "n": 3},
        lambda torch: [torch.ones(2), "s", 1.5, None, np.ones(1, np.float32)],
        lambda torch: (np.ones(2, np.float32), torch.zeros(1), b"raw"),
        lambda torch: {"b": torch.ones(2), "a": {"c": np.ones(1, np.float32)}},
    ])
    def test_plain_containers_come_back_as_jax_walks_them(self, torch, make):
        """A plain dict, list or tuple of tensors and scalars is walked in the core; the
        result is what walking it as a pytree gives (a dict's keys in sorted order),
        and a nested container takes the batch's walker with the same result."""
        x = make(torch)
        out = to_jax(x)
        expected = jax.tree_util.tree_map(lambda v: v, x, is_leaf=lambda v: v is None)
        tree = jax.tree_util.tree_structure
        assert type(out) is type(x) and tree(out, is_leaf=lambda v: v is None) == tree(
            expected, is_leaf=lambda v: v is None)
        if isinstance(x, dict):
            assert list(out) == sorted(x)
        for got, want in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(x)):
            if isinstance(got, jax.Array):
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            else:
                assert got is want

    @pytest.mark.parametrize("where", ["top", "nested", "dataclass"])
    def test_lists_of_text_come_back_as_jax_walks_them(self, torch, where):
        """A list or tuple of str/bytes/numbers/None (a batch's string ids) is kept whole,
        without a walk into it: the same values, a list as a new list (as JAX's walk
        gives), a tuple as it is; plan still routes each item, and leaves="raise" names
        the first item's key path."""
        ids, pair = [f"id{i}" for i in range(256)], ("a", 1, None, 2.5, b"b")
        inner = {"ids": ids, "pair": pair, "x": torch.ones(3)}
        x = {"top": inner, "nested": {"meta": inner, "n": 1},
             "dataclass": Sample(torch.ones(2), inner)}[where]
        out = to_jax(x)
        got = {"top": lambda: out, "nested": lambda: out["meta"],
               "dataclass": lambda: out.label}[where]()
        assert got["ids"] == ids and got["ids"] is not ids and type(got["ids"]) is list
        assert got["pair"] == pair and isinstance(got["x"], jax.Array)
        ids.append("later")   # the result does not share the caller's list
        assert len(got["ids"]) == 256
        del ids[-1]
        routes = dlinspect._tree.flatten(plan(x)).leaves   # (the walker that knows Sample)
        extra = {"top": 0, "nested": 1, "dataclass": 1}[where]   # "n", Sample.name
        assert sum(r.kind == "untouched" for r in routes) == 256 + 4 + extra
        with pytest.raises(NotDLPackError, match=r"\['ids'\]\[0\]: "):
            to_jax(x, leaves="raise")

    def test_leaves_raise(self, torch):
        with pytest.raises(NotDLPackError, match=r"^\['caption'\]: .*bytes.*leaves='keep'"):
            to_jax(self.batch(torch), leaves="raise")
        with pytest.raises(ValueError, match="leaves"):
            to_jax({}, leaves="drop")

    def test_plan_and_explain_per_leaf(self, torch):
        routes = plan(self.batch(torch))
        assert routes["image"].kind == "zero-copy" and routes["id"][0].kind == "untouched"
        assert plan(self.batch(torch), leaves="raise")["lr"].kind == "error"
        text = dlinspect.explain({"x": np.ones(2, np.float32)[::2], "id": "a"})
        assert "['x']:" in text and "copy" in text and "['id']: untouched" in text

    def test_explain_gives_a_run_of_non_tensors_one_line(self):
        batch = {"ids": [f"id{i}" for i in range(256)], "pixels": np.ones(4, np.float32),
                 "meta": ["a", 3, np.ones(2, np.float32), "b"], "name": "x"}
        lines = dlinspect.explain(batch).splitlines()
        assert "['ids'][0] .. ['ids'][255]: 256 leaves untouched (Not a tensor (builtins.str)" \
            in lines[0]
        # A run ends where the parent, the reason or a tensor changes: each stays in order.
        heads = [line.split(":")[0] for line in lines if not line.startswith(" ")]
        assert heads == ["['ids'][0] .. ['ids'][255]", "['meta'][0]", "['meta'][1]",
                         "['meta'][2]", "['meta'][3]", "['name']", "['pixels']"]

    def test_explain_of_a_pytree_without_leaves_says_so(self):
        """None, {} and a dict of Nones are pytrees without leaves: explain says that, not
        an empty string, and to_jax returns them as they are."""
        for x in (None, {}, [], {"a": None}):
            assert dlinspect.explain(x).startswith("<no leaves: a pytree without any")
            assert to_jax(x) == x

    def test_a_single_non_tensor_follows_the_leaf_rule(self):
        # One rule at every depth: kept by default, refused with leaves="raise".
        for x in (object(), "text", 3.5, b"raw", [1, 2, 3], np.array(["a", "b"])):
            assert to_jax(x) is x or to_jax(x) == x
            assert plan(x).kind == "untouched" if not isinstance(x, list) else \
                [r.kind for r in plan(x)] == ["untouched"] * 3
            with pytest.raises(NotDLPackError):
                to_jax(x, leaves="raise")
            with pytest.raises(NotDLPackError):
                to_jax({"nested": x}, leaves="raise")
        assert to_jax(None) is None and plan(None) is None

    @pytest.mark.parametrize("array, dtype", [(np.array(["a", "b"]), "<U1"),
                                              (np.array(["2020-01-01"], "datetime64[D]"),
                                               "datetime64[D]"),
                                              (np.array([None, 1], object), "object")])
    def test_a_non_numeric_array_is_named_with_its_dtype(self, array, dtype):
        # Why an array is no tensor is its dtype: said where it is kept and where refused.
        kept = plan({"a": array})["a"]
        assert kept.kind == "untouched"
        assert f"numpy.ndarray of dtype {dtype} that DLPack has no type for" in kept.reason
        with pytest.raises(NotDLPackError, match=rf"\['a'\]: a leaf of type numpy\.ndarray of "
                                                 rf"dtype {re.escape(dtype)} that DLPack"):
            to_jax({"a": array}, leaves="raise")
        assert "of dtype" not in plan({"s": "text"})["s"].reason   # (no dtype: its type alone)

    @pytest.mark.parametrize("wrap", [lambda b: b, lambda b: {"outer": b}, lambda b: [b]])
    @pytest.mark.parametrize("make", [lambda t: {"a": t, "b": None}, lambda t: [t, None],
                                      lambda t: (t, None)])
    def test_none_is_no_leaf_at_any_depth(self, wrap, make):
        # None is JAX's empty subtree: kept as None, planned as None, never a leaf that
        # leaves="raise" refuses or explain lists, in a plain container as in a nested one.
        t = np.arange(3, dtype=np.float32)
        x = wrap(make(t))
        expected = jax.tree_util.tree_map(lambda v: jax.numpy.asarray(v) + 0, x)
        for leaves in ("keep", "raise"):
            out = to_jax(x, leaves=leaves)
            assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(x)
            for got, want in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(expected)):
                np.testing.assert_array_equal(got + 0, want)
            routes = plan(x, leaves=leaves)
            assert jax.tree_util.tree_structure(routes) == jax.tree_util.tree_structure(x)
            # (one route, t's: zero-copy, or a copy once an array of the loop views t)
            (route,) = jax.tree_util.tree_leaves(routes)
            assert route.info.data_ptr == dlinspect.peek(t).data_ptr and route.problem is None
        assert "untouched" not in dlinspect.explain(x)


class TestKeyPaths:
    """Every error raised for a leaf names it as jax.tree_util.keystr writes it."""

    @pytest.mark.parametrize("make, error", [
        (lambda torch: torch.ones(2, requires_grad=True), ProducerError),
        (lambda torch: FakeProducer(np.ones(2, np.float32), (D.kDLVulkan, 0)), UnsupportedDeviceError),
        (lambda torch: np.arange(6, dtype=np.float32)[::2], CopyRequiredError),
        (lambda torch: make_capsule(address=16, shape=(2,), name="used_dltensor",
                                    null_deleter=True), dlinspect.CapsuleConsumedError),
    ])
    def test_every_error_kind(self, torch, make, error):
        batch = {"inputs": {"pixels": make(torch)}, "labels": np.arange(2, dtype=np.int32)}
        kw = dict(copy=False, fallback="raise")
        with pytest.raises(error, match=r"^\['inputs'\]\['pixels'\]: ") as info:
            to_jax(batch, **kw)
        assert info.value.key_path == "['inputs']['pixels']"
        route = plan(batch, **kw)["inputs"]["pixels"]
        assert route.kind == "error" and str(route.error).startswith("['inputs']['pixels']: ")
        with pytest.raises(error, match=r"^\['inputs'\]\['pixels'\]: "):
            list(prefetch_to_jax([batch], **kw))

    def test_a_model_s_parameters_say_how_to_detach_them_all(self, torch):
        """torch's refusal of a tensor that requires grad names t.detach() only; the fix
        dlinspect adds says how for a whole dict of them, as a model's parameters are."""
        params = dict(torch.nn.Linear(2, 2).named_parameters())
        with pytest.raises(ProducerError, match=r"To fix: .*v\.detach\(\) for k, v in d\.items"):
            to_jax(params)
        fixed = to_jax({k: v.detach() for k, v in params.items()})
        assert_computes_like(fixed["weight"], params["weight"].detach().numpy())

    def test_list_and_tuple_paths(self, torch):
        with pytest.raises(ProducerError, match=r"^\[1\]\[0\]: "):
            to_jax([np.ones(2, np.float32), (torch.ones(1, requires_grad=True),)])
        with pytest.raises(ProducerError, match=r"^\[1\]\[0\]: "):
            to_jax([np.ones(2, np.float32), (torch.ones(1, requires_grad=True),)], device=jax.devices()[0])

    def test_failed_batch_consumes_nothing(self):
        counter = DeleterCounter()
        cap = make_capsule(aligned_array([1, 2]), counter=counter)
        with pytest.raises(ProducerError):
            to_jax({"a": cap, "b": FakeProducer(np.ones(1), refuse="no")})
        assert dlinspect._core.capsule_name(cap) in ("dltensor_versioned", "used_dltensor_versioned")
        del cap
        gc.collect()
        assert counter.calls == 1


class TestJaxArrays:
    """A jax.Array (whose versioned capsule says READ_ONLY, so that each one was once
    copied) is not a foreign tensor: no DLPack round trip."""

    def test_returned_as_it_is(self):
        j = jax.numpy.arange(1024.0)
        assert to_jax(j) is j
        assert to_jax({"a": j})["a"] is j
        route = plan(j)
        assert route.kind == "zero-copy" and "already" in route.reason
        assert "jax.Array" in dlinspect.explain(j)

    def test_device_and_copy(self):
        dev = jax.devices("cpu")[0]
        with jax.default_device(dev):   # (uncommitted on the CPU, where JAX's default is a TPU too)
            j = jax.numpy.arange(4.0)
        # committed there, as jax.device_put commits, without a copy
        placed = to_jax(j, device=dev)
        assert placed._committed and not j._committed and plan(j, device=dev).kind == "zero-copy"
        assert placed.unsafe_buffer_pointer() == j.unsafe_buffer_pointer()
        assert to_jax(placed, device=dev) is placed
        c = to_jax(j, copy=True)
        assert c is not j and c.unsafe_buffer_pointer() != j.unsafe_buffer_pointer()
        assert plan(j, copy=True).kind == "copy"
        assert c.tolist() == j.tolist()

    def test_inside_prefetch(self):
        j = jax.numpy.ones(3)
        assert [b["x"] is j for b in prefetch_to_jax([{"x": j}] * 2)] == [True, True]


class TestLoader:
    """prefetch_to_jax returns a loader: one epoch per iter(), len() of its source."""

    def batches(self, n=4):
        return [{"x": aligned_array(np.full((2, 2), i)), "id": f"b{i}"} for i in range(n)]

    @pytest.mark.parametrize("thread", [True, False])
    def test_epochs(self, thread):
        loader = prefetch_to_jax(self.batches(), thread=thread)
        assert len(loader) == 4
        for _ in range(3):
            assert [b["id"] for b in loader] == ["b0", "b1", "b2", "b3"]
            assert [float(b["x"][0, 0]) for b in loader] == [0, 1, 2, 3]

    def test_no_len(self):
        loader = prefetch_to_jax(iter(self.batches()))
        with pytest.raises(TypeError, match="no len"):
            len(loader)
        assert len(list(loader)) == 4   # an iterator runs once; a second epoch is refused
        with pytest.raises(dlinspect.SourceExhaustedError):
            list(loader)

    def test_torch_dataloader_epochs(self, torch):
        from torch.utils.data import DataLoader, TensorDataset
        data = TensorDataset(torch.arange(12, dtype=torch.float32).reshape(6, 2))
        loader = prefetch_to_jax(DataLoader(data, batch_size=2))
        assert len(loader) == 3
        for _ in range(2):
            assert [float(b[0][0, 0]) for b in loader] == [0.0, 4.0, 8.0]

    def test_early_exit_frees_the_thread(self):
        import threading
        loader = prefetch_to_jax(self.batches(50), size=3)
        for i, _ in enumerate(loader):
            if i == 2:
                break
        gc.collect()
        assert [t for t in threading.enumerate() if t.name == "dlinspect-prefetch"] == []
        assert len(list(loader)) == 50

    def test_inline_warnings_at_the_callers_line(self):
        with pytest.warns(dlinspect.DLInspectWarning) as record:
            for _ in prefetch_to_jax([np.arange(4)] * 2, thread=False):
                pass
        assert {w.filename for w in record} == {__file__}

    def test_option_checks(self):
        with pytest.raises(ValueError, match="leaves"):
            prefetch_to_jax([], leaves="x")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(prefetch_to_jax([])) == []


class BatchEncoding(UserDict):
    """What transformers' BatchEncoding / BatchFeature are: a UserDict subclass."""

    def __init__(self, data=None, tensor_type=None):
        super().__init__(data)
        self.tensor_type = tensor_type


class Batch(dict):
    """A dict subclass (JAX does not register it)."""


class FrozenMapping(Mapping):
    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class NoDictConstructor(Mapping):
    """A Mapping whose constructor takes no dict: it cannot be rebuilt."""

    def __init__(self, a, b):
        self._data = {"a": a, "b": b}

    __getitem__ = FrozenMapping.__getitem__
    __iter__ = FrozenMapping.__iter__
    __len__ = FrozenMapping.__len__


@dataclasses.dataclass(frozen=True)
class Sample:
    image: object
    label: object
    name: str = "x"
    cached: object = dataclasses.field(default=None, init=False)


Pair = collections.namedtuple("Pair", ["left", "right"])


class TestContainers:
    """Batches as PyTorch and Hugging Face users make them (issue 16): Mappings and
    dataclasses are walked and rebuilt as their own type, by every entry point."""

    def batch(self, torch):
        return {"enc": BatchEncoding({"input_ids": torch.tensor([[0, 1, 2, 3]], dtype=torch.int32),
                                      "attention_mask": torch.ones(1, 4, dtype=torch.int32)}),
                "sub": Batch(x=np.ones(2, np.float32), text=np.array(["a", "b"])),
                "frozen": FrozenMapping({"y": torch.zeros(3)}),
                "sample": Sample(torch.ones(2, 2), torch.tensor([1], dtype=torch.int32)),
                "pair": Pair(np.arange(2, dtype=np.float32), "right")}

    def check(self, out):
        assert type(out["enc"]) is BatchEncoding and isinstance(out["enc"]["input_ids"], jax.Array)
        assert out["enc"]["input_ids"].tolist() == [[0, 1, 2, 3]]
        assert type(out["sub"]) is Batch and isinstance(out["sub"]["x"], jax.Array)
        assert out["sub"]["text"].tolist() == ["a", "b"]                  # a leaf, kept
        assert type(out["frozen"]) is FrozenMapping and isinstance(out["frozen"]["y"], jax.Array)
        assert type(out["sample"]) is Sample and isinstance(out["sample"].image, jax.Array)
        assert out["sample"].name == "x" and out["sample"].label.tolist() == [1]
        assert type(out["pair"]) is Pair and isinstance(out["pair"].left, jax.Array)

    def test_to_jax(self, torch):
        self.check(to_jax(self.batch(torch)))
        self.check(to_jax(self.batch(torch), device=jax.devices("cpu")[0]))

    def test_top_level_containers(self, torch):
        enc = to_jax(BatchEncoding({"ids": torch.arange(3, dtype=torch.int32)}))
        assert type(enc) is BatchEncoding and isinstance(enc["ids"], jax.Array)
        s = to_jax(Sample(np.ones(1, np.float32), 1))
        assert type(s) is Sample and isinstance(s.image, jax.Array) and s.label == 1

    def test_plan_explain_and_prefetch(self, torch):
        routes = plan(self.batch(torch))
        assert type(routes["enc"]) is BatchEncoding
        assert routes["enc"]["input_ids"].kind == "zero-copy"
        assert routes["sub"]["text"].kind == "untouched"
        assert routes["sample"].image.kind == "zero-copy"
        text = dlinspect.explain(self.batch(torch))
        assert "['enc']['input_ids']:" in text and "['sample'].image:" in text
        for out in prefetch_to_jax([self.batch(torch)] * 2):
            self.check(out)

    def test_sharded(self, torch):
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
        s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        self.check(to_jax(self.batch(torch), sharding=s))

    def test_key_paths_inside(self, torch):
        batch = self.batch(torch)
        batch["enc"]["labels"] = torch.ones(2, requires_grad=True)
        with pytest.raises(ProducerError, match=r"^\['enc'\]\['labels'\]: ") as info:
            to_jax(batch)
        assert info.value.key_path == "['enc']['labels']"
        assert plan(batch)["enc"]["labels"].kind == "error"
        batch = self.batch(torch)
        batch["sample"] = Sample(torch.ones(1, requires_grad=True), 0)
        with pytest.raises(ProducerError, match=r"^\['sample'\]\.image: "):
            to_jax(batch)
        with pytest.raises(NotDLPackError, match=r"^\['pair'\]\.right: "):
            to_jax(self.batch(torch), leaves="raise")

    def test_cannot_rebuild(self):
        with pytest.raises(dlinspect.ContainerError, match="NoDictConstructor.*register"):
            to_jax({"m": NoDictConstructor(np.ones(1, np.float32), 2)})


class TestTypedKeysAndDeadArrays:
    """Typed PRNG key arrays are jax.Arrays everywhere; deleted or donated arrays are
    one clear error from every function."""

    def test_prng_keys(self):
        key = jax.random.key(0)
        assert to_jax(key) is key and plan(key).kind == "zero-copy"
        assert to_jax({"k": key})["k"] is key
        dev = jax.devices("cpu")[0]
        placed = to_jax({"k": key}, device=dev)["k"]   # committed there, as device_put does
        assert placed._committed and to_jax(placed, device=dev) is placed
        copied = to_jax(key, copy=True)
        assert copied is not key and jax.random.key_data(copied).tolist() == \
            jax.random.key_data(key).tolist()
        keys = jax.random.split(key, len(jax.devices()))
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        out = to_jax({"k": keys, "x": np.ones((len(jax.devices()), 2), np.float32)}, sharding=s)
        assert out["k"].sharding.is_equivalent_to(s, 1)
        with pytest.raises(NotDLPackError, match="key_data"):
            dlinspect.peek(key)

    def test_deleted_array(self):
        x = jax.numpy.ones(3)
        x.delete()
        for call in (lambda: to_jax(x), lambda: to_jax({"a": x}), lambda: dlinspect.to_host(x),
                     lambda: dlinspect.peek(x), lambda: to_jax(x, device=jax.devices()[0])):
            with pytest.raises(ProducerError, match="deleted or donated"):
                call()
        assert plan(x).kind == "error" and "deleted or donated" in str(plan(x).error)
        with pytest.raises(ProducerError, match=r"^\['a'\]: .*deleted"):
            to_jax({"a": x})

    def test_traced_values_inside_jit_vmap_and_grad(self):
        """A function that converts its batch with to_jax runs under jax.jit, vmap and grad:
        there its values are tracers, JAX's own, returned as they are (or put where a device
        or sharding asks, or copied for copy=True), as jnp.asarray returns them."""
        dev = jax.devices("cpu")[-1]
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        for options in ({}, {"copy": True}, {"device": dev}, {"sharding": s}):
            step = jax.jit(functools.partial(lambda b, kw: to_jax(b, **kw)["x"].sum() * 2,
                                             kw=options))
            assert step({"x": jax.numpy.arange(4.0)}).item() == 12.0, options
        twice = jax.vmap(lambda x: to_jax(x) * 2)(jax.numpy.ones((2, 3)))
        assert twice.tolist() == [[2.0] * 3] * 2
        grad = jax.grad(lambda x: (to_jax(x) ** 2).sum())(jax.numpy.arange(3.0))
        assert grad.tolist() == [0.0, 2.0, 4.0]
        traced = []
        jax.jit(lambda x: traced.append(plan(x)) or x)(jax.numpy.ones(3))
        assert traced[0].kind == "zero-copy" and traced[0].jax_device is None
        assert "on None" not in plan(jax.numpy.ones(3)).reason


class TestAllocation:
    """A copy that cannot be had is an AllocationError before anything is consumed."""

    def test_too_large_for_this_machine(self):
        huge = np.broadcast_to(np.float32(1), (10**6, 10**6))     # 4 TB as a C-order copy
        route = plan(huge)
        assert route.kind == "error" and isinstance(route.error, dlinspect.AllocationError)
        assert "4000000000000 bytes" in str(route.error)
        cap = huge.__dlpack__(max_version=(1, 3)) if huge.flags.writeable else None
        with pytest.raises(dlinspect.AllocationError, match="4000000000000 bytes"):
            to_jax(huge)
        with pytest.raises(MemoryError):   # the built-in type, too
            to_jax(huge)
        assert cap is None or dlinspect._core.capsule_name(cap) == "dltensor_versioned"

    @pytest.mark.slow
    def test_failed_allocation_consumes_nothing(self):
        # malloc refused for real: the address space capped (RLIMIT_AS) a little above
        # what the process uses, then a copy larger than the rest (a broadcast source:
        # its memory is one row). Not under AddressSanitizer, whose shadow memory needs
        # terabytes of address space.
        if "asan" in os.environ.get("LD_PRELOAD", "") or sys.platform != "linux":
            pytest.skip("RLIMIT_AS caps malloc on Linux, and not under AddressSanitizer")
        code = textwrap.dedent("""
            import resource, numpy as np, dlinspect
            from dlinspect.testing import DeleterCounter, make_capsule
            dlinspect.to_jax(np.ones(4, np.float32))   # JAX started before the cap
            counter = DeleterCounter()
            row = np.arange(1024, dtype=np.float32)
            cap = make_capsule(row, shape=(1 << 20, 1024), strides=(0, 1), counter=counter)
            used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
            resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), resource.RLIM_INFINITY))
            try:
                dlinspect.to_jax(cap)                  # 4 GiB to copy, 1 GiB of room
            except dlinspect.AllocationError as exc:
                assert "4294967296 bytes" in str(exc) and "nothing was consumed" in str(exc), exc
            else:
                raise AssertionError("no AllocationError")
            assert dlinspect._core.capsule_name(cap) == "dltensor_versioned"
            assert counter.calls == 0
            # In a batch, on every batch path: a later leaf's copy that cannot be allocated
            # leaves the earlier leaves (viewed, or copied) unconsumed too.
            import jax
            cpu = jax.devices("cpu")[0]
            one = jax.sharding.SingleDeviceSharding(cpu)
            for options in ({}, {"device": cpu}, {"copy": True}, {"sharding": one},
                            {"readonly": "share"}):
                for kind in (dict, list):
                    mine = DeleterCounter()
                    view = make_capsule(np.arange(16, dtype=np.float32), counter=mine)
                    copied = make_capsule(row, shape=(4, 1024), strides=(0, 1), counter=mine)
                    leaves = [view, copied, cap]
                    batch = (dict(zip("abc", leaves)) if kind is dict else leaves)
                    try:
                        dlinspect.to_jax(batch, **options)
                    except dlinspect.AllocationError as exc:
                        assert "4294967296 bytes" in str(exc), exc
                    else:
                        raise AssertionError(("no AllocationError", options))
                    names = [dlinspect._core.capsule_name(c) for c in leaves]
                    assert names == ["dltensor_versioned"] * 3, (options, kind, names)
                    assert counter.calls == 0 and mine.calls == 0, (options, kind)
            small = make_capsule(row, shape=(4, 1024), strides=(0, 1), counter=counter)
            assert dlinspect.to_jax(small)[3].tolist() == row.tolist() and counter.calls == 1
            print("ok")
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# ---- a batch decided whole, then executed --------------------------------------------
class NeedsTwo(UserDict):
    """A Mapping whose constructor needs a second argument: it cannot be rebuilt."""

    def __init__(self, data, extra):
        super().__init__(data)
        self.extra = extra


def _needs_two(counter):
    return NeedsTwo({"x": make_capsule(aligned_array([1.0]), counter=counter)}, 1)


# One failing leaf of each kind: (make(counter), the options, the error type).
FAILING = {
    "refusal": (lambda c: FakeProducer(np.ones(2, np.float32), refuse="no"), {},
                ProducerError),
    "no rebuild": (_needs_two, {}, ContainerError),
    "host copy raises": (lambda c: FakeProducer(np.ones(3, np.float32), (D.kDLVulkan, 0),
                                                host_copy=False), {},
                         dlinspect.UnsupportedDeviceError),
    "wrong host copy": (lambda c: FakeProducer(np.ones((2, 2), np.float32), (D.kDLVulkan, 0),
                                               host_values=np.arange(4, dtype=np.int32)), {},
                        ProducerError),
    "copy=False": (lambda c: make_capsule(np.arange(6, dtype=np.float32), shape=(3,),
                                          strides=(2,), counter=c), {"copy": False},
                   dlinspect.CopyRequiredError),
    "consumed": (lambda c: make_capsule(address=64, shape=(2,), dtype=np.float32,
                                        name="used_dltensor_versioned", null_deleter=True), {},
                 dlinspect.CapsuleConsumedError),
    "not a tensor": (lambda c: "text", {"leaves": "raise"}, dlinspect.NotDLPackError),
    # (4 KiB of memory broadcast along its first axis: 4 PiB to copy)
    "too large": (lambda c: make_capsule(np.zeros(2**10, np.float32), shape=(2**40, 2**10),
                                         strides=(0, 1), null_deleter=True), {},
                  dlinspect.AllocationError),
}


def _good_leaves(counter, n):
    """Bare capsules every route of which consumes them: viewed, copied small in C,
    copied large (int64 narrowed), copied for strides."""
    makers = [
        lambda: make_capsule(aligned_array(np.arange(8.0)), counter=counter),
        lambda: make_capsule(np.arange(300_000, dtype=np.int64), counter=counter),
        lambda: make_capsule(np.arange(12, dtype=np.float32), shape=(6,), strides=(2,),
                             counter=counter),
        lambda: make_capsule(aligned_array(np.arange(4.0), np.float32), counter=counter),
    ]
    return [makers[i % len(makers)]() for i in range(n)]


@pytest.mark.slow
@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(kind=st.sampled_from(sorted(FAILING)), n=st.integers(1, 5), data=st.data())
def test_a_failing_batch_consumes_nothing(kind, n, data):
    """Whatever leaf fails and wherever it stands among the others (dict keys sort it
    anywhere), no capsule of the batch is consumed and no deleter runs."""
    make, options, error = FAILING[kind]
    counter = DeleterCounter()
    good = _good_leaves(counter, n)
    where = data.draw(st.integers(0, n))
    leaves = good[:where] + [make(counter)] + good[where:]
    keys = data.draw(st.permutations([f"k{i}" for i in range(len(leaves))]))
    as_list = data.draw(st.booleans())
    batch = list(leaves) if as_list else dict(zip(keys, leaves))
    with pytest.raises(error):
        to_jax(batch, **options)
    assert [capsule_name(c) for c in good] == ["dltensor_versioned"] * n
    assert counter.calls == 0
    routes = jax.tree_util.tree_leaves(plan(batch, **options),
                                       is_leaf=lambda r: isinstance(r, dlinspect.Route))
    if kind in ("host copy raises", "wrong host copy"):
        # plan does not ask the producer for its host copy: the route says it will
        assert any(r.kind == "host-fallback" for r in routes), kind
    else:
        assert any(r.kind == "error" and isinstance(r.error, error) for r in routes), kind
    del batch, leaves, good
    gc.collect()


def test_the_same_capsule_twice_is_refused_naming_the_second():
    counter = DeleterCounter()
    cap = make_capsule(aligned_array([1.0, 2.0]), counter=counter)
    with pytest.raises(dlinspect.CapsuleConsumedError, match=r"^\['b'\]: .*same object twice"):
        to_jax({"a": cap, "b": cap})
    with pytest.raises(dlinspect.CapsuleConsumedError, match=r"^\[1\]\[0\]: "):
        to_jax([cap, (cap,)])
    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    for sharding in (one, {"a": one, "b": one}, {"a": one, "b": {"c": one}}):
        # across the sub-trees of a pytree of shardings as within one
        with pytest.raises(dlinspect.CapsuleConsumedError, match=r"^\['b'\]\['c'\]: "):
            to_jax({"a": cap, "b": {"c": cap}}, sharding=sharding)
    routes = plan({"a": cap, "b": cap})
    # (a bare capsule in a batch is copied: nothing proves that its producer lets go of it)
    assert routes["a"].kind == "copy" and routes["b"].kind == "error"
    assert capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
    assert to_jax({"a": cap})["a"].tolist() == [1.0, 2.0]


def test_a_container_that_cannot_be_rebuilt_is_an_error_route_in_its_place():
    counter = DeleterCounter()
    batch = {"a": make_capsule(aligned_array([1.0]), counter=counter), "m": _needs_two(counter)}
    with pytest.raises(ContainerError, match=r"^\['m'\]: .*NeedsTwo.*nothing was converted"):
        to_jax(batch)
    routes = plan(batch)
    assert routes["a"].kind == "copy"   # (a bare capsule in a batch proves nothing)
    assert routes["m"].kind == "error" and isinstance(routes["m"].error, ContainerError)
    assert "['m']:" in dlinspect.explain(batch)
    assert capsule_name(batch["a"]) == "dltensor_versioned" and counter.calls == 0


class TestProducerCopies:
    """A producer's host copy is checked against the header it exported."""

    def wrong(self, **kw):
        return FakeProducer(np.ones((4, 2), np.float32), (D.kDLVulkan, 0),
                            host_values=np.arange(8, dtype=np.int32), **kw)

    def test_dlpack_host_copy(self):
        for convert in (to_jax, to_host):
            with pytest.raises(ProducerError, match=r"shape \(8,\) and dtype int32, but .* "
                                                    r"shape \(4, 2\) and dtype float32"):
                convert(self.wrong())

    def test_own_method_and_in_a_batch(self):
        class WithNumpy(FakeProducer):
            def numpy(self):
                return self.host_values

        p = WithNumpy(np.ones((4, 2), np.float32), (D.kDLVulkan, 0), host_copy=False,
                      host_values=np.arange(8, dtype=np.int32))
        with pytest.raises(ProducerError, match="WithNumpy's host copy has shape"):
            to_jax(p)
        with pytest.raises(ProducerError, match=r"^\['p'\]: "):
            to_jax({"p": self.wrong(), "x": np.ones(2, np.float32)})

    def test_right_copies_pass(self):
        y = to_jax(FakeProducer(np.arange(8, dtype=np.float32).reshape(4, 2), (D.kDLVulkan, 0)))
        assert y.shape == (4, 2) and y.dtype == np.float32


class TestWalks:
    """A batch that cannot be walked is a ContainerError naming where, from every entry."""

    def test_a_cycle(self):
        d = {"x": np.ones(1, np.float32)}
        d["self"] = d
        for call in (to_jax, plan, dlinspect.explain):
            with pytest.raises(ContainerError, match=r"\['self'\] is one of the containers"):
                call(d)
        u = UserDict({"x": np.ones(1, np.float32)})
        u["again"] = u
        with pytest.raises(ContainerError, match=r"\['u'\]\['again'\]"):
            to_jax({"u": u})

    def test_too_deep(self):
        deep = np.ones(1, np.float32)
        for _ in range(3000):
            deep = [deep]
        with pytest.raises(ContainerError, match="more than 200 containers deep"):
            to_jax(deep)
        inner = UserDict({"x": np.ones(1, np.float32)})
        for _ in range(300):
            inner = UserDict({"x": inner})
        with pytest.raises(ContainerError, match="deep"):
            to_jax(inner)

    def test_keys_of_several_types(self):
        batch = {"inner": {1: np.ones(1, np.float32), "a": np.ones(1, np.float32)}}
        with pytest.raises(ContainerError, match=r"dict at \['inner'\] has keys of several "
                                                 r"types \(int, str\)"):
            to_jax(batch)
        with pytest.raises(ContainerError):
            plan(batch)


@dataclasses.dataclass
class WithCache:
    image: object
    cache: object = dataclasses.field(default=None, init=False)

    def __post_init__(self):
        self.calls = getattr(self, "calls", 0) + 1


class TestContainersKeepEveryValue:
    def test_dataclass_init_false_fields_kept(self):
        s = WithCache(np.ones(2, np.float32))
        s.cache = np.arange(3, dtype=np.float32)   # a tensor in a field __init__ never takes
        out = to_jax(s)
        assert type(out) is WithCache and isinstance(out.image, jax.Array)
        assert isinstance(out.cache, jax.Array) and out.cache.tolist() == [0.0, 1.0, 2.0]
        assert out.calls == 1   # __init__ and __post_init__ are not run again
        s.cache = "kept"
        assert to_jax(s).cache == "kept"

    @pytest.mark.parametrize("make", [
        lambda torch: torch.max(torch.ones(2, 3), dim=0),     # a structseq
        lambda torch: types.SimpleNamespace(a=torch.ones(1), b="x"),
        lambda torch: type("Row", (tuple,), {})([torch.ones(1), 2]),
        lambda torch: type("Rows", (list,), {})([torch.ones(1), torch.zeros(2)]),
    ])
    def test_walked_by_every_entry_point(self, torch, make):
        x = make(torch)
        for out in (to_jax(x, narrow="ok"), next(iter(prefetch_to_jax([x], narrow="ok")))):
            assert type(out) is type(x)
            leaves = jax.tree_util.tree_leaves(vars(out) if isinstance(out, types.SimpleNamespace)
                                               else list(out))
            assert all(isinstance(v, jax.Array) for v in leaves if not isinstance(v, (int, str)))
        routes = plan(x)
        assert type(routes) is type(x)


def test_a_batch_narrowing_warning_names_the_leaf_it_is_about():
    """A batch with int64 labels and a nested float64 leaf warns once per leaf, each message
    starting with the leaf's key path (as an error about a leaf does); a tensor alone warns
    without one. A copied leaf (the sliced one) and a viewed one say the same."""
    batch = {"image": aligned_array(np.ones((2, 3), np.float32)), "label": np.arange(2),
             "extra": {"w": np.arange(6.0)[::2]}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = to_jax(batch)
        to_jax(np.arange(3))
    texts = sorted(str(w.message) for w in caught if w.category is DLInspectWarning)
    assert [t.split(" is narrowed")[0] for t in texts] == [
        "['extra']['w']: float64", "['label']: int64", "int64"]
    assert out["label"].dtype == np.int32 and int((out["label"] + 0).sum()) == 1
    assert float(out["extra"]["w"].sum()) == 6.0


class TestWarningsBeforeAnythingIsTaken:
    """A narrowing warning is given once every leaf is decided and before any is taken:
    a filter that makes it an exception (or a showwarning that raises) leaves every
    capsule of the batch as it was, on every batch path."""

    OPTIONS = [{}, {"copy": True}, {"readonly": "share"}, {"device": "cpu"},
               {"sharding": "cpu"}]

    @staticmethod
    def _batch(counter, kind):
        viewed = make_capsule(aligned_array(np.arange(8.0)), counter=counter)
        copied = make_capsule(np.arange(12, dtype=np.float32), shape=(6,), strides=(2,),
                              counter=counter)
        wide = make_capsule(np.arange(4, dtype=np.int64), counter=counter)
        refused_by_jax = FakeProducer(np.ones(2, np.float32), (D.kDLVulkan, 0))  # host copy
        leaves = [viewed, copied, wide, refused_by_jax][:4 if kind == "general" else 3]
        if kind == "list":
            return leaves, leaves[:3]
        return dict(zip(["a", "b", "c", "d"], leaves)), leaves[:3]

    @pytest.mark.parametrize("kind", ["dict", "list", "general"])
    @pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "default")
    def test_error_filter(self, kind, options):
        import warnings
        cpu = jax.devices("cpu")[0]
        options = {k: (jax.sharding.SingleDeviceSharding(cpu) if k == "sharding" else cpu)
                   if v == "cpu" else v for k, v in options.items()}
        counter = DeleterCounter()
        batch, caps = self._batch(counter, kind)
        with warnings.catch_warnings():
            warnings.simplefilter("error", dlinspect.DLInspectWarning)
            with pytest.raises(dlinspect.DLInspectWarning, match="int64"):
                to_jax(batch, **options)
        assert [capsule_name(c) for c in caps] == ["dltensor_versioned"] * 3
        assert counter.calls == 0

    @pytest.mark.parametrize("kind", ["dict", "general"])
    def test_showwarning_that_raises(self, kind):
        import warnings

        def interrupt(*args, **kwargs):
            raise KeyboardInterrupt
        counter = DeleterCounter()
        batch, caps = self._batch(counter, kind)
        with warnings.catch_warnings():
            warnings.simplefilter("always", dlinspect.DLInspectWarning)
            warnings.showwarning = interrupt
            with pytest.raises(KeyboardInterrupt):
                to_jax(batch)
        assert [capsule_name(c) for c in caps] == ["dltensor_versioned"] * 3
        assert counter.calls == 0


class TestContainersThatRefuseJaxArrays:
    """Issue cases: a container that refuses JAX arrays when rebuilt is found before any
    leaf is taken: ContainerError naming it and its key path, every capsule unconsumed."""

    class NdarraysOnly(UserDict):
        def __init__(self, values=None):
            super().__init__()
            for key, value in (values or {}).items():
                if not isinstance(value, np.ndarray):
                    raise TypeError("values must be ndarrays")
                self[key] = value

    Pair = collections.namedtuple("Pair", "x y")

    class CheckedPair(Pair):
        def __new__(cls, x, y):
            if not isinstance(x, np.ndarray):
                raise ValueError("x must be an ndarray")
            return super().__new__(cls, x, y)

    def _cases(self):
        checked = jax.tree_util.register_pytree_node
        try:
            checked(TestContainersThatRefuseJaxArrays._Node,
                    lambda n: ((n.x,), None), lambda _, c: TestContainersThatRefuseJaxArrays._Node(*c))
        except ValueError:   # registered by an earlier test
            pass
        return {"Mapping": ({"m": self.NdarraysOnly({"x": np.ones(2)})}, "['m']"),
                "NamedTuple subclass": ({"t": [self.CheckedPair(np.ones(2), 1)]}, "['t'][0]"),
                "registered pytree": ({"n": self._Node(np.ones(2))}, "['n']")}

    class _Node:
        def __init__(self, x):
            if not isinstance(x, np.ndarray):
                raise TypeError("x must be an ndarray")
            self.x = x

    @pytest.mark.parametrize("kind", ["Mapping", "NamedTuple subclass", "registered pytree"])
    @pytest.mark.parametrize("options", ["", "copy", "device"])
    def test_refused_before_any_take(self, kind, options):
        options = {"": {}, "copy": {"copy": True}, "device": {"device": jax.devices()[0]}}[options]
        batch, path = self._cases()[kind]
        cap = np.arange(3.0, dtype=np.float32).__dlpack__()
        batch = {"a": cap, **batch}
        with pytest.raises(ContainerError) as info:
            to_jax(batch, **options)
        assert path in str(info.value) and "nothing was converted" in str(info.value)
        assert capsule_name(cap) == "dltensor"
        with pytest.raises(ContainerError, match="nothing was converted"):   # as to_jax raises
            plan(batch)
        assert capsule_name(cap) == "dltensor"

    def test_a_container_that_takes_jax_arrays_is_rebuilt(self):
        out = to_jax({"m": UserDict({"x": np.ones(2, np.float32)})})
        assert type(out["m"]) is UserDict and isinstance(out["m"]["x"], jax.Array)
