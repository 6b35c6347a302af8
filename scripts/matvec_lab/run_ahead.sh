#!/usr/bin/env bash
# Builds and runs the L2-ahead lab on the device (nvcc, sm_90):
#   bash scripts/matvec_lab/run_ahead.sh   (log in $OUT/ahead.log)
set -uo pipefail
OUT=${OUT:-/tmp/lab-out}
mkdir -p "$OUT" /tmp/lab
nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -o /tmp/lab/ahead scripts/matvec_lab/ahead.cu $* > "$OUT/ahead-build.log" 2>&1 || { tail -40 "$OUT/ahead-build.log"; exit 1; }
timeout 150 /tmp/lab/ahead 2>&1 | tee "$OUT/ahead.log"
