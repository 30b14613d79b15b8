"""One of two JAX processes (jax.distributed on 127.0.0.1, CPU collectives "gloo").

Usage: python worker.py PORT PROCESS_ID OUT_JSON. Each process holds 4 rows of an
8-row global batch (process p: rows 4p..4p+3) and converts it with
``to_jax(local, sharding=global_sharding)`` and ``prefetch_to_jax(..., sharding=...)``;
it writes what it saw, checked against the whole batch gathered from both.
"""

from __future__ import annotations

import json
import sys

import jax

port, pid, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect.testing import aligned_array  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("data",))
data = NamedSharding(mesh, P("data"))
replicated = NamedSharding(mesh, P())

whole = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
local = {"x": aligned_array(whole[4 * pid:4 * pid + 4]),
         "y": np.arange(4 * pid, 4 * pid + 4, dtype=np.int32), "id": [f"p{pid}"] * 4}
result: dict = {"pid": pid, "devices": len(jax.devices()), "local": len(jax.local_devices())}

route = dlinspect.plan(local, sharding=data)
result["plan"] = {k: route[k].kind for k in ("x", "y")}
g = dlinspect.to_jax(local, sharding=data)
result["shape"] = list(g["x"].shape)
result["id"] = g["id"]
gathered = multihost_utils.process_allgather(g["x"], tiled=True)
result["values_ok"] = bool(np.array_equal(np.asarray(gathered), whole))
result["labels_ok"] = bool(np.array_equal(
    np.asarray(multihost_utils.process_allgather(g["y"], tiled=True)), np.arange(8)))

batches = [local, local]
shapes = [list(b["x"].shape) for b in dlinspect.prefetch_to_jax(batches, sharding=data)]
result["prefetch_shapes"] = shapes
torch = None
try:
    import torch
except ImportError:
    pass
if torch is not None:
    t = dlinspect.to_jax({"x": torch.from_numpy(whole[4 * pid:4 * pid + 4].copy())}, sharding=data)
    result["torch_ok"] = bool(np.array_equal(
        np.asarray(multihost_utils.process_allgather(t["x"], tiled=True)), whole))
with open(out_path, "w") as f:
    json.dump(result, f)
jax.distributed.shutdown()
