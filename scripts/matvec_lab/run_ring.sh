#!/usr/bin/env bash
# Builds and runs the streaming-ring chain lab on the device (nvcc, sm_90):
#   bash scripts/matvec_lab/run_ring.sh   (log in $OUT/ring.log)
set -uo pipefail
OUT=${OUT:-/tmp/lab-out}
mkdir -p "$OUT" /tmp/lab
nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -o /tmp/lab/ring scripts/matvec_lab/ring.cu $* > "$OUT/ring-build.log" 2>&1 || { tail -40 "$OUT/ring-build.log"; exit 1; }
grep -A2 "ring_chain" "$OUT/ring-build.log" | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" | head -6
timeout 240 /tmp/lab/ring 2>&1 | tee "$OUT/ring.log"
