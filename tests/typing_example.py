"""Checked by mypy (tests/test_typing.py): the public API as a user's typed code uses it."""

from __future__ import annotations

import jax
import numpy as np

import dlinspect
from dlinspect import DLDeviceType, Route, TensorInfo
from dlinspect.testing import DeleterCounter

x = np.ones((3, 4), np.float32)
info: TensorInfo = dlinspect.peek(x)
shape: tuple[int, ...] = info.shape
strides: tuple[int, ...] = info.strides
ndim: int = info.ndim
aligned: int = info.alignment
read_only: bool | None = info.read_only
device_type: DLDeviceType | int = info.device_type
route: Route = dlinspect.plan(x, "host", copy=None)
kind: str = route.kind
text: str = dlinspect.explain(x, target="host")
host: np.ndarray = dlinspect.to_host(x)
counter = DeleterCounter()
calls: int = counter.calls
arr: jax.Array = dlinspect.to_jax(x, readonly="share", narrow="ok")
batch = dlinspect.to_jax({"x": x})          # a pytree: its own structure (Any)
routes = dlinspect.plan({"x": x})
loader = dlinspect.prefetch_to_jax([{"x": x}], fallback="raise")
