#!/usr/bin/env bash
# The GPU check, for a session lent a CUDA machine (the device tool; nothing there can be
# fetched). It builds dlinspect there from this tree, runs tests/gpu (torch CUDA, pinned and
# CuPy tensors into CUDA JAX by pointer, the stream handshake, CUDA tensors into a CPU-only
# JAX, plan agreement, prefetch beside a GPU step), the CPU suite's core routes, and
# scripts/gpu_bench.py (per-call time against jax.dlpack.from_dlpack). Under 8 minutes.
#
# Here first, once: bash scripts/gpu_check.sh --fetch    (downloads what the machine lacks,
# cython-cmake to build and hypothesis for the property tests, as wheels into .whl/, which
# .gitignore keeps out of git)
# Then, with the device tool: run(command="bash scripts/gpu_check.sh", carry=[".whl"],
# timeout_s=540); the logs and figures come back in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d .whl "cython-cmake==0.3.0" \
        "hypothesis==6.151.9" "sortedcontainers==2.4.0" "attrs==25.4.0"
    ls .whl
    exit 0
fi
out=${OUT:-/tmp/dlinspect-gpu}
mkdir -p "$out"
start=$SECONDS
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
python3 -m pip install -q --no-build-isolation --no-index --no-deps -Cbuild-dir=build-gpu -e .
echo "gpu_check.sh: built in $((SECONDS - start)) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import jax, torch, dlinspect; print('jax', jax.__version__, jax.devices(), '| torch', torch.__version__, torch.cuda.is_available(), '| dlinspect', dlinspect.__version__)"
python3 -m dlinspect doctor | tee "$out/doctor.txt"
status=0
python3 -m pytest -q -p no:cacheprovider -rs -m "" tests/gpu 2>&1 | tee "$out/gpu-tests.log" || status=1
python3 -m pytest -q -p no:cacheprovider -x tests/test_zero_copy.py tests/test_copy_routes.py \
    tests/test_dtypes.py tests/test_header_limits.py tests/test_plan_results.py tests/test_devices.py \
    tests/test_producers.py tests/test_agreement.py tests/test_batches.py 2>&1 | tail -5 \
    | tee "$out/cpu-suite.log" || status=1
timeout 180 python3 scripts/gpu_bench.py --json "$out/gpu-bench.json" || status=1
echo "gpu_check.sh: done in $((SECONDS - start)) s, status $status"
exit $status
