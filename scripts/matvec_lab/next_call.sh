#!/usr/bin/env bash
# The lab's pending measurements in one device call (~8 minutes), each with its own logs under
# $OUT; carry target/device. Prepared 2026-12-05 while no device was lent:
#   1. run 79's third variant: the fused FFN on 528 plain blocks meeting at counts in global
#      memory (`RING=ffnx`, nvcc on the device, ~1 minute);
#   2. run 80: the 32-column tiles without their arithmetic (level 1), without their sub-block
#      scales (level 2) and with half of each activation copy (level 3), beside the same lab
#      binary unchanged (level 0), with the step trace and the L2/DRAM traffic at 32 streams
#      (README run 80; the binary and its kernels are built here first, as it says).
# Either part alone: PARTS=ffnx or PARTS=run80.
set -uo pipefail
OUT=${OUT:-/tmp/lab-out}
mkdir -p "$OUT"
for part in ${PARTS:-ffnx run80}; do
    case $part in
    ffnx)
        OUT=$OUT/ffnx RING=ffnx bash scripts/matvec_lab/run_ring.sh > "$OUT/ffnx-stdout.txt" 2>&1
        echo "== run 79, third variant (last lines of $OUT/ffnx/ffnx.log)"
        tail -25 "$OUT/ffnx-stdout.txt" ;;
    run80)
        [ -x target/device/muser-lab ] || { echo "run80: target/device/muser-lab missing (README run 80)"; continue; }
        OUT=$OUT/run80 MUSER_BIN=target/device/muser-lab JOB=ab \
            AB="-;MUSER_LAB_DEFINES=-DMMW_ABLATE=1;MUSER_LAB_DEFINES=-DMMW_ABLATE=2;MUSER_LAB_DEFINES=-DMMW_ABLATE=3" \
            STREAMS=1,8,32 TRACE="1 2 3 4" TRACE_STREAMS=32 SPEED=0 \
            TRAFFIC_KERNELS="mmw_silu_pair_4:20:32 mmw_split_4:23:32" \
            bash scripts/device_bench.sh > "$OUT/run80-stdout.txt" 2>&1
        echo "== run 80 (short table of $OUT/run80)"
        sed -n '/short table/,$p' "$OUT/run80-stdout.txt" | grep -v "^$" | head -150 ;;
    esac
done
