"""Our own DLPack declarations, src/dlpack.pxd and dlinspect._tables, against an official
dlpack.h.

The declarations are written out as a C header (``our_header``: the pxd's structs and
constants, _tables' enum values). One C probe prints ``name value`` lines: sizeof,
alignment and the offset and size of every field of each DLPack struct, every enum value,
the flag bits and the ABI version. It is compiled twice, once with the official
``dlpack.h`` (shipped by the ``apache-tvm-ffi`` wheel) and once with ours; the two outputs
must be identical. Skips when that wheel or a C compiler is missing.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PXD = Path(__file__).resolve().parents[1] / "src" / "dlpack.pxd"

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


def _pxd_blocks() -> dict[str, list[str]]:
    """The pxd's top-level blocks (``cdef enum`` and each ``cdef struct NAME``): their
    statements, comments dropped and continuation lines joined."""
    blocks: dict[str, list[str]] = {}
    body: list[str] = []
    pending = ""
    for raw in PXD.read_text(encoding="utf-8").splitlines():
        line = raw.split("#")[0].rstrip()
        if not line.strip():
            continue
        if not line.startswith(" "):
            header = re.match(r"cdef (enum|struct (\w+)):", line)
            body = blocks.setdefault(header.group(2) or "enum", []) if header else []
            continue
        pending += " " + line.strip()
        if pending.count("(") == pending.count(")"):
            body.append(pending.strip())
            pending = ""
    return blocks


def our_header() -> str:
    """Our declarations as C: _tables' enums, the pxd's constants and its structs (in the
    pxd's order, c_DLDataType under its C name DLDataType)."""
    from dlinspect._tables import DLDataTypeCode, DLDeviceType
    lines = ["#include <stdint.h>", "#include <stddef.h>"]
    for enum in (DLDeviceType, DLDataTypeCode):
        values = ", ".join(f"{m.name} = {m.value}" for m in enum)
        lines.append(f"typedef enum {{ {values} }} {enum.__name__};")
    blocks = _pxd_blocks()
    for statement in blocks.pop("enum"):
        name, value = statement.split(" = ")
        if not name.startswith("kDL"):   # (the kDL values are _tables': test_enums_...)
            lines.append(f"#define {name} ((uint64_t)({value}))")
    for name in blocks:
        lines.append(f"typedef struct {name} {name};")
    for name, fields in blocks.items():
        lines.append(f"struct {name} {{")
        lines += [f"  {re.sub(r' (noexcept|nogil)', '', field)};" for field in fields]
        lines.append("};")
    return "\n".join(lines).replace("c_DLDataType", "DLDataType") + "\n"


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
    ours_h = tmp_path / "ours.h"
    ours_h.write_text(our_header())
    ours = run_probe(compiler, tmp_path, "ours", ["-include", str(ours_h)])
    expected_lines = 4 + sum(2 + 2 * len(f) for f in STRUCTS.values())
    expected_lines += len(DEVICE_TYPES) + len(DTYPE_CODES) + len(FLAGS)
    assert len(theirs) == len(ours) == expected_lines
    differ = [
        f"  {a.split()[0]}: official {a.split()[1]}, ours {b.split()[1]}"
        for a, b in zip(theirs, ours)
        if a != b
    ]
    assert not differ, (
        f"{PXD} (as {ours_h}) disagrees with {official_header} on {len(differ)} of "
        f"{len(ours)} values:\n" + "\n".join(differ)
    )


def test_our_header_is_self_contained_c99(compiler: str, tmp_path: Path):
    """The pxd's declarations are whole C: every field type declared, nothing missing."""
    source = tmp_path / "alone.c"
    source.write_text(our_header() + "int main(void) { return 0; }\n")
    flags = ["-Wall", "-Wextra", "-Werror", "-std=c99", "-pedantic"]
    compile_c(compiler, [*flags, "-c", str(source), "-o", str(tmp_path / "alone.o")])


def test_enums_follow_our_declarations():
    """The kDL values src/dlpack.pxd names are dlinspect._tables' (which has every
    DLDeviceType and DLDataTypeCode value, one device row for each), and Need's bits are
    the core's C constants (src/needs.pxi)."""
    from dlinspect._tables import DEVICES, DLDataTypeCode, DLDeviceType, Need
    named = dict(s.split(" = ") for s in _pxd_blocks()["enum"] if s.startswith("kDL"))
    assert len(named) == 5
    for name, value in named.items():
        member = DLDeviceType.__members__.get(name) or DLDataTypeCode.__members__[name]
        assert int(value) == member.value, name
    assert set(DEVICES) == set(DLDeviceType)   # one row per device type
    needs = (PXD.parent / "needs.pxi").read_text(encoding="utf-8")
    bits = {m.group(1): 1 << int(m.group(2))
            for m in re.finditer(r"^    NEED_(\w+) = 1 << (\d+)$", needs, re.M)}
    assert bits == {m.name: m.value for m in Need}
