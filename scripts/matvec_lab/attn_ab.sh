#!/usr/bin/env bash
# Lab run 77's device call (README.md of this folder): decode attention builds side by side on
# llama-glimmer at long context, one device call, run from the repository root:
#   BINS="target/device/muser-old target/device/muser-k target/device/muser-kr" \
#       AB="MUSER_ATTN_MMA_WARPS=4" bash scripts/matvec_lab/attn_ab.sh
# BINS: the binaries (built here from the patches, their kernels compiled into the carried cache
# KERNELS); the first is the reference. CHECK=1 (default): the quick parity command on each, with
# batch invariance on muse-tiny and llama-glimmer for all but the reference, and the NMSE lines
# that differ from the reference's (none when the bits are the same). TESTS: `bench` arguments,
# ';' between tests; each test runs every binary in turn, then the last one again with each
# setting of AB (';' between settings, each "VAR=value ..."). NCU: see below. Every step ends by
# BUDGET seconds.
set -uo pipefail
OUT=${OUT:-/tmp/attn-ab}
mkdir -p "$OUT"
export MUSER_KERNEL_CACHE=$PWD/${KERNELS:-target/device/kernels}
read -ra B <<< "${BINS:?BINS: the binaries to compare, the reference first}"
G=/tmp/llama-glimmer.gguf T=/tmp/muse-tiny.gguf
exec > >(tee "$OUT/0-stdout.txt") 2>&1
DEADLINE=$((SECONDS + ${BUDGET:-560}))
step() { # name limit_s command...
    local name=$1 lim=$2 t=$SECONDS
    shift 2
    [ "$lim" -gt $((DEADLINE - SECONDS)) ] && lim=$((DEADLINE - SECONDS))
    if [ "$lim" -lt 5 ]; then echo "$name skipped (budget)"; return; fi
    timeout "$lim" "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? $((SECONDS - t)) s"
}
step synth-g 150 "${B[0]}" synth llama-glimmer "$G"
step synth-t 30 "${B[0]}" synth muse-tiny "$T"
if [ "${CHECK:-1}" = 1 ]; then
    for b in "${B[@]}"; do
        inv=(--invariance "$T" --invariance "$G")
        [ "$b" = "${B[0]}" ] && inv=()
        step "check-$(basename "$b")" 200 "$b" check --backend cuda --quick --model "$T" "${inv[@]}"
    done
fi
IFS=';' read -ra TS <<< "${TESTS:--p 0 -n 32 -r 1 -d 4096 -s 8,32;-p 0 -n 32 -r 1 -d 2048 -s 8,32;-p 0 -n 64 -r 2 -d 8192;-p 512 -n 128 -r 2 -s 1,8}"
IFS=';' read -ra SETS <<< "${AB:-}"
i=0
for t in "${TS[@]}"; do
    i=$((i + 1))
    for b in "${B[@]}"; do step "t$i-$(basename "$b")" 150 "$b" bench --backend cuda -m "$G" $t; done
    j=0
    for set in "${SETS[@]}"; do
        j=$((j + 1))
        step "t$i-$(basename "${B[-1]}")-ab$j" 150 env $set "${B[-1]}" bench --backend cuda -m "$G" $t
    done
done
# NCU="KERNEL:STREAMS:DEPTH" (e.g. attn_rows_mma_128:8:2048): Nsight Compute on one decode launch of
# that kernel for each build (as device_bench.sh JOB=ncu), its main counters in the table.
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "${NCU:-}" ] && [ -n "$NCU_BIN" ]; then
    IFS=: read -r nk ns nd <<< "$NCU"
    for b in "${B[@]}"; do
        step "ncu-$(basename "$b")" 200 env MUSER_CUDA_GRAPHS=0 MUSER_PROFILE_DECODE=1 "$NCU_BIN" \
            --profile-from-start off --clock-control none --kernel-name "regex:^$nk\$" --launch-skip 60 \
            --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --section MemoryWorkloadAnalysis \
            "$b" bench --backend cuda -m "$G" -p 0 -n 4 -r 1 -s "$ns" -d "$nd"
    done
fi
echo
echo "================ short table ================"
for f in "$OUT"/check-*.log; do
    [ -f "$f" ] || continue
    echo "$(basename "$f" .log): $(grep -c '^ok' "$f") ok, $(grep -c '^FAIL' "$f") FAIL;" \
        "NMSE lines unlike the reference's: $(diff <(grep '^ok' "$OUT/check-$(basename "${B[0]}").log" | sort) \
        <(grep '^ok' "$f" | sort) | grep -c '^>')"
    grep -hE "^FAIL|^invariance|never dispatched|panicked" "$f" | head -4
done
[ -n "${AB:-}" ] && echo "ab settings: $AB"
for f in "$OUT"/t*.log; do grep -h "^| .*CUDA" "$f" | cut -d'|' -f7-8,11 | sed "s|^|$(basename "$f" .log):|"; done
for f in "$OUT"/ncu-*.log; do
    [ -f "$f" ] || continue
    echo "$(basename "$f" .log):"
    grep -E "^\s+(Duration|DRAM Throughput|Registers Per Thread|Achieved Active Warps Per SM|Issue Slots Busy|Warp Cycles Per Issued Instruction|Dynamic Shared Memory Per Block)" "$f" | sed 's/  */ /g'
    grep -o "total of [0-9]* excessive sectors ([0-9]*% of the" "$f" | head -1
done
