"""Right values by computation over 4 forced CPU devices: ``to_jax(x, sharding=...)`` of
every drawn view computes as ``jnp.asarray(np.asarray(x))`` does (tests/_computations.py),
split along the leading axis or replicated, alone and in a prefetch_to_jax batch."""

from __future__ import annotations

import os

import numpy as np
import pytest

import jax
from hypothesis import HealthCheck, assume, given, settings
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import dlinspect
from _computations import assert_computes_like, build, quietly, views

if len(jax.devices()) != 4:
    pytest.fail(f"expected 4 forced CPU devices, found {jax.devices()}", pytrace=False)

MESH = Mesh(np.array(jax.devices()), ("data",))
SHARDINGS = {"data": NamedSharding(MESH, P("data")), "replicated": NamedSharding(MESH, P())}
EXAMPLES = int(100 * float(os.environ.get("DLINSPECT_AGREEMENT_SCALE", "1")))


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
