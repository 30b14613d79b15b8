"""Zero-copy only where the batch owns its memory: every batch kept from a source that keeps
and rewrites what it hands over holds its own values, and batches whose memory nothing else
holds are still viewed, not copied.

A source below hands over a 64-byte aligned float32 batch (what XLA:CPU would view) built
from ``values(i)``, then writes the memory again for the next one; every kept batch is
checked by computation (``a + 0``, indexing, reductions, ``jax.jit``, a move) against the
values it had when it was handed over.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import gc
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax)")
jnp = jax.numpy

import dlinspect  # noqa: E402
from dlinspect import Need, plan, prefetch_to_jax, to_jax  # noqa: E402
from dlinspect.testing import aligned_empty  # noqa: E402
from _computations import assert_computes_like  # noqa: E402
from _helpers import Fresh, buffer_pointer  # noqa: E402

N = 4
SHAPE = (3, 4)


def values(i):
    return np.arange(12, dtype=np.float32).reshape(SHAPE) * 10 + i


def fresh(i):
    """New aligned memory holding ``values(i)``, held by nothing but the caller."""
    out = aligned_empty(SHAPE, np.float32, 64)
    out[...] = values(i)
    return out


def shares(result, source):
    """Whether a JAX array views ``source``'s memory."""
    return buffer_pointer(result) == dlinspect.peek(source).data_ptr


# ---- sources that keep what they hand over, and write it again ----------------------------

def refilled_in_place():
    buf = fresh(0)
    for i in range(N):
        buf[...] = values(i)
        yield {"x": buf}


def refilled_through_torch():
    torch = pytest.importorskip("torch")
    buf = fresh(0)
    for i in range(N):
        torch.from_numpy(buf).copy_(torch.from_numpy(values(i)))
        yield {"x": buf}


def refilled_through_a_memoryview():
    buf = fresh(0)
    for i in range(N):
        memoryview(buf).cast("B")[:] = values(i).tobytes()
        yield {"x": buf}


def refilled_through_a_raw_address():
    buf = fresh(0)
    for i in range(N):
        ctypes.memmove(buf.ctypes.data, values(i).ctypes.data, buf.nbytes)
        yield {"x": buf}


def torch_staging_through_numpy():
    torch = pytest.importorskip("torch")
    staging = torch.empty(SHAPE)
    for i in range(N):
        staging.numpy()[...] = values(i)
        yield {"x": staging}


def torch_staging_alone():
    """The staging tensor itself is the item (a loader's bare tensor follows the rule)."""
    torch = pytest.importorskip("torch")
    staging = torch.empty(SHAPE)
    for i in range(N):
        staging.copy_(torch.from_numpy(values(i)))
        yield staging


def ring_of_two():
    slots = [fresh(0), fresh(0)]
    for i in range(N):
        slots[i % 2][...] = values(i)
        yield {"x": slots[i % 2]}


def new_views_of_kept_memory():
    buf = fresh(0)
    for i in range(N):
        buf[...] = values(i)
        yield {"x": buf[...]}


def torch_from_numpy_of_kept_memory():
    torch = pytest.importorskip("torch")
    buf = fresh(0)
    for i in range(N):
        buf[...] = values(i)
        yield {"x": torch.from_numpy(buf)}


def detached_staging():
    torch = pytest.importorskip("torch")
    staging = torch.empty(SHAPE)
    for i in range(N):
        staging.copy_(torch.from_numpy(values(i)))
        yield {"x": staging.detach()}


def frombuffer_of_a_kept_bytearray():
    raw = bytearray(4 * 12 + 64)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % 64
    for i in range(N):
        x = np.frombuffer(raw, np.float32, 12, start).reshape(SHAPE)
        raw[start:start + 48] = values(i).tobytes()
        yield {"x": x}


class SameBatchObject:
    """One dict, kept by the source and refilled through it: the batch itself is held."""

    def __init__(self):
        self.batch = {"x": fresh(0)}

    def __iter__(self):
        for i in range(N):
            self.batch["x"][...] = values(i)
            yield self.batch


#: Sources of batches (a dict holding the leaf), and of bare tensors, that a loader's rule
#: covers alike; to_jax(tensor) itself follows DLPack's consumer contract (shares it).
BATCH_SOURCES = [refilled_in_place, refilled_through_torch, refilled_through_a_memoryview,
                 refilled_through_a_raw_address, torch_staging_through_numpy, ring_of_two,
                 new_views_of_kept_memory, torch_from_numpy_of_kept_memory, detached_staging,
                 frombuffer_of_a_kept_bytearray, SameBatchObject]
SOURCES = BATCH_SOURCES + [torch_staging_alone]


def leaf(batch):
    return batch if isinstance(batch, jax.Array) else batch["x"]


def check_kept(kept):
    assert len(kept) == N
    for i, batch in enumerate(kept):
        x = leaf(batch)
        assert_computes_like(x, values(i), f"batch {i}")
        assert float(jax.device_put(x, jax.devices()[0])[2, 3]) == values(i)[2, 3]


@pytest.mark.parametrize("source", BATCH_SOURCES, ids=lambda s: s.__name__)
def test_a_plain_loop_keeps_every_batch_right(source):
    kept = []
    for batch in source():
        kept.append(to_jax(batch))
    check_kept(kept)


def test_a_tensor_given_alone_shares_its_memory_as_from_dlpack_does():
    """DLPack's consumer contract: to_jax(x) views x where JAX can, whoever holds it, so a
    kept result shows the source's later writes (a batch of it would be copied)."""
    kept = []
    for staging in torch_staging_alone():
        assert plan(staging).kind == "zero-copy"
        out = to_jax(staging)
        assert shares(out, staging)
        kept.append(out)
    assert all(float(k[0, 0]) == values(N - 1)[0, 0] for k in kept)


@pytest.mark.parametrize("thread", [False, True, None])
@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.__name__)
def test_prefetch_keeps_every_batch_right(source, thread):
    loader = prefetch_to_jax(source(), thread=thread)
    check_kept(list(loader))
    reasons = {why for row in loader.report.as_dict().values() for why in row["copied_bytes"]}
    assert reasons == {"aliased"}, reasons


@pytest.mark.parametrize("source", BATCH_SOURCES, ids=lambda s: s.__name__)
def test_plan_says_copy_and_why(source):
    it = iter(source())          # (alive: a source dropped holds nothing any more)
    batch = next(it)
    route = plan(batch)["x"]
    assert route.kind == "copy" and route.needs & Need.ALIASED
    assert "not shown to own its memory" in route.reason and "np.stack" in route.reason
    assert "np.stack" in dlinspect.explain(batch)


def test_a_list_of_batches_is_a_source_that_keeps_them():
    batches = [{"x": fresh(i)} for i in range(N)]
    assert all(plan(b)["x"].kind == "copy" for b in batches)
    out = list(prefetch_to_jax(batches))
    for b, got in zip(batches, out):
        assert not shares(got["x"], b["x"])
    for i, b in enumerate(batches):
        b["x"][...] = -1                     # the list's owner writes its own batches
    check_kept(out)


def test_copy_false_shares_what_no_proof_covers():
    kept = [to_jax(batch, copy=False) for batch in refilled_in_place()]
    assert all(float(b["x"][0, 0]) == values(N - 1)[0, 0] for b in kept)   # later writes show
    route = plan({"x": fresh(0)}, copy=False)["x"]
    assert route.kind == "zero-copy" and not route.needs & Need.ALIASED


def test_copy_true_copies_every_leaf():
    x = fresh(0)
    out = to_jax({"x": x}, copy=True)
    assert not shares(out["x"], x)


# ---- batches that nothing else holds stay zero-copy -----------------------------------------

def test_temporaries_are_viewed():
    out = to_jax({"x": fresh(1), "y": [fresh(2), (fresh(3),)]})
    assert plan({"x": fresh(1)})["x"].kind == "zero-copy"
    assert_computes_like(out["y"][1][0], values(3))


def test_the_callers_own_variables_are_its_own():
    x = fresh(1)
    assert plan({"x": x})["x"].kind == "zero-copy"
    assert shares(to_jax({"x": x})["x"], x)
    batch = {"x": fresh(2)}
    assert plan(batch)["x"].kind == "zero-copy"

    def helper(b):           # the function that calls to_jax: its variables are its own
        return plan(b)["x"].kind, to_jax(b)

    kind, out = helper({"x": fresh(3)})
    assert kind == "zero-copy" and float(out["x"][0, 0]) == values(3)[0, 0]


def test_a_frame_further_up_is_not_the_callers():
    """Only the function calling to_jax owns its variables: one further up the stack may be a
    source that calls back with its one buffer, refilling it after each call, which looks
    like a helper's caller holding its batch. Both copy, so kept batches keep their values."""
    kept = []

    def source(callback):
        buf = fresh(0)
        for i in range(3):
            buf[...] = values(i)
            callback({"x": buf})

    source(lambda batch: kept.append(to_jax(batch)))
    assert [float(b["x"][0, 0]) for b in kept] == [values(i)[0, 0] for i in range(3)]
    batch = {"x": fresh(2)}

    def helper(b):
        return plan(b)["x"]

    route = helper(batch)
    assert route.kind == "copy" and route.needs & Need.ALIASED


def test_a_callers_variable_a_sources_closure_reads_is_not_its_own():
    """The calling function's loop variable is a cell it shares with a closure it gave the
    source (``source.peek = lambda: batch``, to log the last batch); the source reaches the
    last batch through it and writes it before the next. A cell another function holds is
    not the caller's alone: copied, and every kept batch keeps its values. A variable a
    comprehension read (its closure gone once it ends) is still the caller's own."""
    class Source:
        peek = None

        def __iter__(self):
            for i in range(N):
                last = self.peek()
                if last is not None:
                    last["x"][...] = -1
                last = None
                yield {"x": fresh(i)}

    source, kept, batch = Source(), [], None
    source.peek = lambda: batch
    for batch in source:
        kept.append(to_jax(batch))
    check_kept(kept)

    def loop_whose_variable_a_comprehension_reads():
        shared = []
        for b in (({"x": fresh(i)}) for i in range(2)):
            names = [k for k in b if b[k] is not None]
            shared.append(shares(to_jax(b)[names[0]], b["x"]))
        return shared
    assert loop_whose_variable_a_comprehension_reads() == [True, True]


def test_an_enclosing_functions_variable_is_not_the_closures():
    """A closure that calls to_jax reads the buffer through a free variable its enclosing
    function shares, and that function (a source) refills it: copied, and a cell is never
    counted once per frame that sees it."""
    ring = []

    def source():
        buf = fresh(0)
        ring.append(buf)

        def emit():
            return plan({"x": buf})["x"].kind, to_jax({"x": buf})
        return emit()

    kind, out = source()
    ring[0][...] = values(7)
    assert kind == "copy" and float(jnp.sum(out["x"] + 0)) == float(values(0).sum())


def test_a_loop_that_unpacks_each_batch(torch):
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.randn(64, 3, 8, 8), torch.arange(64, dtype=torch.int32))
    kinds = []
    for x, y in DataLoader(data, batch_size=16):
        kinds.append(plan((x, y))[0].kind)
        out = to_jax((x, y))
        assert buffer_pointer(out[0]) == x.data_ptr() and buffer_pointer(out[1]) == y.data_ptr()
    assert kinds == ["zero-copy"] * 4


def test_a_loop_at_a_modules_top_level(torch):
    """The same loop at a module's top level: its variables are the module's globals."""
    code = ("import torch, dlinspect\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "data = TensorDataset(torch.randn(32, 5), torch.arange(32, dtype=torch.int32))\n"
            "shared = []\n"
            "for x, y in DataLoader(data, batch_size=8):\n"
            "    out = dlinspect.to_jax((x, y))\n"
            "    shared.append(out[0].unsafe_buffer_pointer() == x.data_ptr())\n")
    namespace: dict = {"__name__": "__batches__"}
    exec(compile(code, "<a script>", "exec"), namespace)
    assert namespace["shared"] == [True] * 4


def test_options_passed_as_keywords_and_unpacked():
    batch = {"x": fresh(1)}
    options = {"narrow": "ok"}
    assert plan(batch, narrow="ok")["x"].kind == "zero-copy"
    assert (lambda b: plan(b, narrow="ok"))({"x": fresh(1)})["x"].kind == "zero-copy"
    # f(*a, **kw) holds the batch in a tuple that may be the source's own (*source.args),
    # and an empty **kw adds no reference: uncounted, so a copy
    assert plan(batch, **options)["x"].kind == "copy"
    assert plan(*[batch])["x"].kind == "copy"
    # functools.partial with keywords holds the batch once more, in an array of its own:
    # uncounted, so a copy (a lambda or a def holds it in a variable, which is counted).
    assert functools.partial(plan, narrow="ok")({"x": fresh(1)})["x"].kind == "copy"


def test_a_sources_argument_tuple_unpacked_into_the_call_is_copied():
    """``to_jax(*source.args)`` passes the source's own tuple, not a fresh one, and an empty
    ``**kw`` makes no array: neither is taken for the call's own reference."""
    class Source:
        def __init__(self):
            self.args = ({"x": fresh(0)},)

    source, no_options = Source(), {}
    out = to_jax(*source.args)
    ring = [{"x": fresh(0)}]
    out2 = to_jax(*ring[-1:], **no_options)
    source.args[0]["x"][...] = values(5)
    ring[0]["x"][...] = values(5)
    assert float(out["x"][0, 0]) == float(out2["x"][0, 0]) == values(0)[0, 0]


def test_shared_memory_this_process_shares_or_maps_is_copied(torch, tmp_path):
    """Shared memory is proven only where torch received it from another process (a
    DataLoader worker's batch, which the worker let go of). Memory this process shares
    (``share_memory_()``, which a fork's children write) or maps from a file (``from_file``,
    which another mapping of the file writes) is copied."""
    path = tmp_path / "values.bin"
    path.write_bytes(bytes(4 * 64))
    mapped = torch.from_file(str(path), shared=True, size=64)
    other = torch.from_file(str(path), shared=True, size=64)
    out = to_jax({"x": mapped})
    other.fill_(5.0)
    assert float(jnp.sum(out["x"] + 0)) == 0.0
    route = plan({"x": torch.zeros(64).share_memory_()})["x"]
    assert route.kind == "copy" and route.needs & Need.ALIASED


def test_shared_memory_this_process_made_stays_copied_once_sent(torch):
    """Sending a tensor on a torch.multiprocessing queue records its storage in the cache
    that received storages are kept in; memory this process shared (``share_memory_()``)
    is still copied after it was sent: the process it went to writes it."""
    from torch.multiprocessing.reductions import reduce_storage
    t = torch.zeros(64).share_memory_()
    reduce_storage(t.untyped_storage())   # what a queue's put does with it
    route = plan({"x": t})["x"]
    assert route.kind == "copy" and route.needs & Need.ALIASED


def test_a_weak_reference_a_source_keeps_is_a_holder():
    """A pool that keeps a ``weakref.ref`` to each array it hands out reaches it again while
    a JAX array views it: a weak reference counts as a holder (copied)."""
    import weakref
    refs = []

    def handed_out():
        a = fresh(0)
        refs.append(weakref.ref(a))
        return a

    x = handed_out()
    route = plan({"x": x})["x"]
    out = to_jax({"x": x})
    del x
    kept = refs[0]()
    if kept is not None:   # (alive only where JAX views it)
        kept[...] = values(7)
    assert route.kind == "copy" and float(jnp.sum(out["x"] + 0)) == float(values(0).sum())


class _Batch(dict):
    """A batch type of a loader's own: unlike a plain dict, weak references reach it."""


def _fill_torch(t, i):
    t.view(-1)[:12].copy_(_torch().from_numpy(values(i).ravel()))


def _torch():
    return pytest.importorskip("torch")


# what a pool keeps a weak reference to -> (make it, the batch handed over, refill it)
WEAKLY_HELD = {
    "a torch tensor": (lambda: _torch().empty(SHAPE), lambda t: {"x": t}, _fill_torch),
    "the base of a torch view": (lambda: _torch().empty(24), lambda t: {"x": t[:12].view(SHAPE)},
                                 _fill_torch),
    "a batch of torch tensors": (lambda: _Batch(x=_torch().empty(SHAPE)), lambda b: b,
                                 lambda b, i: _fill_torch(b["x"], i)),
    "a batch of NumPy arrays": (lambda: _Batch(x=fresh(0)), lambda b: b,
                                lambda b, i: b["x"].__setitem__(Ellipsis, values(i))),
}


def weakly_held_pool(make, wrap, fill, keep_weakly):
    """A pool that hands each batch over as its only holder; ``keep_weakly``: it keeps a
    weak reference to what it made and, while the caller still holds the last batch (its
    loop variable), gets it back and refills it for the next."""
    import weakref
    ref = None
    for i in range(N):
        held = ref() if ref is not None else None
        if held is None:
            held = make()
        fill(held, i)
        if keep_weakly:
            ref = weakref.ref(held)
        batch = [wrap(held)]
        del held
        yield batch.pop()   # (the generator holds nothing but the weak reference)


@pytest.mark.parametrize("what", list(WEAKLY_HELD))
@pytest.mark.parametrize("keep_weakly", [False, True], ids=["not kept", "kept weakly"])
def test_a_weak_reference_to_a_tensor_its_base_or_its_batch_is_a_holder(what, keep_weakly):
    """A weak reference to a torch tensor, to the tensor a torch view is of, or to the batch
    itself (a dict subclass) reaches the memory again while JAX views it, as one to a NumPy
    array does: copied, and every kept batch keeps its values. Without it, each is viewed."""
    kinds, kept = [], []
    for b in weakly_held_pool(*WEAKLY_HELD[what], keep_weakly):
        kinds.append(plan(b)["x"].kind)
        kept.append(to_jax(b))
    # (torch 2.3's tensors do not say their use count: no view is proven there)
    provable = what != "the base of a torch view" or hasattr(_torch().Tensor, "_use_count")
    assert kinds == ["zero-copy" if provable and not keep_weakly else "copy"] * N
    for i, out in enumerate(kept):
        assert_computes_like(out["x"], values(i), f"batch {i}")


@pytest.mark.slow
def test_a_torch_mode_active_at_the_first_proof_changes_no_count(torch):
    """torch's counts are measured once per process, at the first proof of a torch leaf;
    a TorchFunctionMode active then, one that keeps the tensors it sees, must not skew them
    (a view whose base a source keeps would then pass as the view's alone)."""
    code = (
        "import torch, dlinspect\n"
        "from torch.overrides import TorchFunctionMode\n"
        "class Keeping(TorchFunctionMode):\n"
        "    seen = []\n"
        "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
        "        self.seen.append(args)\n"
        "        return func(*args, **(kwargs or {}))\n"
        "with Keeping():\n"
        "    dlinspect.plan({'x': torch.ones(4)})\n"
        "kept = torch.ones(4)\n"
        "print(dlinspect.plan({'x': kept[:2]})['x'].kind, dlinspect.plan({'x': torch.ones(4)})['x'].kind)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["copy", "zero-copy"]


def test_torch_default_collate_with_workers_and_pinned_memory(torch):
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.randn(32, 3, 4, 4), torch.arange(32, dtype=torch.int32))
    for loader in (DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context="spawn"),
                   DataLoader(data, batch_size=8, pin_memory=True)):
        pairs = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # (pin_memory with no accelerator)
            for x, y in loader:
                out = to_jax((x, y))
                pairs.append((x, out))
        assert all(buffer_pointer(out[0]) == x.data_ptr() for x, out in pairs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            jax_loader = prefetch_to_jax(loader)
            list(jax_loader)
        assert all(not row["copied_bytes"] for row in jax_loader.report.as_dict().values())


def test_stack_in_a_generator_stays_zero_copy():
    def batches():
        for i in range(N):
            yield dlinspect.stack([{"x": values(i)[j]} for j in range(3)])
    loader = prefetch_to_jax(batches())
    out = list(loader)
    assert loader.report.as_dict()["['x']"]["copied_bytes"] == {}
    for i, b in enumerate(out):
        assert_computes_like(b["x"], values(i)[:3])


def test_a_generator_that_converts_its_own_buffer_shares_it():
    """The calling code's own variables are the caller's, a generator's that calls too (its
    second batch is copied: the first one's array still views the buffer)."""
    def converted():
        buf = fresh(0)
        for i in range(2):
            buf[...] = values(i)
            yield to_jax({"x": buf}), buf

    (first, buf), (second, _) = converted()
    assert shares(first["x"], buf) and not shares(second["x"], buf)


# ---- the proof's pieces ----------------------------------------------------------------------

def test_numpy_base_chains():
    # a view of an owner nothing else holds, and two views of one, all in the batch
    assert plan({"x": aligned_empty((2, 16), np.float32, 64)[0]})["x"].kind == "zero-copy"
    both = plan(dict(zip("ab", aligned_empty((2, 16), np.float32, 64))))
    assert [r.kind for r in both.values()] == ["zero-copy", "zero-copy"]
    # the owner in the caller's own variable: its own; in a list: someone else's
    owner = np.ones(16, np.float32)
    assert not plan({"x": owner[2:]})["x"].needs & Need.ALIASED
    held = [np.ones(16, np.float32)]
    assert plan({"x": held[0][2:]})["x"].needs & Need.ALIASED
    # memory that is no array's own: bytes, a bytearray, a memoryview
    assert plan({"x": np.frombuffer(bytearray(64), np.float32)})["x"].kind == "copy"
    assert plan({"x": np.asarray(memoryview(fresh(0)))})["x"].kind == "copy"


def test_torch_storages(torch):
    assert plan({"t": torch.ones(4)})["t"].kind == "zero-copy"
    view_of_private_base = plan({"t": torch.arange(8.0).reshape(2, 4)})["t"].kind
    if hasattr(torch.Tensor, "_use_count"):
        assert view_of_private_base == "zero-copy"
    else:   # (torch 2.3's tensors do not say their use count: no view is proven)
        assert view_of_private_base == "copy"
    base = torch.arange(8.0)
    assert plan({"t": base.reshape(2, 4)})["t"].kind == "copy"
    assert plan({"t": base.detach()})["t"].kind == "copy"
    assert plan({"t": torch.from_numpy(fresh(0))})["t"].kind == "copy"    # borrowed memory
    # t.numpy() marks the storage as NumPy's too (torch stops resizing it): no proof left
    assert plan({"t": torch.ones(4).numpy()})["t"].kind == "copy"


@dataclasses.dataclass
class Sample:
    image: object
    label: object


class Encoding(collections.UserDict):
    pass


def test_containers_whose_slots_are_counted(torch):
    Pair = collections.namedtuple("Pair", "left right")
    batch = {"enc": Encoding({"ids": torch.ones(4)}), "s": Sample(fresh(1), fresh(2)),
             "ns": types.SimpleNamespace(z=fresh(3)), "pair": Pair(fresh(4), "r"),
             "sub": collections.OrderedDict(w=fresh(5))}
    routes = plan(batch)
    kinds = [routes["enc"]["ids"].kind, routes["s"].image.kind, routes["s"].label.kind,
             routes["ns"].z.kind, routes["pair"].left.kind, routes["sub"]["w"].kind]
    assert kinds == ["zero-copy"] * 6, kinds
    kept = {"x": fresh(0)}
    held = {"inner": kept}                  # an inner container the caller holds
    assert plan(held)["inner"]["x"].kind == "zero-copy"
    source = types.SimpleNamespace(inner={"x": fresh(0)})   # one a source holds
    assert plan({"outer": source.inner})["outer"]["x"].kind == "copy"


def _field(batch):
    """The tensor field of a SimpleNamespace, a Sample or an Encoding made in the test below."""
    if isinstance(batch, collections.UserDict):
        return batch["x"]
    return batch.x if hasattr(batch, "x") else batch.image


def test_an_objects_dict_a_source_keeps_is_a_holder():
    """A source that keeps the __dict__ of the dataclass, namespace or UserDict it hands over
    (vars(b), for logging) writes its leaves through it: they are copied, and kept batches
    stay right."""
    for make in (lambda x: types.SimpleNamespace(x=x), lambda x: Sample(x, "label"),
                 lambda x: Encoding(x=x)):
        kept = []
        batch = make(fresh(1))
        kept.append(vars(batch))
        routes = plan(batch)
        assert _field(routes).kind == "copy"
        fresh_batch = make(fresh(1))   # nothing keeps this one's __dict__: viewed
        assert _field(plan(fresh_batch)).kind == "zero-copy"
        assert_computes_like(_field(to_jax(fresh_batch)), values(1))
    fields = {}

    def source():
        b = Sample(fresh(2), "label")
        fields.update(vars(b))   # (a copy of the dict: the leaf itself is a second holder)
        return b
    assert plan(source()).image.kind == "copy"


class _Leased(dict):
    """A batch that hands its buffer back to the source's pool as it dies."""

    pool: list = []

    def __del__(self):
        if isinstance(self["x"], np.ndarray):   # (to_jax's result is a _Leased too)
            _Leased.pool.append(self["x"])


def test_a_container_or_tensor_that_runs_code_as_it_dies_proves_nothing(torch):
    """A __del__ may give the memory back to a source, which refills it while a JAX array
    still views it: neither the container's leaves nor a tensor with a finalizer is viewed."""
    kept = []
    for i in range(3):
        buf = _Leased.pool.pop() if _Leased.pool else fresh(0)
        buf[...] = values(i)
        kept.append(to_jax(_Leased(x=buf))["x"])
        del buf
    for i, out in enumerate(kept):
        assert_computes_like(out, values(i))

    class Pooled(torch.Tensor):
        def __del__(self):
            pass
    assert plan({"t": torch.ones(4).as_subclass(Pooled)})["t"].kind == "copy"
    assert plan({"t": torch.ones(4)})["t"].kind == "zero-copy"


def test_a_class_body_or_execs_own_namespace_is_not_the_callers():
    """At a module's top level the variables are the caller's own; a class body's names become
    the class's attributes, and exec's own locals dict is whoever passed it: copied."""
    scope = {"dlinspect": dlinspect, "fresh": fresh}
    exec("class Staging:\n    buf = fresh(0)\n    kind = dlinspect.plan({'x': buf})['x'].kind\n",
         scope)
    assert scope["Staging"].kind == "copy"
    names = {"buf": fresh(0)}
    exec("kind = dlinspect.plan({'x': buf})['x'].kind", scope, names)
    assert names["kind"] == "copy"
    exec("buf = fresh(0)\nkind = dlinspect.plan({'x': buf})['x'].kind", scope)
    assert scope["kind"] == "zero-copy"


def test_dlinspect_changes_no_flag():
    writable, frozen = fresh(0), fresh(1)
    frozen.flags.writeable = False
    for batch in ({"a": writable, "b": frozen}, {"a": writable[...], "b": frozen[...]}):
        out = to_jax(batch, readonly="share")
        assert writable.flags.writeable and not frozen.flags.writeable
        del out
        gc.collect()
        assert writable.flags.writeable and not frozen.flags.writeable
    for _ in prefetch_to_jax(Fresh(lambda i: {"a": writable}, 2)):
        writable[0, 0] = 5                  # the user's own write in the loop body
    assert writable.flags.writeable


def test_a_tensor_given_alone_shares_its_memory():
    source = refilled_in_place()
    batch = next(source)
    x = batch["x"]
    assert plan(x).kind == "zero-copy" and shares(to_jax(x), x)


def test_plan_of_a_tensor_alone_says_it_is_shared_and_a_batch_leaf_does_not():
    """The one behaviour for a tensor given alone, said where a user reads the route: the
    result shares its memory, later writes show, copy=True copies it."""
    x = aligned_empty(SHAPE, np.float32, 64)
    alone = plan(x)
    assert alone.kind == "zero-copy"
    assert "A tensor given alone shares its memory" in alone.reason
    assert "copy=True copies it" in alone.reason
    assert "shares its memory" in dlinspect.explain(x)
    assert "given alone" not in plan({"x": x})["x"].reason      # a batch's leaf: the rule
    assert "given alone" not in plan(x, copy=True).reason       # a copy shares nothing


def test_a_failed_proof_consumes_nothing():
    from dlinspect.testing import DeleterCounter, make_capsule
    counter = DeleterCounter()
    cap = make_capsule(fresh(0), counter=counter)
    route = plan({"c": cap})["c"]
    assert route.kind == "copy" and route.needs & Need.ALIASED   # a bare capsule proves nothing
    assert dlinspect._core.capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
    out = to_jax({"c": cap})
    assert_computes_like(out["c"], values(0))
    del cap, out
    gc.collect()
    assert counter.calls == 1


@pytest.mark.slow
def test_kept_batches_moved_to_another_device_stay_right():
    """A two-slot ring, each batch moved with jax.device_put to another CPU device: every
    kept batch holds its own values (a view would have kept aliasing the slot)."""
    code = (
        "import sys; sys.path.insert(0, 'tests'); import jax, test_ownership as t\n"
        "kept = [jax.device_put(t.to_jax(b)['x'], jax.devices()[1]) for b in t.ring_of_two()]\n"
        "print(([float(k[2, 3]) for k in kept], [float(t.values(i)[2, 3]) for i in range(t.N)]))\n")
    env = {**__import__("os").environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = eval(proc.stdout.strip().splitlines()[-1])
    assert got == want


def test_read_only_memory_a_source_keeps_is_shared_where_the_caller_says_nothing_writes_it():
    """readonly="share" vouches for read-only memory (Arrow's, a memory-mapped file's): a
    read-only leaf a source still holds is imported zero-copy with it, copied without it;
    a writable leaf the source holds is copied either way."""
    source = types.SimpleNamespace(frozen=fresh(3), writable=fresh(4))
    source.frozen.flags.writeable = False
    assert plan({"x": source.frozen})["x"].kind == "copy"
    assert plan({"x": source.writable}, readonly="share")["x"].kind == "copy"
    assert plan({"x": source.frozen}, readonly="share")["x"].kind == "zero-copy"
    out = to_jax({"x": source.frozen}, readonly="share")["x"]
    assert buffer_pointer(out) == source.frozen.ctypes.data
    assert_computes_like(out, source.frozen)
    assert not source.frozen.flags.writeable


def _exporting(base, staging):
    """A subclass of ``base`` whose ``__dlpack__`` hands over ``staging``'s memory, not its own
    (a wrapper tensor that exports what it wraps)."""
    return type("Exporting", (base,), {
        "__dlpack__": lambda self, *args, **kwargs: staging.__dlpack__(*args, **kwargs)})


def _answering(staging):
    """A torch subclass that keeps ``__dlpack__`` but answers it, in ``__torch_function__``
    (which torch's own ``__dlpack__`` calls first), with ``staging``'s memory."""
    torch = _torch()

    def torch_function(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__dlpack__:
            return staging.__dlpack__(*args[1:], **(kwargs or {}))
        return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs)
    return type("Answering", (torch.Tensor,), {"__torch_function__": classmethod(torch_function)})


def _subclass_cases(kind):
    """(make the i-th leaf, the source's staging memory) for a NumPy or torch subclass."""
    if kind == "numpy":
        staging = fresh(0)
        cls = _exporting(np.ndarray, staging)
        return (lambda i: (staging.__setitem__(Ellipsis, values(i)), fresh(0).view(cls))[1],
                staging)
    torch = _torch()
    staging = torch.empty(SHAPE)
    cls = _exporting(torch.Tensor, staging) if kind == "torch" else _answering(staging)

    def make(i):
        _fill_torch(staging, i)
        return torch.Tensor._make_subclass(cls, torch.empty(SHAPE))
    return make, staging


@pytest.mark.parametrize("kind", ["numpy", "torch", "torch_function"])
def test_a_subclass_that_exports_other_memory_proves_nothing(kind):
    """A subclass whose ``__dlpack__`` hands over a source's staging memory, not its own (or,
    for torch, whose ``__torch_function__`` answers torch's ``__dlpack__`` with it): the
    proof reads the leaf's own memory (new here), the export is another's, refilled for each
    batch. Copied, and every kept batch keeps its values."""
    make, staging = _subclass_cases(kind)
    kinds, kept = [], []
    for i in range(N):
        b = {"x": make(i)}
        kinds.append(plan(b)["x"].kind)
        kept.append(to_jax(b))
    assert kinds == ["copy"] * N
    for i, out in enumerate(kept):
        assert_computes_like(out["x"], values(i), f"batch {i}")


def test_a_subclass_that_overrides_nothing_is_still_viewed(torch):
    """A plain subclass (``nn.Parameter``, a subclass that adds methods) exports its own memory:
    proven as its base class is."""
    plain = type("Plain", (torch.Tensor,), {"describe": lambda self: "plain"})
    makers = [lambda: torch.nn.Parameter(torch.ones(SHAPE), requires_grad=False),
              lambda: torch.Tensor._make_subclass(plain, torch.ones(SHAPE)),
              lambda: fresh(1).view(type("PlainArray", (np.ndarray,), {}))]
    for make in makers:
        b = {"x": make()}
        assert plan(b)["x"].kind == "zero-copy", type(b["x"])


def _storage_ring(keep):
    """A pool of two torch storages, kept as ``keep`` says ("storage": the objects,
    "weakly": weak references to them), each batch a new tensor made over the next one
    (``set_``) and refilled: what an arena or slab allocator hands out."""
    import weakref
    torch = _torch()
    made = [torch.UntypedStorage(4 * 12) for _ in range(2)]
    ring = made if keep == "storage" else [weakref.ref(s) for s in made]
    for i in range(N):
        slot = ring[i % 2] if keep == "storage" else ring[i % 2]()
        x = torch.empty(0).set_(slot, 0, SHAPE)
        _fill_torch(x, i)
        batch = [{"x": x}]
        del slot, x
        yield batch.pop()   # (the generator holds nothing but the pool)


def _storage_kept(keep):
    """Each batch new torch memory; the pool keeps its storage object (``t.untyped_storage()``,
    strongly or weakly) and writes every storage it kept again before the next batch."""
    import weakref
    torch = _torch()
    kept = []
    for i in range(N):
        for old in [k if keep == "storage" else k() for k in kept]:
            if old is not None:
                torch.empty(0).set_(old).fill_(-1.0)
        old = None
        x = torch.empty(SHAPE)
        _fill_torch(x, i)
        storage = x.untyped_storage()
        kept.append(storage if keep == "storage" else weakref.ref(storage))
        batch = [{"x": x}]
        del storage, x
        yield batch.pop()   # (the generator holds nothing but the pool)


@pytest.mark.parametrize("source", [_storage_ring, _storage_kept], ids=["ring", "kept"])
@pytest.mark.parametrize("keep", ["storage", "weakly"])
def test_a_torch_storage_object_a_source_keeps_is_a_holder(source, keep):
    """torch keeps one Python object per storage, and whoever holds it (strongly or weakly)
    reaches the memory again, with no count of the storage showing it: copied, and every kept
    batch keeps its values."""
    kinds, kept = [], []
    for b in source(keep):
        kinds.append(plan(b)["x"].kind)
        kept.append(to_jax(b))
    assert kinds == ["copy"] * N
    for i, out in enumerate(kept):
        assert_computes_like(out["x"], values(i), f"batch {i}")
