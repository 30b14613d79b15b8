"""With no device named, to_jax puts a tensor where ``jnp.asarray`` puts it: JAX's default
device, uncommitted. On an accelerator machine that is the TPU or GPU (scripts/tpu_check.sh);
here ``jax_default_device`` names the second of 4 CPU devices, which views host memory too."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dlinspect
from dlinspect import DLDeviceType as D
from dlinspect import DLInspectWarning
from dlinspect._core import jax_caps, set_target
from dlinspect.testing import DeleterCounter, make_capsule


def _rebuilt(device):
    """JAX's default device set to ``device``, and the target (which reads it) built anew."""
    jax.config.update("jax_default_device", device)
    vars(jax_caps()).pop("target", None)   # (the cached one: built again)
    set_target(None)
    assert dlinspect._core.jax_target().default_device == device


@pytest.fixture
def default():
    dev = jax.devices()[1]
    _rebuilt(dev)
    yield dev
    _rebuilt(None)


def _aligned(shape, dtype=np.float32):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(n + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + n].view(dtype).reshape(shape)
    out[...] = np.arange(out.size).reshape(shape) % 7
    return out


def _sources():
    base = _aligned((6, 8))
    ro = base.copy()
    ro.flags.writeable = False
    out = {"aligned": base, "read-only": ro, "misaligned": np.arange(49, dtype=np.float32)[1:],
           "sliced": base[::2, 1::3], "transposed": base.T, "float64": base.astype(np.float64),
           "bool": base > 2, "empty": np.zeros((0, 3), np.float32),
           "byte-swapped": base.astype(">f4")}
    try:
        import torch
    except ImportError:
        return out
    t = torch.arange(48.0).reshape(6, 8)
    out.update({"torch": t, "torch transposed": t.T})
    return out


def _same_values(a, ref):
    assert a.dtype == ref.dtype and a.shape == ref.shape
    np.testing.assert_array_equal(np.asarray(a + 0), np.asarray(ref + 0))
    assert float(a.astype(jnp.float32).sum()) == float(ref.astype(jnp.float32).sum())
    assert bool(jax.jit(lambda u, v: (u == v).all())(a, ref))


@pytest.mark.parametrize("name", list(_sources()))
def test_no_device_lands_where_jnp_asarray_puts_it(default, name):
    src = _sources()[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DLInspectWarning)
        route = dlinspect.plan(src)
        got = dlinspect.to_jax(src)
        host = np.asarray(src)
        ref = jnp.asarray(host.astype(host.dtype.newbyteorder("=")))   # (JAX takes no '>f4')
    assert got.devices() == ref.devices() == {default}, name
    assert route.jax_device == default, name
    assert got._committed is False and ref._committed is False, name
    _same_values(got, ref)
    moved = jax.device_put(got, jax.devices()[2])
    _same_values(moved, jax.device_put(ref, jax.devices()[2]))


def test_the_default_cpu_device_still_views_host_memory(default):
    src = _aligned((16, 16))
    route = dlinspect.plan(src)
    got = dlinspect.to_jax(src)
    assert route.zero_copy and got.unsafe_buffer_pointer() == src.ctypes.data


def test_a_named_device_wins_and_commits(default):
    cpu0 = jax.devices()[0]
    got = dlinspect.to_jax(_aligned((4, 4)), device=cpu0)
    assert got.devices() == {cpu0} and got._committed is True


def test_batches_and_loaders_land_there_too(default):
    batch = {"x": _aligned((4, 4)), "y": np.arange(4, dtype=np.int32), "t": _aligned((4, 4)).T}
    out = dlinspect.to_jax(batch)
    routes = dlinspect.plan(batch)
    for key, value in out.items():
        assert value.devices() == {default} and not value._committed, key
        assert routes[key].jax_device == default, key
        _same_values(value, jnp.asarray(np.asarray(batch[key])))
    for got in dlinspect.prefetch_to_jax([batch, batch]):
        assert all(v.devices() == {default} for v in got.values())


class _Accelerator:
    """A stand-in for a TPU or GPU device: the routes read its platform (no array lands on it)."""

    def __init__(self, platform):
        self.platform, self.id = platform, 0

    def __repr__(self):
        return f"{self.platform}:0"


@pytest.fixture
def rebuilt(monkeypatch):
    """Patch the target's inputs (``jax_caps()``'s attributes), then build it anew; undone after."""
    caps = jax_caps()
    caps.target   # (its devices read before they are patched)

    def patch(**attrs):
        for name, value in attrs.items():
            monkeypatch.setattr(caps, name, value)
        vars(caps).pop("target", None)
        set_target(None)
    yield patch
    monkeypatch.undo()
    _rebuilt(None)


def test_a_sharded_put_starts_where_the_memory_is(rebuilt):
    # A tensor no split takes (vector lanes) is put whole, then spread by the sharding: from
    # host memory, not first copied onto the default device (a TPU: there and back again).
    rebuilt(_default_device=lambda: _Accelerator("tpu"))
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    lanes = make_capsule(_aligned((16,)), shape=(4,), dtype=(2, 32, 4))
    route = dlinspect.plan(lanes, sharding=sharding)
    whole = route.facts["whole"]
    assert whole.jax_device == jax.devices()[0] and whole.zero_copy, whole
    assert route.copy_bytes == 64, route


def test_a_failed_put_onto_an_accelerator_consumes_nothing(rebuilt):
    rebuilt(_default_device=lambda: _Accelerator("tpu"))   # (jaxlib refuses to put onto it)
    counter = DeleterCounter()
    cap = make_capsule(_aligned((4, 4)), counter=counter)
    assert dlinspect.plan(cap).action == "host-view"
    with pytest.raises(TypeError):
        dlinspect.to_jax(cap)
    assert counter.calls == 0
    np.testing.assert_array_equal(dlinspect.to_host(cap), _aligned((4, 4)))


def test_pinned_memory_of_a_jax_device_is_imported_there(rebuilt):
    # Pinned host memory JAX has a device for (CUDA's) is imported there as it is, as the
    # fast path does: a put would copy it, which plan() would call zero-copy.
    gpu = _Accelerator("cuda")
    rebuilt(devices={**jax_caps().devices, (int(D.kDLCUDAHost), 0): gpu})
    for copy in (None, False):
        route = dlinspect.plan(make_capsule(_aligned((4,)), device=(D.kDLCUDAHost, 0)), copy=copy)
        assert (route.kind, route.action, route.jax_device) == ("zero-copy", "import", gpu), route


def test_grain_device_cpu_views_where_the_default_device_is_another(default):
    from dlinspect._core import check_options as options
    from dlinspect.grain import _ToJax
    from _helpers import Fresh
    cpu0, made = jax.devices()[0], []

    def batch(i):   # a fresh batch, as a loader hands it over (the pointer kept as a number)
        x = _aligned((8, 8))
        made.append(x.ctypes.data)
        return {"x": x}

    got = _ToJax(options(device=cpu0), dlinspect._core.jax_target(), False).next_of(iter(Fresh(batch, 1)))
    assert got["x"].devices() == {cpu0} and got["x"].unsafe_buffer_pointer() == made[0]


def test_plan_agrees_with_to_jax_on_the_default_device(default, monkeypatch):
    # tests/test_agreement.py's generated headers, each conversion also where jnp.asarray puts it
    import test_agreement as agreement
    check = agreement.check

    def check_there(make, reference, target, **options):
        route = check(make, reference, target, **options)
        if target == "jax" and route.kind != "error":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DLInspectWarning)
                got = dlinspect.to_jax(make(), **options)
            assert got.devices() == {default} and route.jax_device == default, route
            assert not got._committed, route
        return route
    monkeypatch.setattr(agreement, "check", check_there)
    monkeypatch.setattr(agreement, "EXAMPLES", min(agreement.EXAMPLES, 40))
    agreement.test_generated_headers("direct")


def test_a_loader_names_a_device_move_as_its_reason():
    """A copy no need explains is a move to another device (a jax.Array put on another
    device here; host memory put onto an accelerator), or a sharding's spread."""
    cpu0, cpu1 = jax.devices()[:2]
    with jax.default_device(cpu0):
        batch = {"x": jnp.arange(8.0)}
    loader = dlinspect.prefetch_to_jax([batch, batch], device=cpu1)
    assert [b["x"].devices() for b in loader] == [{cpu1}, {cpu1}]
    assert set(loader.report.as_dict()["['x']"]["copied_bytes"]) == {"device move"}
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    spread = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    loader = dlinspect.prefetch_to_jax([{"x": np.arange(33, dtype=np.float32)[1:].reshape(8, 4)[:, :3]}],
                                       sharding=spread)
    list(loader)
    copied = loader.report.as_dict()["['x']"]["copied_bytes"]
    assert copied and "device move" not in copied


def test_prefetch_decides_its_thread_for_where_the_batches_go(rebuilt):
    """thread=None weighs a worker thread only where batches go to an accelerator: a CPU
    default device (cpu:1) is a CPU; a stand-in TPU default is not."""
    from dlinspect import _prefetch
    from dlinspect._core import DEFAULT, check_options as options
    rebuilt(_default_device=lambda: jax.devices()[1])
    assert _prefetch._on_cpu(DEFAULT)
    rebuilt(_default_device=lambda: _Accelerator("tpu"))
    assert not _prefetch._on_cpu(DEFAULT) and _prefetch._on_cpu(options(jax.devices()[0]))
