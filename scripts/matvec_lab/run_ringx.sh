#!/usr/bin/env bash
# Builds and runs the streaming-ring chain lab with the engine bits (run 58) on the device (nvcc, sm_90):
#   bash scripts/matvec_lab/run_ringx.sh   (log in $OUT/ringx.log)
set -uo pipefail
OUT=${OUT:-/tmp/lab-out}
mkdir -p "$OUT" /tmp/lab
nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -o /tmp/lab/ringx scripts/matvec_lab/ringx.cu $* > "$OUT/ringx-build.log" 2>&1 || { tail -40 "$OUT/ringx-build.log"; exit 1; }
grep -A2 "ringx_chain" "$OUT/ringx-build.log" | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" | head -6
timeout 240 /tmp/lab/ringx 2>&1 | tee "$OUT/ringx.log"
