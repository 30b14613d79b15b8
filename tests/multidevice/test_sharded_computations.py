"""Right values by computation over 4 forced CPU devices: ``to_jax(x, sharding=...)`` of
every drawn view computes as ``jnp.asarray(np.asarray(x))`` does (tests/_computations.py),
split along the leading axis or replicated, alone and in a prefetch_to_jax batch; and what
every single-device entry point returns computes so after ``jax.device_put`` to another
device and into a replicated sharding (the oracle's moves)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import jax
from hypothesis import HealthCheck, assume, given, settings
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import dlinspect
from _computations import assert_computes_like, build, entry_points, quietly, views

if len(jax.devices()) != 4:
    pytest.fail(f"expected 4 forced CPU devices, found {jax.devices()}", pytrace=False)

MESH = Mesh(np.array(jax.devices()), ("data",))
SHARDINGS = {"data": NamedSharding(MESH, P("data")), "replicated": NamedSharding(MESH, P())}
#: Examples a case draws at full scale. Each example compiles some twenty XLA computations
#: over 4 devices (about 1.3 s on a quiet 2-core machine): 100 a case took this suite past
#: its 20 minutes on a loaded CI machine. The views themselves are drawn 100 times an entry
#: point by the single-device oracle (tests/test_computations.py); here the subject is the
#: split and the moves.
EXAMPLES = int(40 * float(os.environ.get("DLINSPECT_AGREEMENT_SCALE", "1")))


def _prefetched(x, sharding):
    (batch,) = list(dlinspect.prefetch_to_jax([{"x": x}], sharding=sharding))
    return batch["x"]


@pytest.mark.parametrize("how", ["to_jax", "prefetch_to_jax"])
@pytest.mark.parametrize("name", sorted(SHARDINGS))
def test_every_view_computes_right_sharded(name, how):
    sharding = SHARDINGS[name]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(h=views())
    def run(h):
        make, reference = build(h)
        if name == "data":   # an axis that splits evenly (else a ShardingError)
            assume(reference.ndim and reference.shape[0] % 4 == 0)
        x = make()
        result = quietly(dlinspect.to_jax if how == "to_jax" else _prefetched, x,
                         sharding=sharding)
        assert result.sharding == sharding
        assert_computes_like(result, reference, f"{name} {how} {h}")
    run()


@pytest.mark.parametrize("entry", sorted(entry_points()))
def test_every_view_computes_right_moved(entry):
    convert = entry_points()[entry]

    @settings(max_examples=max(2, EXAMPLES // 2), deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(h=views())
    def run(h):
        make, reference = build(h)
        assert_computes_like(quietly(convert, make()), reference, f"{entry} {h}")
    run()


def test_a_jax_array_on_another_cpu_device_is_read_there():
    """jaxlib's __dlpack_device__ says kDLCPU:0 for every CPU device; the header names the
    array's own: every entry point reads it there."""
    x = jax.device_put(jax.numpy.arange(3.0), jax.devices()[1])
    assert dlinspect.peek(x).device == (dlinspect.DLDeviceType.kDLCPU, 1)
    assert dlinspect.plan(x, target="host").kind == "zero-copy"
    np.testing.assert_array_equal(dlinspect.to_host(x), [0, 1, 2])
    np.testing.assert_array_equal(dlinspect.stack([x, x]), [[0, 1, 2], [0, 1, 2]])
    assert dlinspect.to_jax({"x": x}, device=jax.devices()[2])["x"].devices() == {jax.devices()[2]}
