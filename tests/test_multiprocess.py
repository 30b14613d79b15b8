"""Two real JAX processes (jax.distributed on 127.0.0.1, CPU "gloo" collectives), each
converting its local rows onto one global sharding (tests/multiprocess/worker.py): the global
array in both, where process 1 once got an error about "devices addressable by the current
process"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")

pytestmark = pytest.mark.slow   # two JAX processes: CI's full run has it (.ci/run)

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_build_one_global_array(tmp_path):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, str(HERE / "multiprocess" / "worker.py"), str(port),
                               str(pid), str(tmp_path / f"{pid}.json")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for pid in (0, 1)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    for pid in (0, 1):
        r = json.loads((tmp_path / f"{pid}.json").read_text())
        assert r["devices"] == 2 and r["local"] == 1
        assert r["shape"] == [8, 3] and r["values_ok"] and r["labels_ok"], r
        assert r["id"] == [f"p{pid}"] * 4          # non-tensor leaves stay the process's own
        assert r["prefetch_shapes"] == [[8, 3], [8, 3]]
        assert r["plan"] == {"x": "copy", "y": "copy"}   # make_array_from_process_local_data copies
        assert r.get("torch_ok", True)
