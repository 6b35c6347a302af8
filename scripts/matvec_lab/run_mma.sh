#!/usr/bin/env bash
# One device call for issue 6 (run 4 of the lab): builds lab_mma.cu with nvcc while the muser
# binary (MUSER_BIN, carried) synthesizes llama-glimmer and muse-tiny, runs the lab (bits of
# matvec_mma / matvec_silu_mma against matvec_1 per column, timings against matvec_cols), and
# only when every bit matches: the quick parity check with batch invariance on both models and
# `muser bench -s 1,8,32`. LAB_ONLY=1: the lab alone. Logs in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/mma-out}
B=${MUSER_BIN:-target/device/muser-mma}
mkdir -p "$OUT" /tmp/lab
K=crates/muser-cuda/kernels
cp $K/common.cuh $K/matvec.cu /tmp/lab/
T0=$SECONDS
( nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v -I/tmp/lab -o /tmp/lab/lab_mma scripts/matvec_lab/lab_mma.cu \
    > "$OUT/lab-build.log" 2>&1; echo "nvcc rc=$?" >> "$OUT/lab-build.log" ) &
NV=$!
SY=
[ "${LAB_ONLY:-0}" = 1 ] || { ( "$B" synth llama-glimmer /tmp/g.gguf && "$B" synth muse-tiny /tmp/t.gguf ) > "$OUT/synth.log" 2>&1 & SY=$!; }
wait $NV
echo "nvcc done at $((SECONDS - T0)) s"
grep -E "error|nvcc rc" "$OUT/lab-build.log" | head -20
grep -A1 "_mma\|matvec_cols\|silu_cols" "$OUT/lab-build.log" | grep -o "Function properties for [a-z_0-9]*\|Used [0-9]* registers.*\|[0-9]* bytes spill stores" | paste - - - 2>/dev/null | head
timeout 70 /tmp/lab/lab_mma 2>&1 | tee "$OUT/lab.log"
LAB=${PIPESTATUS[0]}
echo "lab rc=$LAB at $((SECONDS - T0)) s"
[ -z "$SY" ] && exit "$LAB"
wait $SY
echo "synth done at $((SECONDS - T0)) s"
if [ "$LAB" != 0 ]; then echo "lab failed: no muser runs"; exit 1; fi
timeout 110 "$B" check --backend cuda --quick --invariance /tmp/t.gguf --invariance /tmp/g.gguf > "$OUT/check.log" 2>&1
echo "check rc=$? at $((SECONDS - T0)) s"
grep -iE "FAIL|invarian|error" "$OUT/check.log" | head -12
grep "never dispatched" "$OUT/check.log"
tail -12 "$OUT/check.log"
timeout 60 "$B" bench --backend cuda -m /tmp/g.gguf -p 0 -n 64 -r 2 -s 1,8,32 > "$OUT/bench.log" 2>&1
echo "bench rc=$? at $((SECONDS - T0)) s"
grep -E "streams|^\| (model|---)" "$OUT/bench.log" | head -12
if [ $((SECONDS - T0)) -lt 190 ]; then
    MUSER_CUDA_MMA=0 timeout 40 "$B" bench --backend cuda -m /tmp/g.gguf -p 0 -n 64 -r 2 -s 8,32 > "$OUT/bench-dp4a.log" 2>&1
    echo "bench with MUSER_CUDA_MMA=0 rc=$? at $((SECONDS - T0)) s"
    grep -E "streams" "$OUT/bench-dp4a.log" | head -6
fi
