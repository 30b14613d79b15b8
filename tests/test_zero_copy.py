"""to_jax without a copy: host memory JAX can view as it is (aligned NumPy arrays, torch
tensors, bare capsules), the device argument, and where the arrays land: uncommitted, as
jnp.asarray's, with no device asked for; committed to the device asked for; on every route.
"""

from __future__ import annotations

import gc
import os
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")

from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import DLInspectWarning, Need, plan, to_jax  # noqa: E402
from dlinspect._core import capsule_name  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_empty, make_capsule  # noqa: E402
from _helpers import aligned, buffer_pointer, read_only, target  # noqa: E402
from _computations import assert_computes_like  # noqa: E402


class TestZeroCopy:
    def test_aligned_numpy(self, import_path):
        x = aligned(np.arange(12).reshape(3, 4))
        route = plan(x)
        assert route.kind == "zero-copy" and route.zero_copy and route.copy_bytes == 0
        assert route.needs == 0
        y = to_jax(x)
        assert isinstance(y, jax.Array) and buffer_pointer(y) == x.ctypes.data
        np.testing.assert_array_equal(np.asarray(y), x)

    def test_default_options_by_value_take_the_checked_way_to_the_same_route(self):
        """The front door compares the defaults by identity; options equal to them but
        other objects (a string built at run time) are checked, with the same result,
        and a wrong one is refused before anything is exported."""
        x = aligned(np.arange(12).reshape(3, 4))
        host = "".join(["ho", "st"])
        y = to_jax(x, fallback=host, readonly="".join(["co", "py"]), narrow=str("warn"))
        assert buffer_pointer(y) == x.ctypes.data
        with pytest.raises(ValueError, match="fallback must be 'host' or 'raise'"):
            to_jax(x, fallback="hosts")
        with pytest.raises(ValueError, match="copy must be None, True or False"):
            to_jax(x, copy=0)

    def test_torch_tensor(self, torch, import_path):
        t = torch.arange(12.0).reshape(3, 4)
        y = to_jax(t)
        assert buffer_pointer(y) == t.data_ptr()
        np.testing.assert_array_equal(np.asarray(y), t.numpy())

    def test_bare_capsule(self, import_path):
        """A bare capsule (``np.arange(3.0).__dlpack__()``), which jax.dlpack.from_dlpack
        rejects for having no ``__dlpack__`` and ``__dlpack_device__``, is imported."""
        x = aligned(np.arange(3.0, dtype=np.float32))
        cap = x.__dlpack__()
        y = to_jax(cap)
        np.testing.assert_array_equal(np.asarray(y), [0, 1, 2])
        assert capsule_name(cap) == "used_dltensor"

    def test_bare_versioned_capsule_through_adapter(self, import_path):
        counter = DeleterCounter()
        x = aligned([1, 2, 3])
        cap = make_capsule(x, counter=counter)
        y = to_jax(cap)
        assert capsule_name(cap) == "used_dltensor_versioned" and counter.calls == 0
        assert buffer_pointer(y) == x.ctypes.data
        del y
        gc.collect()
        assert counter.calls == 1

    def test_device_argument(self):
        dev = jax.devices("cpu")[0]
        x = aligned([1, 2])
        assert to_jax(x, device=dev).devices() == {dev}
        sharding = jax.sharding.SingleDeviceSharding(dev)
        assert to_jax(x, device=sharding).devices() == {dev}


class TestArraysLikeJaxOwn:
    """With no device asked for, to_jax gives what jnp.asarray gives: an uncommitted array
    on the memory's own device, so a jitted function fed both compiles once; with a device
    (or a sharding), a committed one, as jax.device_put(x, device) gives. Every route."""

    @staticmethod
    def _sources(torch):
        x = aligned(np.arange(12.0).reshape(3, 4))
        misaligned = aligned_empty((3, 4), np.float32, 64, offset=16)
        misaligned[...] = x
        return {
            "numpy": x,                                        # put, the array itself
            "torch": torch.arange(12.0).reshape(3, 4),         # put, a view of the capsule
            "bare capsule": make_capsule(x),
            "torch transposed": torch.arange(12.0).reshape(4, 3).t(),   # import (or copy)
            "misaligned": misaligned,                          # a copy in C
            "strided": aligned(np.arange(24.0).reshape(3, 8))[:, ::2],
            "read-only": read_only(aligned(np.arange(12.0).reshape(3, 4))),
            "float64, x64 off": np.arange(12.0).reshape(3, 4),  # narrowed in the copy
            "foreign device": FakeProducer(np.arange(12.0, dtype=np.float32).reshape(3, 4),
                                           (D.kDLVulkan, 0)),  # host fallback
            "empty": np.zeros((0, 4), np.float32),
            "big-endian": np.arange(12.0, dtype=">f4").reshape(3, 4),   # NumPy's own copy
        }

    def test_no_device_is_uncommitted_and_compiles_once(self, torch):
        if not target().direct:
            pytest.skip("the public API is forced: arrays of from_dlpack stay committed")
        for name, src in self._sources(torch).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DLInspectWarning)
                y = to_jax(src)
            mine = jax.numpy.asarray(np.asarray(y))
            assert y.devices() == mine.devices() and y.aval == mine.aval, name
            assert y._committed is False and mine._committed is False, name
            step = jax.jit(lambda a: a * 2)
            step(y)
            step(mine)
            assert step._cache_size() == 1, name

    def test_a_device_commits(self, torch):
        dev = jax.devices("cpu")[0]
        for name, src in self._sources(torch).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DLInspectWarning)
                y = to_jax(src, device=dev)
            assert y._committed is True and y.devices() == {dev}, name

    def test_a_batch(self, torch):
        if not target().direct:
            pytest.skip("the public API is forced: arrays of from_dlpack stay committed")
        batch = {"x": torch.ones(4, 3), "y": aligned(np.arange(4), np.int32),
                 "t": torch.arange(12.0).reshape(3, 4).t()}
        out, routes = to_jax(batch), plan(batch)
        # uncommitted, as jnp.asarray's; a permuted order copied into row-major order
        assert not any(a._committed for a in out.values())
        assert routes["t"].kind == "copy" and routes["t"].needs & (Need.PERMUTED | Need.LAYOUT)
        assert_computes_like(out["t"], batch["t"].numpy())
        dev = jax.devices("cpu")[0]
        assert all(a._committed is True for a in to_jax(batch, device=dev).values())


_UNDER_A_TRANSFER_GUARD = """
import sys, jax, numpy as np, dlinspect
from dlinspect.testing import aligned_empty, make_capsule
x = aligned_empty((2, 3), np.float32, 64)
x[...] = np.arange(6).reshape(2, 3)
with jax.transfer_guard(sys.argv[1]):
    out = [dlinspect.to_jax(x), dlinspect.to_jax(x.T), dlinspect.to_jax(make_capsule(x)),
           dlinspect.to_jax({"a": x, "b": x[0]}), dlinspect.to_jax(x, copy=True),
           next(iter(dlinspect.prefetch_to_jax(iter([{"a": x}]))))["a"],
           dlinspect.to_jax(make_capsule(np.zeros(0, np.float32))),
           dlinspect.to_jax({"e": make_capsule(np.zeros(0, np.int64))}, narrow="ok")]
print(*[int(a.sum()) for a in jax.tree.leaves(out)], dlinspect._core.jax_target().permuted_ok)
"""


def test_a_put_a_transfer_guard_refuses_consumes_no_capsule():
    """Under a guard that refuses explicit transfers too, to_jax fails and an empty capsule,
    alone or in a batch, is left as it was (taken only once its put is made)."""
    for batch in (False, True):
        counter = DeleterCounter()
        cap = make_capsule(np.zeros(0, np.float32), counter=counter)
        with jax.transfer_guard("disallow_explicit"), pytest.raises(Exception, match="Disallowed"):
            to_jax({"e": cap} if batch else cap)
        assert capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
        assert to_jax(cap).shape == (0,) and counter.calls == 1


@pytest.mark.parametrize("guard, refused", [("disallow", False), ("disallow_explicit", True)])
def test_to_jax_is_an_explicit_transfer_under_a_transfer_guard(guard, refused):
    """jax.transfer_guard("disallow") refuses implicit transfers only: to_jax, an explicit
    conversion as jax.device_put is, converts under it (a lone array, a transpose, a capsule,
    a batch, a copy, a loader's batch, empty capsules: each put once, nothing consumed
    twice), from the first call of a process on, whose probes
    still find what this JAX can do (a permuted order kept). A guard that refuses explicit
    transfers too refuses to_jax, as it refuses jax.device_put."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _UNDER_A_TRANSFER_GUARD, guard],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if refused:
        assert proc.returncode != 0 and "Disallowed host-to-device transfer" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["15", "15", "15", "15", "3", "15", "15", "0", "0",
                                   str(target().permuted_ok)]
