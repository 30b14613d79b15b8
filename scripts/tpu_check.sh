#!/usr/bin/env bash
# The TPU check, for a session lent a TPU machine (the device tool; nothing there can be
# fetched, and it has no compiler toolchain we rely on). It installs a dlinspect wheel built
# here and torch's CPU build from the machine's own wheels, runs scripts/tpu_check.py (every
# host tensor kind into every TPU target, checked by computations; copy time against
# jax.device_put) and the CPU suite's core route tests with the TPU as JAX's default device.
#
# Here first, once: bash scripts/tpu_check.sh --wheel   (builds the wheel into .whl-tpu/,
# which .git/info/exclude must name)
# Then, with the device tool: run(command="bash scripts/tpu_check.sh", carry=[".whl-tpu"],
# timeout_s=540); the logs and figures come back in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--wheel" ]; then
    rm -rf .whl-tpu
    python -m pip wheel -q --no-build-isolation --no-deps -Cbuild-dir=build-tpuwheel -w .whl-tpu .
    ls .whl-tpu
    exit 0
fi
out=${OUT:-/tmp/dlinspect-tpu}
mkdir -p "$out"
start=$SECONDS
export PYTHONUNBUFFERED=1
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/site .whl-tpu/*.whl
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
    --index-url file:///opt/pypi/simple --find-links /opt/wheels --target /tmp/site torch==2.13.0 \
    || echo "tpu_check.sh: torch did not install; its cases are left out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
echo "tpu_check.sh: installed in $((SECONDS - start)) s"
status=0
export JAX_PLATFORMS=tpu,cpu
python3 -m dlinspect doctor | tee "$out/doctor.txt" || status=1
if [ "${1:-}" != "--suite" ]; then   # (--suite: the test files alone)
    python3 scripts/tpu_check.py --json "$out/tpu-check.json" 2>&1 | tee "$out/tpu-check.log" || status=1
fi
# (the machine's own packages warn at import: DeprecationWarning is not this suite's to raise)
python3 -m pytest -q -p no:cacheprovider -p no:randomly --tb=short -rf -W ignore::DeprecationWarning \
    -o addopts="-m 'not slow'" tests/test_zero_copy.py tests/test_copy_routes.py tests/test_dtypes.py \
    tests/test_header_limits.py tests/test_plan_results.py tests/test_devices.py tests/test_agreement.py \
    tests/test_batches.py tests/test_prefetch.py tests/test_computations.py > "$out/suite.log" 2>&1 \
    || status=1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/suite.log" | tail -40
echo "tpu_check.sh: done in $((SECONDS - start)) s, status $status"
exit $status
