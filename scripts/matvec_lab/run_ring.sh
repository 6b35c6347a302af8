#!/usr/bin/env bash
# Builds and runs a streaming-ring chain lab on the device (nvcc, sm_90): ring.cu (run 57) or,
# with RING=ringx, ringx.cu (run 58); extra arguments go to nvcc.
#   bash scripts/matvec_lab/run_ring.sh            (log in $OUT/ring.log)
#   RING=ringx bash scripts/matvec_lab/run_ring.sh (log in $OUT/ringx.log)
set -uo pipefail
OUT=${OUT:-/tmp/lab-out}
P=${RING:-ring}
mkdir -p "$OUT" /tmp/lab
nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -o /tmp/lab/$P scripts/matvec_lab/$P.cu $* > "$OUT/$P-build.log" 2>&1 || { tail -40 "$OUT/$P-build.log"; exit 1; }
grep -A2 "${P}_chain" "$OUT/$P-build.log" | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" | head -6
timeout 240 /tmp/lab/$P 2>&1 | tee "$OUT/$P.log"
