#!/usr/bin/env bash
# Build dlinspect._core with AddressSanitizer and UndefinedBehaviorSanitizer in a fresh
# virtual environment (.venv-asan, build dir build-asan) and run the peek, routing, agreement,
# copy, stack, batch, multi-device, prefetch and fuzz tests with the sanitizer runtimes preloaded into Python.
# Any sanitizer report aborts the process, which fails the run.
#
# Usage: bash scripts/sanitize.sh [pytest args...]    (default: the tests named below)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-asan
. .venv-asan/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "scikit-build-core>=0.10" "cython>=3.0" "cython-cmake>=0.2" "numpy>=1.26" ninja cmake
python -m pip install -q torch==2.13.0
python -m pip install -q --no-build-isolation -Cbuild-dir=build-asan \
    -Ccmake.define.DLINSPECT_SANITIZE=ON -e ".[test,jax,examples]" apache-tvm-ffi
# (not imported to find it: an instrumented module imported without the preload aborts)
so=$(ls "$(python -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")"/dlinspect/_core*.so)
if ! grep -q __asan_report "$so" || ! grep -q __ubsan_handle "$so"; then
    echo "sanitize.sh: $so is not instrumented" >&2
    exit 1
fi
echo "sanitize.sh: $so is instrumented (ASan + UBSan)"
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    tests=(tests/test_abi.py tests/test_peek.py tests/test_zero_copy.py tests/test_copy_routes.py
           tests/test_dtypes.py tests/test_header_limits.py tests/test_plan_results.py
           tests/test_devices.py tests/test_producers.py tests/test_agreement.py tests/test_copies.py
           tests/test_stack.py tests/test_batches.py
           tests/test_prefetch.py
           tests/test_subprocess_suites.py tests/test_reliability.py)
fi
# detect_leaks=0: CPython itself leaks by design at exit; leaks are measured by the soak test.
# alloc_dealloc_mismatch / odr: false reports from uninstrumented C++ in jaxlib and torch.
export ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:detect_odr_violation=0:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export DLINSPECT_SANITIZED=1  # the leak soak skips its RSS bound (ASan keeps freed memory)
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
    python -m pytest -q -p no:cacheprovider "${tests[@]}"
