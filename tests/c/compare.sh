#!/usr/bin/env bash
# The copy kernel of the working tree against the one of another revision: byte for byte
# over tests/c/copy_harness.c's views, then the time of each on representative copies
# (median of REPEATS runs, the two kernels in turn), with SSE2 and without
# (DL_COPY_NO_SIMD). The baseline is include/dlinspect/copy.h at REV with its names
# renamed (dl_ -> base_dl_, DL_ -> BASE_DL_) so that both compile into one program.
#
# Usage: bash tests/c/compare.sh [REV [REPEATS]]    (default: HEAD, 31; GNU sed, a C compiler)
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:-HEAD}
repeats=${2:-31}
cc=${CC:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git show "$rev:include/dlinspect/copy.h" \
    | sed -e 's/\bdl_/base_dl_/g' -e 's/\bDL_/BASE_DL_/g' -e 's/\bDLINSPECT_COPY_H_/BASE_&/g' \
    >"$work/base.h"
for variant in "" "-DDL_COPY_NO_SIMD"; do
    for thresholds in "" "-DDL_COPY_STREAM_MIN=4096 -DDL_COPY_BAND_MAX=2048 -DDL_PANEL_J=256 -DDL_PANEL_I=64"; do
        echo "== compare.sh: $rev vs the working tree, flags: -O3 $variant $thresholds"
        # shellcheck disable=SC2086
        "$cc" -O3 $variant $thresholds -I include -DDL_BASELINE_HEADER="\"$work/base.h\"" \
            tests/c/copy_harness.c -o "$work/harness"
        "$work/harness"
    done
    # shellcheck disable=SC2086
    "$cc" -O3 $variant -I include -DDL_BASELINE_HEADER="\"$work/base.h\"" \
        tests/c/copy_harness.c -o "$work/harness"
    echo "== compare.sh: time, $rev (baseline) vs the working tree (kernel), -O3 $variant"
    "$work/harness" --bench "$repeats"
done
