#!/usr/bin/env bash
# Build dlinspect._core with the copy kernels' portable C loops alone (DL_COPY_NO_SIMD: what
# a target without SSE2, arm64 among them, compiles from include/dlinspect/copy.h) in a fresh
# virtual environment (.venv-nosimd, build folder build-nosimd), and run the copy tests against
# it: tests/test_copies.py through the extension, tests/test_copy_kernel.py on the C harness
# (which builds both kernels itself where a C compiler is found).
#
# Usage: bash scripts/nosimd.sh [pytest args...]    (default: the two test files)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-nosimd
. .venv-nosimd/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "scikit-build-core>=0.10" "cython>=3.0" "cython-cmake>=0.2" "numpy>=1.26" ninja cmake
python -m pip install -q --no-build-isolation -Cbuild-dir=build-nosimd \
    -Ccmake.define.DLINSPECT_NO_SIMD=ON -e ".[jax]" "pytest>=8.0" "hypothesis>=6.100"
if ! grep -q -- "-DDL_COPY_NO_SIMD" build-nosimd/build.ninja; then
    echo "nosimd.sh: build-nosimd does not define DL_COPY_NO_SIMD" >&2
    exit 1
fi
echo "nosimd.sh: dlinspect._core built with DL_COPY_NO_SIMD (build-nosimd)"
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    tests=(tests/test_copies.py tests/test_copy_kernel.py)
fi
python -m pytest -q -p no:cacheprovider "${tests[@]}"
