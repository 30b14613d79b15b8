"""The C copy kernel (include/dlinspect/copy.h) on its own, byte for byte against a plain
reference gather: tests/c/copy_harness.c, compiled with the system's C compiler (skipped
where there is none), with SSE2 and without (DL_COPY_NO_SIMD, the portable loops), at the
header's thresholds and at small ones that take small copies through the streaming stores,
the staging blocks and the panel edges."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
HARNESS = ROOT / "tests" / "c" / "copy_harness.c"
#: Streaming from 4 KiB, bands of 2 KiB, panels of 256 x 64 bytes: every path of the
#: kernel reached by copies of a few KiB.
SMALL = ["-DDL_COPY_STREAM_MIN=4096", "-DDL_COPY_BAND_MAX=2048", "-DDL_PANEL_J=256",
         "-DDL_PANEL_I=64"]


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler on PATH (cc, gcc or clang): the copy harness is compiled C")
    return cc


@pytest.mark.parametrize("thresholds", ["header's", "small"])
@pytest.mark.parametrize("simd", ["default", "DL_COPY_NO_SIMD"])
def test_kernel_writes_the_reference_bytes(tmp_path, simd, thresholds):
    """Every generated view, whole and in parts, gives the reference's bytes and leaves
    the bytes around its destination as they were."""
    exe = tmp_path / "copy_harness"
    flags = ["-O3", "-I", str(ROOT / "include")]
    flags += ["-DDL_COPY_NO_SIMD"] if simd == "DL_COPY_NO_SIMD" else []
    flags += SMALL if thresholds == "small" else []
    build = subprocess.run([_compiler(), *flags, str(HARNESS), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "random views: " in run.stdout and "large views: " in run.stdout, run.stdout
    if simd == "DL_COPY_NO_SIMD":
        assert "SSE2 off" in run.stdout, run.stdout
