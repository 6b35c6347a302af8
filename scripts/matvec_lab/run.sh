#!/usr/bin/env bash
# Builds and runs the matvec lab on the device (nvcc, sm_90): bash scripts/matvec_lab/run.sh
set -uo pipefail
OUT=${OUT:-/tmp/lab-out}
mkdir -p "$OUT" /tmp/lab
K=crates/muser-cuda/kernels
cp $K/common.cuh $K/matvec.cu /tmp/lab/
sed 's/extern "C" __global__/__global__/' scripts/matvec_lab/matvec_v6.cu > /tmp/lab/v6_ns.cu
nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -I/tmp/lab -o /tmp/lab/lab scripts/matvec_lab/lab.cu > "$OUT/lab-build.log" 2>&1 || { tail -40 "$OUT/lab-build.log"; exit 1; }
grep -A1 "lab_mv\|matvec_1\|silu_1" "$OUT/lab-build.log" | grep -o "Used [0-9]* registers.*" | head -20
/tmp/lab/lab 2>&1 | tee "$OUT/lab.log"
