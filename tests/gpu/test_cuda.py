"""CUDA tensors into CUDA JAX (zero-copy by pointer), the stream handshake, CUDA tensors
into a CPU-only JAX (host fallback, one copy), plan agreement on GPU, prefetch beside a
GPU step. Skipped without CUDA (tests/gpu/conftest.py); scripts/gpu_check.sh runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from _computations import assert_computes_like  # noqa: E402
from _helpers import target  # noqa: E402


def pointer(arr) -> int:
    return arr.addressable_data(0).unsafe_buffer_pointer()


def cuda():
    return jax.devices("cuda")[0]


class TestZeroCopy:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32,
                                       torch.uint8, torch.bool])
    def test_torch_cuda(self, dtype):
        t = (torch.arange(4096, device="cuda") % 7).to(dtype).reshape(64, 64)
        route = dlinspect.plan(t)
        assert route.kind == "zero-copy" and route.jax_device == cuda(), route
        y = dlinspect.to_jax(t)
        assert y.devices() == {cuda()} and pointer(y) == t.data_ptr()
        np.testing.assert_array_equal(np.asarray(y).astype(np.float32),
                                      t.float().cpu().numpy())

    def test_fast_path_takes_it(self):
        # The C fast path imports a CUDA tensor that needs nothing (no Python route).
        from dlinspect._core import jax_target as target
        t = torch.ones(32, 32, device="cuda")
        got = dlinspect._core.to_jax_fast(t, target())
        assert type(got) is not tuple and pointer(got) == t.data_ptr()

    def test_batch(self):
        batch = {"x": torch.randn(8, 3, device="cuda"), "y": torch.arange(8, device="cuda",
                                                                         dtype=torch.int32)}
        out = dlinspect.to_jax(batch)
        assert pointer(out["x"]) == batch["x"].data_ptr()
        assert pointer(out["y"]) == batch["y"].data_ptr()

    def test_cupy(self):
        cp = pytest.importorskip("cupy")
        a = cp.arange(1000, dtype=cp.float32).reshape(10, 100)
        assert dlinspect.plan(a).kind == "zero-copy"
        y = dlinspect.to_jax(a)
        assert pointer(y) == a.data.ptr
        np.testing.assert_array_equal(np.asarray(y), cp.asnumpy(a))

    def test_pinned_host_memory(self):
        t = torch.arange(1024, dtype=torch.float32).pin_memory()
        info = dlinspect.peek(t)
        assert info.device_type in (D.kDLCUDAHost, D.kDLCPU)
        route = dlinspect.plan(t)
        y = dlinspect.to_jax(t)
        np.testing.assert_array_equal(np.asarray(y), t.numpy())
        assert route.zero_copy == (pointer(y) == t.data_ptr()), route


class TestStreams:
    def test_producer_work_on_a_side_stream_is_seen(self):
        """Work queued on another stream before the export is visible to JAX: dlinspect
        passes JAX's stream to __dlpack__(stream=...), and the producer makes it wait."""
        side = torch.cuda.Stream()
        a = torch.randn(4096, 4096, device="cuda")
        with torch.cuda.stream(side):
            for _ in range(8):   # long work, then the values JAX must see
                a = a @ a
                a = a / a.norm()
            t = torch.full((1 << 20,), 3.0, device="cuda") + a.sum() * 0
        y = dlinspect.to_jax(t)          # no synchronize: the handshake must order it
        assert float(jax.numpy.sum(y)) == pytest.approx(3.0 * (1 << 20), rel=1e-3)

    def test_stream_rule(self):
        from dlinspect._core import jax_target as target
        s = target().stream_for(int(D.kDLCUDA), 0)
        assert s is not None and s != 0


class TestPinnedStack:
    def test_pinned_batches_reach_the_gpu(self):
        """dlinspect.stack(pinned=True): every batched leaf in page-locked memory, aligned,
        np.stack's values, and to_jax onto the GPU gives them."""
        elements = [{"x": np.full((3, 5), i, np.float32), "y": np.int32(i)} for i in range(8)]
        batch = dlinspect.stack(elements, pinned=True)
        for name, leaf in batch.items():
            assert torch.from_numpy(leaf).is_pinned(), name
            assert leaf.ctypes.data % 64 == 0, name
            np.testing.assert_array_equal(leaf, np.stack([e[name] for e in elements]))
        out = dlinspect.to_jax(batch, device=cuda())
        assert out["x"].devices() == {cuda()}
        np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])
        np.testing.assert_array_equal(np.asarray(out["y"]), np.arange(8))


class TestAgreementOnGPU:
    CASES = {
        "contiguous": lambda: torch.arange(256.0, device="cuda").reshape(16, 16),
        "transposed": lambda: torch.arange(128.0, device="cuda").reshape(16, 8).t(),
        "permuted": lambda: torch.arange(120.0, device="cuda").reshape(2, 3, 4, 5).permute(
            0, 2, 3, 1),
        "sliced": lambda: torch.arange(256.0, device="cuda").reshape(16, 16)[:, ::2],
        "expanded": lambda: torch.arange(8.0, device="cuda").reshape(1, 8).expand(4, 8),
        "int64": lambda: torch.arange(10, device="cuda"),
        "float64": lambda: torch.ones(4, dtype=torch.float64, device="cuda"),
        "empty": lambda: torch.ones(0, 3, device="cuda"),
        "requires_grad": lambda: torch.ones(3, device="cuda", requires_grad=True),
    }

    @pytest.mark.parametrize("case", sorted(CASES))
    def test_plan_says_what_to_jax_does(self, case):
        t = self.CASES[case]()
        route = dlinspect.plan(t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
            try:
                y = dlinspect.to_jax(t)
            except dlinspect.DLInspectError as exc:
                assert route.kind == "error" and type(exc) is type(route.error), (route, exc)
                return
        assert route.kind != "error", route
        np.testing.assert_allclose(np.asarray(y, dtype=np.float64),
                                   t.detach().double().cpu().numpy())
        # what users compute with it, on the GPU and moved (a permuted order is imported,
        # then copied into row-major order on the GPU: one layout out, uncommitted)
        assert_computes_like(y, t.detach().cpu().numpy(), case)
        assert not y._committed and target().row_major(y), route
        if t.numel():
            assert route.zero_copy == (pointer(y) == t.data_ptr()), route


class TestHostFallback:
    def test_cuda_tensor_into_cpu_only_jax(self):
        """A CPU-only JAX: the CUDA tensor is copied once by torch into aligned host memory
        dlinspect allocates, which JAX views."""
        code = textwrap.dedent("""
            import numpy as np, torch, dlinspect, jax
            t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
            route = dlinspect.plan(t)
            assert route.kind == "host-fallback" and "out.copy_(x)" in route.reason, route
            y = dlinspect.to_jax(t)
            assert y.devices() == {jax.devices("cpu")[0]}
            np.testing.assert_array_equal(np.asarray(y), t.cpu().numpy())
            h = dlinspect.to_host(t)
            np.testing.assert_array_equal(h, t.cpu().numpy())
            print("ok")
        """)
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


class TestPrefetchBesideAGPUStep:
    def test_thread_true_gives_the_same_results(self):
        w = jax.device_put(jax.numpy.ones((1024, 1024)), cuda())
        step = jax.jit(lambda w, x: (x @ w).sum())
        batches = [{"x": torch.full((512, 1024), float(i), device="cuda")} for i in range(8)]
        inline = [float(step(w, b["x"])) for b in dlinspect.prefetch_to_jax(batches, thread=False)]
        threaded = [float(step(w, b["x"])) for b in dlinspect.prefetch_to_jax(batches, thread=True)]
        assert inline == threaded == [i * 512 * 1024 * 1024.0 for i in range(8)]
