#!/usr/bin/env bash
# Lab run 25 on the device: builds ws.cu (mmt.cu's mmw_* against mmt_*, with mmw_pack) and runs
# it. Log in $OUT/ws.log. Extra nvcc flags in WS_FLAGS.
set -uo pipefail
OUT=${OUT:-/tmp/ws-out}
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -arch=sm_90a -Xptxas -v ${WS_FLAGS:-} -o /tmp/ws scripts/matvec_lab/ws.cu > "$OUT/ws-build.log" 2>&1 ||
    { grep -E "error" -A3 "$OUT/ws-build.log" | head -20; exit 1; }
timeout 120 /tmp/ws 2>&1 | tee "$OUT/ws.log"
