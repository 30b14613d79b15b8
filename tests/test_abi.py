"""Our own DLPack header, include/dlinspect/dlpack.h, against an official one.

One C probe prints ``name value`` lines: sizeof, alignment and the offset and
size of every field of each DLPack struct, every enum value, the flag bits and
the ABI version. It is compiled twice, once with the official ``dlpack.h``
(shipped by the ``apache-tvm-ffi`` wheel) and once with ours; the two outputs
must be identical. Skips when that wheel or a C compiler is missing.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

INCLUDE_DIR = Path(__file__).resolve().parents[1] / "include"
OUR_HEADER = INCLUDE_DIR / "dlinspect" / "dlpack.h"

STRUCTS = {
    "DLPackVersion": ["major", "minor"],
    "DLDevice": ["device_type", "device_id"],
    "DLDataType": ["code", "bits", "lanes"],
    "DLTensor": ["data", "device", "ndim", "dtype", "shape", "strides", "byte_offset"],
    "DLManagedTensor": ["dl_tensor", "manager_ctx", "deleter"],
    "DLManagedTensorVersioned": ["version", "manager_ctx", "deleter", "flags", "dl_tensor"],
    "DLPackExchangeAPIHeader": ["version", "prev_api"],
    "DLPackExchangeAPI": [
        "header",
        "managed_tensor_allocator",
        "managed_tensor_from_py_object_no_sync",
        "managed_tensor_to_py_object_no_sync",
        "dltensor_from_py_object_no_sync",
        "current_work_stream",
    ],
}
DEVICE_TYPES = (
    "kDLCPU kDLCUDA kDLCUDAHost kDLOpenCL kDLVulkan kDLMetal kDLVPI kDLROCM kDLROCMHost "
    "kDLExtDev kDLCUDAManaged kDLOneAPI kDLWebGPU kDLHexagon kDLMAIA kDLTrn"
).split()
DTYPE_CODES = (
    "kDLInt kDLUInt kDLFloat kDLOpaqueHandle kDLBfloat kDLComplex kDLBool kDLFloat8_e3m4 "
    "kDLFloat8_e4m3 kDLFloat8_e4m3b11fnuz kDLFloat8_e4m3fn kDLFloat8_e4m3fnuz kDLFloat8_e5m2 "
    "kDLFloat8_e5m2fnuz kDLFloat8_e8m0fnu kDLFloat6_e2m3fn kDLFloat6_e3m2fn kDLFloat4_e2m1fn"
).split()
FLAGS = [
    "DLPACK_FLAG_BITMASK_READ_ONLY",
    "DLPACK_FLAG_BITMASK_IS_COPIED",
    "DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED",
]


def probe_source() -> str:
    """C source of the probe; the header under test is given with ``-include``."""
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#ifdef DLINSPECT_DLPACK_MAJOR",  # ours names the version macros differently
        "#define PROBE_MAJOR DLINSPECT_DLPACK_MAJOR",
        "#define PROBE_MINOR DLINSPECT_DLPACK_MINOR",
        "#else",
        "#define PROBE_MAJOR DLPACK_MAJOR_VERSION",
        "#define PROBE_MINOR DLPACK_MINOR_VERSION",
        "#endif",
        '#define U(name, v) printf("%s %llu\\n", name, (unsigned long long)(v))',
        '#define S(name, v) printf("%s %lld\\n", name, (long long)(v))',
        "int main(void) {",
        '  U("version.major", PROBE_MAJOR);',
        '  U("version.minor", PROBE_MINOR);',
        '  U("sizeof(DLDeviceType)", sizeof(DLDeviceType));',
        '  U("sizeof(DLDataTypeCode)", sizeof(DLDataTypeCode));',
    ]
    for struct, fields in STRUCTS.items():
        lines.append(f'  U("sizeof({struct})", sizeof({struct}));')
        lines.append(f'  U("alignof({struct})", _Alignof({struct}));')
        for field in fields:
            lines.append(f'  U("offsetof({struct}.{field})", offsetof({struct}, {field}));')
            lines.append(f'  U("sizeof({struct}.{field})", sizeof((({struct} *)0)->{field}));')
    lines += [f'  S("{name}", {name});' for name in DEVICE_TYPES + DTYPE_CODES]
    lines += [f'  U("{name}", {name});' for name in FLAGS]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler: neither cc nor gcc is on PATH")
    return cc


@pytest.fixture(scope="module")
def official_header() -> Path:
    # find_spec on a top-level name locates the package without importing it.
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None:
        pytest.skip("no official dlpack.h: apache-tvm-ffi (module tvm_ffi) is not installed")
    for location in spec.submodule_search_locations or []:
        header = Path(location) / "include" / "dlpack" / "dlpack.h"
        if header.is_file():
            return header
    pytest.skip("tvm_ffi is installed but ships no include/dlpack/dlpack.h")


def compile_c(cc: str, args: list[str]) -> None:
    result = subprocess.run([cc, *args], capture_output=True, text=True)
    assert result.returncode == 0, f"{cc} {' '.join(args)} failed:\n{result.stderr}"


def run_probe(cc: str, tmp_path: Path, label: str, include_args: list[str]) -> list[str]:
    source = tmp_path / "probe.c"
    source.write_text(probe_source())
    binary = tmp_path / f"probe_{label}"
    compile_c(cc, ["-std=c11", *include_args, str(source), "-o", str(binary)])
    result = subprocess.run([str(binary)], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def test_abi_matches_official_header(compiler: str, official_header: Path, tmp_path: Path):
    theirs = run_probe(compiler, tmp_path, "official", ["-include", str(official_header)])
    ours = run_probe(
        compiler, tmp_path, "ours", ["-I", str(INCLUDE_DIR), "-include", "dlinspect/dlpack.h"]
    )
    expected_lines = 4 + sum(2 + 2 * len(f) for f in STRUCTS.values())
    expected_lines += len(DEVICE_TYPES) + len(DTYPE_CODES) + len(FLAGS)
    assert len(theirs) == len(ours) == expected_lines
    differ = [
        f"  {a.split()[0]}: official {a.split()[1]}, ours {b.split()[1]}"
        for a, b in zip(theirs, ours)
        if a != b
    ]
    assert not differ, (
        f"{OUR_HEADER} disagrees with {official_header} on {len(differ)} of {len(ours)} "
        "values:\n" + "\n".join(differ)
    )


def test_our_header_is_self_contained_c99(compiler: str, tmp_path: Path):
    source = tmp_path / "alone.c"
    source.write_text('#include "dlinspect/dlpack.h"\nint main(void) { return 0; }\n')
    flags = ["-Wall", "-Wextra", "-Werror", "-std=c99", "-pedantic"]
    compile_c(compiler, [*flags, "-I", str(INCLUDE_DIR), "-c", str(source),
                         "-o", str(tmp_path / "alone.o")])


def test_enums_follow_our_header():
    """dlinspect._tables declares exactly the DLDeviceType and DLDataTypeCode values of our
    include/dlinspect/dlpack.h (one axis of change: a new value is added in both), and
    Need's bits are the core's C constants (src/needs.pxi)."""
    import re
    from dlinspect._tables import DEVICES, DLDataTypeCode, DLDeviceType, Need
    root = Path(__file__).parents[1]
    header = (root / "include" / "dlinspect" / "dlpack.h").read_text(encoding="utf-8")

    def block(name: str) -> dict[str, int]:
        body = re.search(r"typedef enum[^{]*\{([^}]*)\}\s*" + name + r"\s*;", header)
        assert body is not None, f"no enum {name} in dlpack.h"
        return {m.group(1): int(m.group(2))
                for m in re.finditer(r"(kDL\w+)\s*=\s*(\d+)", body.group(1))}

    assert block("DLDeviceType") == {m.name: m.value for m in DLDeviceType}
    assert block("DLDataTypeCode") == {m.name: m.value for m in DLDataTypeCode}
    assert set(DEVICES) == set(DLDeviceType)   # one row per device type
    needs = (root / "src" / "needs.pxi").read_text(encoding="utf-8")
    bits = {m.group(1): 1 << int(m.group(2))
            for m in re.finditer(r"^    NEED_(\w+) = 1 << (\d+)$", needs, re.M)}
    assert bits == {m.name: m.value for m in Need}
