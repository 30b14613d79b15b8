"""Type stubs for the compiled extension dlinspect._core (src/_core.pyx and its .pxi files)."""

import enum
from collections.abc import Callable
from typing import Any, NamedTuple, final, overload

import jax
import numpy as np

from ._options import Fallback, Leaves, Narrow, ReadOnly, SupportsDLPack, Target

MAX_NDIM: int
NUMPY_MAX_NDIM: int
FLAG_READ_ONLY: int
FLAG_IS_COPIED: int
FLAG_IS_SUBBYTE_TYPE_PADDED: int
TYPES_MAX: int

Capsule = Any  # a PyCapsule (no Python-level type to name)

# tables.pxi
class DLDeviceType(enum.IntEnum):
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
    kDLMAIA = 17
    kDLTrn = 18

class DLDataTypeCode(enum.IntEnum):
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLOpaqueHandle = 3
    kDLBfloat = 4
    kDLComplex = 5
    kDLBool = 6
    kDLFloat8_e3m4 = 7
    kDLFloat8_e4m3 = 8
    kDLFloat8_e4m3b11fnuz = 9
    kDLFloat8_e4m3fn = 10
    kDLFloat8_e4m3fnuz = 11
    kDLFloat8_e5m2 = 12
    kDLFloat8_e5m2fnuz = 13
    kDLFloat8_e8m0fnu = 14
    kDLFloat6_e2m3fn = 15
    kDLFloat6_e3m2fn = 16
    kDLFloat4_e2m1fn = 17

class DLDataType(NamedTuple):
    code: int
    bits: int
    lanes: int = 1

class Device(NamedTuple):
    host: bool = False
    pinned: bool = False
    platform: str | None = None
    jax_maps: bool = True
    stream: bool = False
    default_stream: int = 0
    to_host: str = ...
    plugin: str | None = None

class DType(NamedTuple):
    name: str
    numpy: bool
    x64_narrow: tuple[int, int] | None = None

OTHER_DEVICE: Device
DEVICES: dict[DLDeviceType, Device]
DTYPES: dict[tuple[int, int], DType]
def device_row(device_type: int) -> Device: ...
def as_device_type(value: int) -> DLDeviceType | int: ...
def device_name(device_type: int, device_id: int | None = None) -> str: ...
def stream_of(device_type: int, jax_device: Any) -> int | None: ...
def dtype_name(code: int, bits: int, lanes: int = 1) -> str: ...
def numpy_dtype(code: int, bits: int, lanes: int = 1) -> np.dtype[Any] | None: ...
def dldtype_from_numpy(dtype: object) -> tuple[int, int, int]: ...

# warn.pxi
collecting: Any
def warn(message: str, at_consumer: bool = False) -> None: ...

# header.pxi
@final
class TensorInfo:
    @property
    def device_type(self) -> DLDeviceType | int: ...
    @property
    def device_id(self) -> int: ...
    @property
    def device(self) -> tuple[DLDeviceType | int, int]: ...
    @property
    def capsule_device(self) -> tuple[DLDeviceType | int, int] | None: ...
    @property
    def host_accessible(self) -> bool: ...
    @property
    def ndim(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def byte_strides(self) -> tuple[int, ...]: ...
    @property
    def strides_null(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def dtype(self) -> DLDataType: ...
    @property
    def dtype_name(self) -> str: ...
    @property
    def numpy_dtype(self) -> np.dtype[Any] | None: ...
    @property
    def byte_offset(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def alignment(self) -> int: ...
    @property
    def version(self) -> tuple[int, int] | None: ...
    @property
    def flags(self) -> int: ...
    @property
    def read_only(self) -> bool | None: ...
    @property
    def is_copied(self) -> bool | None: ...
    @property
    def capsule_name(self) -> str | None: ...
    @property
    def source(self) -> str: ...
    @property
    def is_c_contiguous(self) -> bool: ...
    @property
    def is_f_contiguous(self) -> bool: ...
    @property
    def is_compact(self) -> bool: ...
    @property
    def has_broadcast(self) -> bool: ...
    @property
    def has_negative_strides(self) -> bool: ...
    def sliced(self, index: tuple[slice, ...]) -> TensorInfo: ...
    def to_dict(self) -> dict[str, Any]: ...
    def _state(self) -> tuple[Any, ...]: ...

def _rebuild_info(state: tuple[Any, ...]) -> TensorInfo: ...
def capsule_name(cap: Capsule) -> str | None: ...

# capsules.pxi
@final
class DeleterCounter:
    @property
    def calls(self) -> int: ...

def _make_capsule(data: Any, address: int | None, shape: tuple[int, ...] | None,
                  ndim: int | None, strides: tuple[int, ...] | None, code: int, bits: int,
                  lanes: int, device_type: int, device_id: int, byte_offset: int,
                  versioned: bool, major: int, minor: int, flags: int,
                  counter: DeleterCounter | None, name: str | None,
                  null_deleter: bool) -> Capsule: ...
def capsule_of(arr: np.ndarray[Any, Any], read_only: bool = ...) -> Capsule: ...
def aligned_empty(shape: Any, dtype: Any = ..., alignment: int = ..., offset: int = ...
                  ) -> np.ndarray[Any, Any]: ...
def stack_column(column: list[Any], alignment: int) -> np.ndarray[Any, Any] | None: ...
def import_capsule(import_fn: Callable[..., Any], cap: Capsule, device: Any, stream: int | None,
                   copy: bool | None, dl_device_type: int) -> Any: ...

class HostOwner: ...

def take(cap: Capsule) -> HostOwner: ...
def view_capsule(owner: Any, info: TensorInfo) -> Capsule: ...
def header_capsule(owner: Any, address: int, shape: tuple[int, ...], strides: tuple[int, ...],
                   code: int, bits: int, lanes: int, device_type: int = ..., device_id: int = ...,
                   flags: int = ...) -> Capsule: ...
def numpy_capsule(arr: np.ndarray[Any, Any], refusal: BaseException | None = None) -> Capsule: ...

# export.pxi
def peek(obj: Any, /) -> TensorInfo: ...
def export(x: Any, stream_for: Callable[[int, int], int | None] | None = ...
           ) -> tuple[Capsule, TensorInfo]: ...
def export_host_copy(x: Any) -> tuple[Any, Any]: ...
def into_call(into: str) -> str: ...
def export_host_copy_into(x: Any, out: np.ndarray[Any, Any]) -> str | None: ...
HOST_METHODS: tuple[str, ...]
def host_methods(x: Any) -> list[str]: ...
def exchange_api_version(tp: type) -> tuple[int, int] | None: ...
_TYPES: dict[type, Any]
class Producer(NamedTuple):
    guard: int = 0
    hints: tuple[tuple[str, str], ...] = ()
    fix: str | None = None
    into: str | None = None
    doctor: tuple[str, str] | None = None

PRODUCERS: dict[tuple[str, str], Producer]
def is_tensor(x: Any) -> bool: ...
def first_line(exc: BaseException, typed: bool = True) -> str: ...

# needs.pxi
@final
class JaxTarget:
    jax: Any
    jnp: Any
    import_fn: Callable[..., Any]
    direct: bool
    cpu_device: Any
    cpu_align: int
    copy_align: int
    x64: Any
    x64_context: Callable[[bool], Any] | None
    platforms: frozenset[str]
    warn: Callable[[str], None]
    stream_for: Callable[[int, int], int | None]
    array_type: type
    permuted_ok: bool
    unit_strides_ok: bool
    assemble: Callable[..., Any]
    put: Callable[..., Any] | None
    put_align: int
    uncommit: Callable[[Any], Any]
    row_major: Callable[[Any], bool]
    def __init__(self, *, jax: Any, jnp: Any, import_fn: Callable[..., Any], direct: bool,
                 cpu_device: Any, cpu_align: int, x64: Any,
                 x64_context: Callable[[bool], Any] | None,
                 devices: dict[tuple[int, int], Any], platforms: set[str] | frozenset[str],
                 cpu_keys: set[tuple[int, int]], probe: Callable[[int, int], str | None],
                 hold: Callable[[int, int], str | None], narrow: dict[int, tuple[int, str]],
                 warn: Callable[[str], None], stream_for: Callable[[int, int], int | None],
                 array_type: type, permuted_ok: bool, assemble: Callable[..., Any],
                 put: Callable[..., Any] | None = ..., put_align: int = ...,
                 make_aval: Callable[..., Any] | None = ...,
                 make_single: Callable[[Any], Any] | None = ...,
                 uncommit: Callable[[Any], Any] | None = ...,
                 unit_strides_ok: bool = ...,
                 row_major: Callable[[Any], bool] | None = ...) -> None: ...
    def dtype_problem(self, code: int, bits: int, held: bool = ...) -> str | None: ...

def _same(arr: Any) -> Any: ...
def needs(info: TensorInfo, target: JaxTarget | None = ..., share_readonly: bool = ...) -> int: ...

class Need(enum.IntFlag):
    DEVICE = 1
    DTYPE = 2
    LANES = 4
    LAYOUT = 8
    READ_ONLY = 16
    ALIGN = 32
    NARROW = 64
    PACKED = 128
    EMPTY = 256
    VIA_CPU = 512
    NUMPY_PUT = 1024
    PERMUTED = 2048
    SHAPE = 4096

# shard.pxi
class Layout(NamedTuple):
    local: bool
    uneven: tuple[Any, ...] | None
    devices: list[Any]
    indices: list[Any]
    split: bool

def layout(sharding: Any, shape: tuple[int, ...]) -> Layout: ...
def uneven(shape: tuple[int, ...], sharding: Any) -> tuple[Any, ...] | None: ...
def default_memory(sharding: Any) -> bool: ...
def spans_processes(sharding: Any) -> bool: ...

# routes.pxi
ZERO_COPY: str
COPY: str
HOST_FALLBACK: str
ERROR: str
UNTOUCHED: str
IMPORT: str
HOST_COPY: str
HOST_VIEW: str
UNPACK: str
EMPTY: str
PRODUCER_COPY: str
NUMPY_PUT: str
NUMPY_COPY: str
RAISE: str
PASS: str
ARRAY_PUT: str
ARRAY_COPY: str
KEEP: str
SPLIT: str
DEVICE_PUT: str
PROCESS_LOCAL: str
JAX_ACTIONS: frozenset[str]
HOST_ACTIONS: frozenset[str]

class Route:
    kind: str
    action: str
    target: str
    info: TensorInfo | None
    jax_device: Any
    import_device: Any
    import_copy: bool | None
    import_type: int
    problem: str | None
    facts: dict[str, Any]
    copy_bytes: int
    key_path: str
    def __init__(self, kind: str, action: str, info: TensorInfo | None, target: str, *,
                 needs: int = ..., copy_bytes: int = ..., jax_device: Any = ...,
                 import_device: Any = ..., import_type: int = ..., import_copy: bool | None = ...,
                 shards: tuple[Any, ...] | None = ..., problem: str | None = ...,
                 **facts: Any) -> None: ...
    @property
    def needs(self) -> Need: ...
    @property
    def zero_copy(self) -> bool: ...
    @property
    def shards(self) -> tuple[tuple[Any, tuple[slice, ...], Route], ...]: ...
    @property
    def reason(self) -> str: ...
    @property
    def error(self) -> Exception | None: ...
    @property
    def warning(self) -> str | None: ...

def fail(problem: str, info: TensorInfo | None, target: str, needs: int = ...,
         **facts: Any) -> Route: ...
def failed(exc: BaseException, target: str, info: TensorInfo | None = ...) -> Route: ...
def physical_memory() -> int | None: ...
def route_jax(info: TensorInfo, needs: int, tg: JaxTarget, opts: Any, source: Any) -> Route: ...
def route_host(info: TensorInfo, needs: int, copy: bool | None, source: Any) -> Route: ...
def route_numpy_copy(exc: Any, tg: JaxTarget | None, target: str, opts: Any) -> Route: ...
def route_sharded(info: TensorInfo, needs: int, tg: JaxTarget, sharding: Any, opts: Any,
                  source: Any) -> Route: ...
def route_jax_array(x: Any, opts: Any, tg: JaxTarget) -> Route: ...
def untouched(leaf: Any, target: str, opts: Any) -> Route: ...
def decide(info: TensorInfo, tg: JaxTarget | None, target: str, opts: Any,
           source: Any = ...) -> Route: ...
def plan_one(x: Any, tg: JaxTarget | None, target: str, opts: Any) -> Route: ...

# fast.pxi
def to_jax_fast(x: Any, tg: JaxTarget, flags: int = ...) -> Any: ...

# execute.pxi
def set_target(tg: JaxTarget | None) -> None: ...
def current_target() -> JaxTarget | None: ...
def set_target_builder(build: Callable[[], JaxTarget]) -> None: ...
def set_words(module: Any) -> None: ...
@overload
def to_jax(x: SupportsDLPack, device: Any = None, copy: bool | None = None, *,
           sharding: Any = None, fallback: Fallback = "host", readonly: ReadOnly = "copy",
           leaves: Leaves = "keep", narrow: Narrow = "warn") -> jax.Array: ...
@overload
def to_jax(x: Any, device: Any = None, copy: bool | None = None, *, sharding: Any = None,
           fallback: Fallback = "host", readonly: ReadOnly = "copy", leaves: Leaves = "keep",
           narrow: Narrow = "warn") -> Any: ...
@overload
def plan(x: TensorInfo | SupportsDLPack, target: Target = "jax", *, device: Any = None,
         copy: bool | None = None, sharding: Any = None, fallback: Fallback = "host",
         readonly: ReadOnly = "copy", leaves: Leaves = "keep", narrow: Narrow = "warn") -> Route: ...
@overload
def plan(x: Any, target: Target = "jax", *, device: Any = None, copy: bool | None = None,
         sharding: Any = None, fallback: Fallback = "host", readonly: ReadOnly = "copy",
         leaves: Leaves = "keep", narrow: Narrow = "warn") -> Any: ...
def convert(x: Any, opts: Any, tg: JaxTarget | None = ...,
            report: LoaderReport | None = ...) -> Any: ...

ADVISE_AFTER: int
ADVISE_MIN_BYTES: int

@final
class LoaderReport:
    batches: int
    def __init__(self, *, at_delivery: bool = ...) -> None: ...
    def new_epoch(self) -> None: ...
    def _next_epoch(self) -> LoaderReport: ...
    def _delivered(self) -> None: ...
    def _taken_views(self) -> list[tuple[str, Any, Any, Any, int, int, bool]]: ...
    def _reused(self, keys: Any) -> None: ...
    def as_dict(self) -> dict[str, dict[str, Any]]: ...
def repeated_capsule(leaves: list[Any], seen: set[int] | None = None) -> int: ...
def repeated_capsule_error() -> Exception: ...
def to_host(x: Any, copy: bool | None = None) -> np.ndarray[Any, Any]: ...
EXECUTORS: dict[str, Callable[..., Any]]
HOST_EXECUTORS: dict[str, Callable[..., Any]]
