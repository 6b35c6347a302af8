#!/usr/bin/env bash
# The lab's pending measurements for issue 6's 32-stream groups in one device call (~8-9
# minutes, within the 10-minute limit: BUDGET seconds, 540 by default), logs under $OUT. Carry
# target/device with the lab binary `muser-lab` (mmw-nomath.patch, then mmw-multicast.patch) and
# its kernels at every level, built here as README runs 80 and 81 say. Prepared 2026-12-05 while
# no device was lent.
#   run 80: mmw_* without their arithmetic (level 1), without their sub-block scales (level 2),
#           with half of each activation copy (level 3), beside the same binary unchanged (level 0);
#   run 81: gate+up's activation multicast to each gate/up pair (MUSER_CUDA_MMW_MC=1), first a
#           smoke run (a hang costs 60 s, and the setting is then dropped), then batch invariance
#           on llama-glimmer (groups of 1-32 against solo, bit for bit).
# Each setting: aggregate tg64 at 1, 8 and 32 streams; levels 0, 1, 3 and the multicast also the
# step trace at 32 streams and Nsight Compute's L2/DRAM traffic of one gate+up launch.
# (`RING=ffnx bash scripts/matvec_lab/run_ring.sh`, run 79's third variant, is a call of its own.)
set -uo pipefail
BIN=${MUSER_BIN:-target/device/muser-lab}
[ -d target/device/kernels ] && export MUSER_KERNEL_CACHE="$PWD/target/device/kernels"
OUT=${OUT:-/tmp/lab-out}
G=${MODELS:-/tmp/muser-models}/llama-glimmer.gguf
mkdir -p "$OUT" "$(dirname "$G")"
DEADLINE=$((SECONDS + ${BUDGET:-540}))
step() { # name limit_s command...
    local name=$1 limit=$2 left
    shift 2
    left=$((DEADLINE - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then echo "$name skipped (budget)" | tee -a "$OUT/summary.txt"; return 9; fi
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
    return $rc
}
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
L1="MUSER_LAB_DEFINES=-DMMW_ABLATE=1" L2="MUSER_LAB_DEFINES=-DMMW_ABLATE=2" L3="MUSER_LAB_DEFINES=-DMMW_ABLATE=3"
MC="MUSER_CUDA_MMW_MC=1"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
step synth 90 "$BIN" synth llama-glimmer "$G"

# Run 81 first: its smoke run and bits decide whether the multicast setting runs below.
SETS=("l0:" "l1:$L1" "l2:$L2" "l3:$L3")
# Timed only if it neither hangs nor changes a bit.
if step mc-smoke 60 env $MC "$BIN" bench --backend cuda -m "$G" -p 0 -n 8 -r 1 -s 32 &&
    step mc-bits 150 env $MC "$BIN" check --backend cuda --no-ops --invariance "$G" &&
    ! grep -qE "^FAIL|panicked" "$OUT/mc-bits.log"; then
    SETS+=("mc:$MC")
fi
# tg64 at 1, 8, 32 streams, each setting, then level 0 again (the call's drift).
for s in "${SETS[@]}" "l0b:"; do
    step "bench-${s%%:*}" 75 env ${s#*:} "$BIN" bench --backend cuda -m "$G" -p 0 -n 64 -r 2 -s 1,8,32
done
# The step trace at 32 streams.
for s in "${SETS[@]}"; do
    case ${s%%:*} in l2) continue ;; esac
    step "trace-${s%%:*}" 60 env ${s#*:} MUSER_CUDA_STEP_TRACE=1 "$BIN" bench --backend cuda -m "$G" -p 0 -n 32 -r 1 -s 32
done
# One gate+up launch's traffic at 32 streams (the 21st of the run).
for s in "${SETS[@]}"; do
    case ${s%%:*} in l2) continue ;; mc) k=mmwc_silu_pair_4 ;; *) k=mmw_silu_pair_4 ;; esac
    step "traffic-${s%%:*}" 60 env MUSER_CUDA_GRAPHS=0 ${s#*:} "$NCU_BIN" --clock-control none \
        --kernel-name "regex:^$k\$" --launch-skip 20 --launch-count 1 --metrics \
        gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \
        "$BIN" bench --backend cuda -m "$G" -p 0 -n 2 -r 1 -s 32
done

echo
echo "================ short table ================"
grep -hE "^(ok|FAIL|invariance)|panicked|rror" "$OUT/mc-bits.log" 2>/dev/null | head -12
for s in "${SETS[@]}" "l0b:"; do
    echo "== ${s%%:*} (${s#*:})"
    grep -h "^| .*CUDA" "$OUT/bench-${s%%:*}.log" 2>/dev/null
done
for s in "${SETS[@]}"; do
    [ -f "$OUT/trace-${s%%:*}.log" ] || continue
    echo "== trace ${s%%:*}"
    sed -n '/^step trace/,/^middle/p' "$OUT/trace-${s%%:*}.log" | grep -v "^middle" | head -14
done
for s in "${SETS[@]}"; do
    [ -f "$OUT/traffic-${s%%:*}.log" ] || continue
    echo "== traffic ${s%%:*}"
    grep -E "duration|bytes_read|sectors|throughput" "$OUT/traffic-${s%%:*}.log" | sed 's/^ */  /'
done
cat "$OUT/summary.txt"
# The device tool brings back at most 8 files of $OUT: every log goes into one archive.
(cd "$OUT" && tar czf /tmp/lab-logs.tgz --exclude=lab-logs.tgz . && find . -maxdepth 1 -type f \
    ! -name summary.txt -delete && mv /tmp/lab-logs.tgz lab-logs.tgz)
