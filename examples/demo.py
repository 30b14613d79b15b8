"""dlinspect on real tensors: peek, explain and to_jax on NumPy and PyTorch
tensors, and on a fake Vulkan producer (what jax.dlpack.from_dlpack refuses).

Run: python examples/demo.py
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

import dlinspect
from dlinspect import DLDeviceType
from dlinspect.testing import FakeProducer

try:
    import torch
except ImportError:  # torch is optional
    torch = None


def show(title, x, **options):
    print(f"== {title}")
    print(dlinspect.explain(x, **options))
    try:
        y = dlinspect.to_jax(x, **options)
        print(f"   to_jax -> {type(y).__name__} {y.dtype}{list(y.shape)} on {y.devices()}")
    except dlinspect.DLInspectError as exc:
        print(f"   to_jax -> {type(exc).__name__}: {exc}")
    print()


grid = np.arange(12, dtype=np.float32).reshape(3, 4)
print("peek:", dlinspect.peek(grid), "\n")
show("NumPy, C-contiguous", grid)
show("NumPy, sliced with gaps (jax.dlpack.from_dlpack: UNIMPLEMENTED)", grid[:, :2])
frozen = grid.copy()
frozen.flags.writeable = False
show("NumPy, read-only (jax.dlpack.from_dlpack: BufferError)", frozen)
show("NumPy, broadcast", np.broadcast_to(np.float32(7), (2, 3)))

if torch is not None:
    print("peek:", dlinspect.peek(torch.ones(2, 3).t()), "\n")
    show("torch, transposed (one copy into row-major order)", torch.arange(6.0).reshape(2, 3).t())
    show("torch, expand() (stride 0)", torch.tensor([1.0, 2.0]).expand(3, 2))
    show("torch, requires_grad", torch.ones(2, requires_grad=True))
else:
    print("(torch is not installed: pip install torch==2.13.0 for the torch rows)\n")

vulkan = FakeProducer(np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
                      device=(DLDeviceType.kDLVulkan, 0))
show("fake Vulkan producer (jax.dlpack.from_dlpack: unsupported device type)", vulkan)
show("fake Vulkan producer, fallback='raise'", vulkan, fallback="raise")
