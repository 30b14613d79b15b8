"""A batch is decided whole, then executed: a failure consumes nothing, whatever the order
of its leaves; containers keep every value they had; the producer's host copies are
checked against the header; a batch that cannot be walked is one clear error."""

from __future__ import annotations

import dataclasses
import gc
import types
from collections import UserDict

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import ContainerError, ProducerError, plan, prefetch_to_jax, to_host, to_jax  # noqa: E402
from dlinspect._core import capsule_name  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_array, make_capsule  # noqa: E402


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
    "too large": (lambda c: make_capsule(address=64, shape=(2**40, 2**10), dtype=np.float32,
                                         strides=(2**10 + 1, 1), null_deleter=True), {},
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
    assert routes["a"].kind == "zero-copy" and routes["b"].kind == "error"
    assert capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
    assert to_jax({"a": cap})["a"].tolist() == [1.0, 2.0]


def test_a_container_that_cannot_be_rebuilt_is_an_error_route_in_its_place():
    counter = DeleterCounter()
    batch = {"a": make_capsule(aligned_array([1.0]), counter=counter), "m": _needs_two(counter)}
    with pytest.raises(ContainerError, match=r"^\['m'\]: .*NeedsTwo.*nothing was converted"):
        to_jax(batch)
    routes = plan(batch)
    assert routes["a"].kind == "zero-copy"
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
