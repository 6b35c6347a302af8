#!/usr/bin/env bash
# Builds and runs the persistent-chain lab on the device (nvcc, sm_90):
#   bash scripts/matvec_lab/run_chain.sh   (log in $OUT/chain.log)
set -uo pipefail
OUT=${OUT:-/tmp/lab-out}
mkdir -p "$OUT" /tmp/lab
nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -o /tmp/lab/chain scripts/matvec_lab/chain.cu $* > "$OUT/chain-build.log" 2>&1 || { tail -40 "$OUT/chain-build.log"; exit 1; }
grep -A2 "chain_persist" "$OUT/chain-build.log" | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" | head -4
timeout 150 /tmp/lab/chain 2>&1 | tee "$OUT/chain.log"
