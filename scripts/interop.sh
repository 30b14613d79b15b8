#!/usr/bin/env bash
# Interop suite: dlinspect against real third-party DLPack producers from PyPI, and the
# data loaders JAX users feed from (grain, Hugging Face datasets/transformers, Ray Data).
#
# Makes .venv-interop (build dir build-interop), installs the build tools, torch, dlinspect
# with its test and jax extras, then the selected producers, and runs tests/interop (which
# also runs the examples of the documentation's loader pages: test_docs_pages.py).
#
# Usage: [INTEROP=all|light|heavy|loaders|"name ..."] bash scripts/interop.sh [pytest args...]
#   light: pyarrow array_api_strict tvm_ffi warp mlx      (small wheels, a minute or two)
#   heavy: tensorflow paddle dpnp                         (0.5-2 GB installed each)
#   loaders: grain hf ray                                 (data loaders; tf.data comes with
#                                                          tensorflow)
#   names: any of the above, e.g. INTEROP="pyarrow dpnp"
# INTEROP_FRESH=1 removes .venv-interop first. Producer wheels are kept in a wheelhouse,
# INTEROP_WHEELS (default ~/.cache/dlinspect-interop/wheels), so a second run, or a fresh
# clone on the same machine, downloads none of them again: pip's own HTTP cache stores
# nothing here (the registry sends no Cache-Control, ETag or Last-Modified headers).
# Prints, per producer, the install time and the disk it took in the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-interop
LIGHT="pyarrow array_api_strict tvm_ffi warp mlx"
HEAVY="tensorflow paddle dpnp"
LOADERS="grain hf ray"
sel=${INTEROP:-all}
case "$sel" in
    all) sel="$LIGHT $HEAVY $LOADERS" ;;
    light) sel="$LIGHT" ;;
    heavy) sel="$HEAVY" ;;
    loaders) sel="$LOADERS" ;;
esac

# The versions this suite was written against (tests/interop's xfails name their faults
# against these; bump deliberately).
spec() {
    case "$1" in
        pyarrow) echo "pyarrow==26.0.1" ;;
        array_api_strict) echo "array-api-strict==2.6.1" ;;
        tvm_ffi) echo "apache-tvm-ffi==0.1.15.post2" ;;
        warp) echo "warp-lang==1.19.0" ;;
        mlx) echo "mlx[cpu]==0.32.4" ;;
        tensorflow) echo "tensorflow-cpu==2.21.0" ;;
        paddle) echo "paddlepaddle==3.3.1" ;;
        dpnp) echo "dpctl==0.22.1 dpnp==0.20.0 intel-opencl-rt==2026.2.0" ;;
        grain) echo "grain==0.2.18" ;;
        hf) echo "datasets==5.2.0 transformers==5.24.0" ;;
        ray) echo "ray[data]==2.60.0" ;;
        *) echo "interop.sh: unknown producer '$1' (known: $LIGHT $HEAVY $LOADERS)" >&2; return 1 ;;
    esac
}
for p in $sel; do spec "$p" >/dev/null; done

t0=$(date +%s)
if [ "${INTEROP_FRESH:-0}" = 1 ]; then rm -rf "$VENV"; fi
python3 -m venv "$VENV"
. "$VENV/bin/activate"
site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
kib() { du -sk "$VENV" | cut -f1; }
WHEELS=${INTEROP_WHEELS:-$HOME/.cache/dlinspect-interop/wheels}
mkdir -p "$WHEELS"

python -m pip install -q --upgrade pip
python -m pip install -q "scikit-build-core>=0.10" "cython>=3.0" "cython-cmake>=0.2" "numpy>=1.26" ninja cmake
python -m pip install -q torch==2.13.0
python -m pip install -q --no-build-isolation -Cbuild-dir=build-interop -e ".[test,jax]"
# What the base resolved to for numpy, jax, jaxlib, ml_dtypes and torch stays: a producer that
# needs other versions fails here, loudly, instead of quietly changing what is tested against
# (other shared dependencies may move: paddlepaddle pins opt_einsum==3.3.0, for one).
base=$(mktemp)
trap 'rm -f "$base"' EXIT
python -m pip freeze --exclude-editable \
    | grep -i -E '^(numpy|jax|jaxlib|ml.dtypes|torch)==' >"$base"
t_base=$(( $(date +%s) - t0 ))
report=$(printf '%-18s %8s %10s\n' producer "time_s" "venv_MiB")
report+=$'\n'$(printf '%-18s %8s %10s' base "$t_base" "$(( $(kib) / 1024 ))")

for p in $sel; do
    before=$(kib); t=$(date +%s)
    # Into the wheelhouse (a wheel already there is not downloaded again), then from it.
    # shellcheck disable=SC2046
    python -m pip download -q -d "$WHEELS" -c "$base" $(spec "$p")
    # shellcheck disable=SC2046
    python -m pip install -q --find-links "$WHEELS" -c "$base" $(spec "$p")
    report+=$'\n'$(printf '%-18s %8s %10s' "$p" "$(( $(date +%s) - t ))" \
                   "$(( ($(kib) - before) / 1024 ))")
done
python -m pip check || true
echo "interop.sh: installed in $(( $(date +%s) - t0 )) s (site-packages: $site;" \
     "wheelhouse $WHEELS: $(du -sh "$WHEELS" | cut -f1))"
echo "$report"

t=$(date +%s)
status=0
python -m pytest -q -p no:cacheprovider tests/interop "$@" || status=$?
echo "interop.sh: tests ran in $(( $(date +%s) - t )) s; whole run $(( $(date +%s) - t0 )) s"
exit $status
