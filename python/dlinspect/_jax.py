"""What the installed JAX can take, found out once, and the import itself.

Nothing here is a table frozen for one JAX version: the DLDeviceType to platform
mapping comes from jax's own ``jax._src.dlpack`` when it has one, the backends
from ``xla_bridge``, the CPU alignment and the dtypes from small probes run the
first time they are needed.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any

import numpy as np

from ._enums import DLDeviceType as D

__all__ = ["caps", "force_public_api", "JaxCaps"]

# The mapping jax 0.4-0.10 uses; only used where jax does not expose its own.
_DEFAULT_PLATFORMS = {D.kDLCPU: "cpu", D.kDLCUDA: "cuda", D.kDLCUDAHost: "cuda",
                      D.kDLROCM: "rocm", D.kDLROCMHost: "rocm", D.kDLOneAPI: "oneapi"}
_PINNED = frozenset({D.kDLCUDAHost, D.kDLROCMHost, 20})  # 20: JAX's kDLTPUHost


class JaxCaps:
    """The installed JAX's DLPack import abilities (one instance per process).

    Attributes
    ----------
    platforms : dict
        ``DLDeviceType`` value to JAX platform name, for platforms whose backend
        is initialised here.
    mapping : dict
        ``DLDeviceType`` value to platform name, as the installed jax maps them.
    direct : bool
        jaxlib's own ``dlpack_managed_tensor_to_buffer`` has the signature
        dlinspect expects and is used; False means the public
        ``jax.dlpack.from_dlpack`` is used instead.
    direct_reason : str
        Why the direct path is or is not in use.
    """

    def __init__(self) -> None:
        import jax
        from jax._src import xla_bridge

        self.jax = jax
        self.jnp = jax.numpy
        try:
            from jax._src import dlpack as jdl
            self.mapping = {int(k): v for k, v in jdl._DL_DEVICE_TO_PLATFORM.items()}
        except (ImportError, AttributeError):
            self.mapping = {int(k): v for k, v in _DEFAULT_PLATFORMS.items()}
        backends = set(xla_bridge.backends())
        self.platforms = {k: v for k, v in self.mapping.items() if v in backends}
        self._backends = {p: xla_bridge.get_backend(p) for p in set(self.platforms.values())}
        self._devices: dict[tuple[int, int], Any] = {}
        self._dtypes: dict[tuple[int, int, int], str | None] = {}
        self._cpu_align: int | None = None
        self.direct, self.direct_reason, self._import = _find_direct_import()
        if os.environ.get("DLINSPECT_JAX_PUBLIC_API") == "1":
            self.direct, self.direct_reason = False, "DLINSPECT_JAX_PUBLIC_API=1 forces the public API"
        from jax._src import dtypes as jdtypes
        self._canonicalize = jdtypes.canonicalize_dtype
        self._fast_dtypes: set[int] = set()  # code | bits << 8, see _core.JaxFastPath
        self._fast: Any = None
        # .value: jax_enable_x64 as this thread sees it (jax.enable_x64 is thread-local)
        self.x64: Any
        try:
            from jax._src.config import enable_x64
            self.x64 = enable_x64
        except ImportError:  # a jax without the State object: read jax.config
            self.x64 = _X64Flag(jax.config)
        self._narrow: dict[np.dtype, np.dtype | None] = {}  # x64 off: dtype -> narrowed or None

    def fast_path(self) -> Any:
        """The :class:`dlinspect._core.JaxFastPath` of this JAX (built once)."""
        if self._fast is None:
            from . import _core
            from ._route import warn
            import_fn = self._import if self.direct else functools.partial(_public_import, self.jax)
            pinned = any(k in _PINNED for k in self.platforms)
            self._fast = _core.JaxFastPath(import_fn, self.cpu_device(), self.cpu_alignment, self.x64,
                                           self._fast_dtypes, pinned, self._narrow_table(),
                                           warn, _exchange_guard)
        return self._fast

    def _narrow_table(self) -> dict[int, tuple[int, str]]:
        """For the fast path: ``code | bits << 8`` of each 64-bit dtype -> (that of the
        dtype JAX narrows it to with x64 off, the DLInspectWarning text)."""
        from jax._src.config import enable_x64
        from ._dtypes import dldtype_from_numpy, dtype_name
        from ._route import _narrowing_text
        table = {}
        for code, bits in ((0, 64), (1, 64), (2, 64), (5, 128)):  # int, uint, float, complex
            wide = np.dtype(dtype_name(code, bits))
            with enable_x64(False):
                narrow = np.dtype(self._canonicalize(wide))
            ncode, nbits, _ = dldtype_from_numpy(narrow)
            if narrow != wide and self.dtype_problem(ncode, nbits, 1) is None:
                text = _narrowing_text(dtype_name(code, bits), narrow)[0]
                table[code | bits << 8] = (ncode | nbits << 8, text)
        return table

    # -- devices ---------------------------------------------------------
    def device_for(self, device_type: int, device_id: int) -> Any:
        """The ``jax.Device`` for a DLPack device, or None where JAX has no backend."""
        key = (device_type, device_id)
        dev = self._devices.get(key)
        if dev is None:
            platform = self.platforms.get(device_type)
            if platform is None:
                return None
            try:
                dev = self._backends[platform].device_from_local_hardware_id(device_id)
            except Exception:  # no such ordinal on this machine
                return None
            self._devices[key] = dev
        return dev

    def cpu_device(self) -> Any:
        return self.jax.devices("cpu")[0]

    def stream_for(self, device_type: int, jax_device: Any) -> int | None:
        """The ``stream`` to pass to ``__dlpack__`` (array API, ``__dlpack__`` *stream*).

        None for CPU and pinned host; on CUDA/ROCm the stream JAX waits on,
        where ``0`` (ambiguous on CUDA) becomes ``1``, the legacy default stream.
        """
        if device_type not in (D.kDLCUDA, D.kDLROCM) or jax_device is None:
            return None
        try:
            stream = jax_device.get_stream_for_external_ready_events()
        except Exception:
            return None
        if stream == 0 and device_type == D.kDLCUDA:
            return 1
        return stream

    # -- CPU alignment -------------------------------------------------------
    @property
    def cpu_alignment(self) -> int:
        """Smallest alignment, in bytes, at which XLA:CPU imports without a copy."""
        if self._cpu_align is None:
            self._cpu_align = self._probe_alignment()
        return self._cpu_align

    def _probe_alignment(self) -> int:
        from .testing import aligned_empty, make_capsule
        dev = self.cpu_device()
        for align in (8, 16, 32, 64, 128, 256):
            buf = aligned_empty((8,), np.float64, alignment=2 * align, offset=align)
            cap = make_capsule(buf, versioned=False)
            try:
                self.import_capsule(cap, dev, None, False, int(D.kDLCPU))
                return align
            except Exception:
                continue
        return 4096

    # -- dtypes ----------------------------------------------------------
    def dtype_problem(self, code: int, bits: int, lanes: int) -> str | None:
        """None if JAX imports this ``DLDataType``; else JAX's own reason (probed once)."""
        key = (code, bits, lanes)
        if key not in self._dtypes:
            problem = self._dtypes[key] = self._probe_dtype(key)
            if problem is None:
                self._fast_dtypes.add(code | bits << 8)
        return self._dtypes[key]

    def _probe_dtype(self, key: tuple[int, int, int]) -> str | None:
        from .testing import aligned_empty, make_capsule
        code, bits, lanes = key
        if lanes != 1:
            return f"JAX has no vector types (lanes={lanes})"
        if bits == 0:
            return "a 0-bit type holds no data"
        buf = aligned_empty((64,), np.uint8, alignment=256)
        buf[:] = 0
        cap = make_capsule(buf, shape=(8,), dtype=key, versioned=False)
        try:
            self.import_capsule(cap, self.cpu_device(), None, None, int(D.kDLCPU))
        except Exception as exc:  # jaxlib's reason, e.g. "Unknown or invalid DLPack type code 15"
            return str(exc).split("\n")[0]
        return None

    # -- 64-bit types ----------------------------------------------------
    def narrowed(self, np_dtype: np.dtype | None) -> np.dtype | None:
        """The dtype JAX turns ``np_dtype`` into with x64 off, or None if unchanged."""
        if np_dtype is None or np_dtype.itemsize < 8 or self.x64.value:
            return None
        if np_dtype not in self._narrow:
            canon = np.dtype(self._canonicalize(np_dtype))
            self._narrow[np_dtype] = None if canon == np_dtype else canon
        return self._narrow[np_dtype]

    def canonicalize(self, arr: Any) -> Any:
        canon = self._canonicalize(arr.dtype)
        if canon == arr.dtype:
            return arr
        return self.jnp.asarray(arr, dtype=canon)

    # -- import --------------------------------------------------------------
    def import_capsule(self, cap: Any, device: Any, stream: int | None, copy: bool | None,
                       dl_device_type: int) -> Any:
        """Import a ``"dltensor"`` capsule onto ``device`` (consumes it only on success)."""
        if self.direct:
            return self._import(cap, device, stream, copy, dl_device_type)
        return _public_import(self.jax, cap, device, stream, copy, dl_device_type)


def _exchange_guard(tp: type) -> Any:
    """For the fast path: a check that ``x`` of type ``tp`` is a tensor its producer's
    ``__dlpack__`` exports as it is, so the C exchange API may take it instead.

    Only exact ``torch.Tensor`` (a subclass may override ``__dlpack__``). torch's
    ``__dlpack__`` refuses tensors that require grad, have the lazy conjugate bit or
    are not strided; its C API does not, and it also exports the lazy negative bit
    unapplied. Such tensors go through ``__dlpack__`` and its refusals.
    """
    torch = sys.modules.get("torch")
    if torch is None or tp is not torch.Tensor:
        return None
    strided = torch.strided

    def guard(t: Any) -> bool:
        return (not t.requires_grad and t.layout is strided and not t.is_conj()
                and not t.is_neg() and not t.is_quantized)
    return guard


class _X64Flag:
    """``.value`` is ``jax.config.jax_enable_x64`` (for jax without ``config.enable_x64``)."""

    __slots__ = ("_config",)

    def __init__(self, config: Any) -> None:
        self._config = config

    @property
    def value(self) -> bool:
        return bool(self._config.jax_enable_x64)


def _find_direct_import() -> tuple[bool, str, Any]:
    """jaxlib's import function, if it exists with the signature dlinspect calls."""
    try:
        from jax._src.lib import _jax
        fn = _jax.dlpack_managed_tensor_to_buffer
    except (ImportError, AttributeError) as exc:
        return False, f"jaxlib has no dlpack_managed_tensor_to_buffer ({exc})", None
    doc = (getattr(fn, "__doc__", "") or "").split("\n")[0]
    wanted = ("dlpack", "device", "stream", "copy", "dl_device_type")
    if not all(name in doc for name in wanted):
        return False, f"jaxlib's dlpack_managed_tensor_to_buffer has another signature: {doc}", None
    return True, "jaxlib's dlpack_managed_tensor_to_buffer(dlpack, device, stream, copy, dl_device_type)", fn


class _CapsuleProducer:
    """A capsule dressed as a producer, for the public ``jax.dlpack.from_dlpack``."""

    __slots__ = ("_cap", "_device")

    def __init__(self, cap: Any, device: tuple[int, int]) -> None:
        self._cap = cap
        self._device = device

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        return self._cap

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def _public_import(jax: Any, cap: Any, device: Any, stream: int | None, copy: bool | None,
                   dl_device_type: int) -> Any:
    hw_id = getattr(device, "local_hardware_id", None)
    dev_id = device.id if hw_id is None else hw_id
    wrapper = _CapsuleProducer(cap, (dl_device_type, dev_id))
    return jax.dlpack.from_dlpack(wrapper, copy=copy)


_caps: JaxCaps | None = None
_caps_lock = threading.Lock()


def caps() -> JaxCaps:
    """The process-wide :class:`JaxCaps` (imports jax on first call)."""
    global _caps
    if _caps is None:
        with _caps_lock:
            if _caps is None:
                try:
                    _caps = JaxCaps()
                except ImportError as exc:
                    raise ImportError(
                        "dlinspect.to_jax needs jax, which is not installed here; install it "
                        "with: pip install 'dlinspect[jax]'") from exc
    return _caps


def force_public_api(on: bool = True) -> None:
    """Route every JAX import through the public ``jax.dlpack.from_dlpack``.

    For testing the fallback path; ``DLINSPECT_JAX_PUBLIC_API=1`` does the same at start-up.
    """
    c = caps()
    if on:
        c.direct, c.direct_reason = False, "forced by dlinspect._jax.force_public_api()"
    else:
        c.direct, c.direct_reason, c._import = _find_direct_import()
    c._fast = None
