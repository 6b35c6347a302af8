#!/usr/bin/env bash
# One H200 call for the CUDA backend (issue 4): synthesizes the small models on the device, runs
# `muser check --backend cuda` (every op against the CPU backend at the Muse Glimmer shapes, then
# whole-model parity of muse-tiny, muse-mid, llama-tiny, qwen3-tiny, the matvec timings and the
# dispatch audit) and, with GLIMMER=1, synthesizes muse-glimmer and times pp512 / tg128 (and tg64
# at DEPTH) on CUDA alone. Full logs go to $OUT; a short table is printed last.
#
# Usage (device tool, from the repository root, carrying target/release/muser):
#   GLIMMER=1 DEPTH=8192 bash scripts/device_cuda_check.sh
set -uo pipefail
BIN=${MUSER_BIN:-target/release/muser}
OUT=${OUT:-/tmp/muser-out}
MODELS=${MODELS:-/tmp/muser-models}
mkdir -p "$OUT" "$MODELS"

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

step() { # name timeout_s command...
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
    return $rc
}

for p in muse-tiny muse-mid llama-tiny qwen3-tiny; do
    "$BIN" synth "$p" "$MODELS/$p.gguf" > /dev/null || echo "synth $p failed"
done

if [ "${QUICK:-0}" = 1 ]; then
    step quick 60 "$BIN" check --backend cuda --quick
    tail -n 25 "$OUT/quick.log"
fi
step full 270 "$BIN" check --backend cuda --bench \
    --model "$MODELS/muse-tiny.gguf" --model "$MODELS/llama-tiny.gguf" --model "$MODELS/qwen3-tiny.gguf" \
    --model "$MODELS/muse-mid.gguf"

if [ "${NCU:-0}" = 1 ]; then
    # Hardware counters of one decode matvec (the ffn_gate case of --bench: Q4_K 19968 x 6656).
    NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    step ncu 120 "$NCU_BIN" --clock-control none --kernel-name regex:'^matvec_1$' --launch-skip 204 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis "$BIN" check --backend cuda --no-ops --bench
fi

if [ "${GLIMMER:-0}" = 1 ]; then
    t0=$SECONDS
    timeout 90 "$BIN" synth muse-glimmer "$MODELS/muse-glimmer.gguf" > "$OUT/synth.txt" 2>&1
    echo "synth muse-glimmer: $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    step speed 150 "$BIN" check --backend cuda --no-ops --speed "$MODELS/muse-glimmer.gguf" --depth "${DEPTH:-0}"
    if [ "${NCU_MMQ:-0}" = 1 ]; then
        # Hardware counters of one prefill matmul (an mmt_4 launch of pp512, layer ~6).
        NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        step ncu_mmq 150 "$NCU_BIN" --clock-control none --kernel-name regex:'^mmt_4$' --launch-skip 40 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section ComputeWorkloadAnalysis "$BIN" check --backend cuda --no-ops --speed "$MODELS/muse-glimmer.gguf"
    fi
fi

echo
echo "================ short table ================"
grep -E "^FAIL|^FAILED|panicked|^error" "$OUT"/*.log | head -40
grep -E "^\| |^summary|^all |never dispatched|greedy|^model |^speed " "$OUT"/full.log "$OUT"/speed.log 2>/dev/null | sed 's#^[^:]*/##'
grep -E "Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Warp Cycles" "$OUT"/ncu*.log 2>/dev/null | head -40
cat "$OUT/summary.txt"
