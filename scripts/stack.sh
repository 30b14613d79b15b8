#!/usr/bin/env bash
# Build dlinspect against one version stack of .ci/stacks.json ("oldest", "middle" or "newest") in its
# own virtual environment (.venv-stack-NAME, build dir build-stack-NAME) and run the whole
# test suite there. Downloads go through pip's cache (PIP_CACHE_DIR), so a second run, or
# the next stack, fetches nothing twice.
# Usage: bash scripts/stack.sh NAME [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; shift
read -r pyver pins < <(python3 - "$name" <<'PY'
import json, sys
stack = json.load(open(".ci/stacks.json"))[sys.argv[1]]
print(stack["python"], " ".join(stack["pins"]))
PY
)
py=""
# pyenv's versions first: its shim for pythonX.Y exists even where that version is not
# selected, and then fails when run; so each candidate must actually run.
root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for candidate in "$root/versions/$pyver"*/bin/python3 "python$pyver"; do
    if "$candidate" -c pass >/dev/null 2>&1; then py=$candidate; break; fi
done
[ -n "$py" ] || { echo "stack.sh: no Python $pyver here (pyenv install $pyver)" >&2; exit 1; }
venv=.venv-stack-$name
start=$SECONDS
"$py" -m venv --clear "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "scikit-build-core>=0.10" "cython>=3.0" "cython-cmake>=0.2" "numpy>=1.26" ninja cmake
# The pins first, then the package with its test extra (the pins constrain it).
python -m pip install -q $pins
python -m pip install -q --no-build-isolation -Cbuild-dir="build-stack-$name" -e ".[test]" $pins
echo "stack.sh: $name installed in $((SECONDS - start)) s:" \
     "$(python -c 'import sys, numpy, jax, jaxlib, torch, ml_dtypes; print(f"Python {sys.version.split()[0]}, numpy {numpy.__version__}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, torch {torch.__version__}, ml_dtypes {ml_dtypes.__version__}")')"
python -m pytest -q -p no:cacheprovider "$@"
echo "stack.sh: $name passed in $((SECONDS - start)) s"
