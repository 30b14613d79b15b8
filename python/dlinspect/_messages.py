"""The words of routes and errors that more than one module writes."""

from __future__ import annotations

import functools
from typing import Any

from ._enums import DLDeviceType as D
from ._enums import device_name

__all__ = ["describe", "narrowing_text", "device_fix", "INSTALL_JAX"]

#: The one install hint for everything that needs jax.
INSTALL_JAX = "pip install 'dlinspect[jax]'"

_PLUGINS: dict[int, str] = {
    D.kDLCUDA: "jax[cuda12]", D.kDLCUDAHost: "jax[cuda12]", D.kDLCUDAManaged: "jax[cuda12]",
    D.kDLROCM: "the jax ROCm plugin", D.kDLROCMHost: "the jax ROCm plugin",
    D.kDLOneAPI: "the Intel jax plugin"}
# How each device's own library moves a tensor to host memory.
_TO_HOST: dict[int, str] = {D.kDLOneAPI: "dpnp: dpnp.asnumpy(x)", D.kDLCUDA: "torch: t.cpu()",
                            D.kDLROCM: "torch: t.cpu()", D.kDLMetal: "torch: t.cpu(); mlx: np.array(a)"}


def describe(info: Any) -> str:
    """``"a float32 tensor of shape (2, 3) on kDLCPU:0"`` (``"an int64 ..."``)."""
    name = info.dtype_name
    article = "an" if name[:1] in "aeio" else "a"   # an int64, a uint8, a float32
    return (f"{article} {name} tensor of shape {info.shape} on "
            f"{device_name(info.device_type, info.device_id)}")


@functools.lru_cache(maxsize=64)
def narrowing_text(name: str, narrowed: str) -> tuple[str, str]:
    """(warning, reason) for JAX's x64 narrowing of dtype ``name`` to ``narrowed``."""
    return (f"{name} is narrowed to {narrowed} because JAX's x64 mode is off (values may "
            f"change, as jax.dlpack.from_dlpack does); to keep 64 bits, call "
            f'jax.config.update("jax_enable_x64", True) first.',
            f"JAX narrows {name} to {narrowed} with x64 off")


def device_fix(device_type: int, target: str, bare_capsule: bool) -> str:
    """What to do about memory on ``device_type`` that could not reach ``target``.

    Never sends the user to an option that just failed: ``fallback="host"`` is named
    only for ``to_jax`` with a producer (a bare capsule has none to ask).
    """
    how = _TO_HOST.get(int(device_type), "torch: t.cpu()")
    parts = [f"move it to host memory with its own library first ({how})"]
    if bare_capsule:
        parts.append("or pass the producer object instead of its capsule, so dlinspect can "
                     "ask it for a host copy")
    plugin = _PLUGINS.get(int(device_type))
    if target == "jax" and plugin:
        parts.append(f"or install {plugin} so JAX can take the memory where it is")
    return ", ".join(parts)
