#!/usr/bin/env bash
# Lab run 82 (one device call, ~3 minutes): qkv_rows from registers (MUSER_CUDA_QKV_REGS=1, the
# default) against through memory (=0), and (BIN_B, a second build with attn-gate-early.patch
# applied) the attention's gate values loaded right after its wait. Carry the stripped release
# binaries and their kernel cache (one folder serves both: its files are named by their source's
# hash), built with the step trace too:
#   objcopy --strip-debug target/release/muser target/side/muser          (and muser-b)
#   MUSER_KERNEL_CACHE=$PWD/target/side/kernels target/side/muser kernels    (NVRTC env as usual)
#   MUSER_CUDA_STEP_TRACE=1 MUSER_KERNEL_CACHE=$PWD/target/side/kernels target/side/muser kernels
# Runs the quick parity command with B (its "qkv_rows regs == memory" rows compare both paths of
# qkv_rows bit for bit: GPT-J and NeoX pairs, with and without QK norms, partial rotations, a
# NoPE layer), then tg128 on muse-glimmer and llama-glimmer for each setting, alternated twice,
# then the step trace of one muse-glimmer step with each. Logs in $OUT.
set -uo pipefail
A=${MUSER_BIN:-target/side/muser}
B=${BIN_B:-target/side/muser-b}
export MUSER_KERNEL_CACHE=$PWD/${KERNELS:-target/side/kernels}
OUT=${OUT:-/tmp/muser-out}
M=/tmp/qkv-models
mkdir -p "$M" "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$A" synth muse-tiny "$M/t.gguf" > "$OUT/synth.log" 2>&1
( "$A" synth llama-glimmer "$M/l.gguf" && "$A" synth muse-glimmer "$M/g.gguf" ) >> "$OUT/synth.log" 2>&1 &
SYNTH=$!
timeout 220 "$B" check --backend cuda --quick --model "$M/t.gguf" --invariance "$M/t.gguf" > "$OUT/check.log" 2>&1
echo "check rc=$?: $(grep -c '^ok' "$OUT/check.log") ok, $(grep -c '^FAIL' "$OUT/check.log") FAIL"
grep -E "^FAIL|panicked" "$OUT/check.log" | head -12
grep -E "qkv_rows regs" "$OUT/check.log" | cut -c1-110
grep -E "^invariance|never dispatched" "$OUT/check.log" | head -4
wait $SYNTH
echo "synth rc=$?"
# Settings: name, binary, variables.
SETS=("base|$A|MUSER_CUDA_QKV_REGS=0" "regs|$A|MUSER_CUDA_QKV_REGS=1" "regs+gate|$B|MUSER_CUDA_QKV_REGS=1")
for r in 1 2; do
    for s in "${SETS[@]}"; do
        IFS='|' read -r name bin vars <<< "$s"
        for m in g l; do
            env $vars timeout 90 "$bin" bench --backend cuda -m "$M/$m.gguf" -p 0 -n 128 -r 2 > "$OUT/bench.log" 2>&1
            echo "$( [ $m = g ] && echo muse-glimmer || echo llama-glimmer) $name round $r:" \
                "$(grep -h '| .*CUDA' "$OUT/bench.log" | tail -1 | cut -d'|' -f7-)"
        done
    done
done
for s in "${SETS[@]}"; do
    IFS='|' read -r name bin vars <<< "$s"
    env $vars MUSER_CUDA_STEP_TRACE=1 timeout 90 "$bin" bench --backend cuda -m "$M/g.gguf" -p 0 -n 32 -r 1 \
        > "$OUT/trace-$name.log" 2>&1
    echo "== muse-glimmer step trace, $name"
    grep -E "^step trace|qkv_rows|attn_rows" "$OUT/trace-$name.log" | head -4
done
rm -f "$OUT/bench.log" "$OUT/synth.log"
