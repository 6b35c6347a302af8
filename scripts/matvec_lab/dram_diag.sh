#!/usr/bin/env bash
# Lab run 54 (device): every DRAM-side counter Nsight Compute exposes (dram__*, fbpa__*) for one
# gate+up launch (mvk_silu_1), one ffn_down launch (mvk_1) and the plain read (read_bandwidth), to
# see where the one-column matvecs lose DRAM efficiency (row hits, turnarounds, queueing).
set -u
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
B=target/device/muser; export MUSER_KERNEL_CACHE=$PWD/target/device/kernels
G=/tmp/g.gguf; $B synth llama-glimmer $G > /dev/null 2>&1
"$NCU" --query-metrics --chip gh100 2>/dev/null | grep -E "^(dram|fbpa)__" | cut -c1-160 > "${OUT:-/tmp}/dram-metrics.txt"
wc -l "${OUT:-/tmp}/dram-metrics.txt"
for spec in "mvk_silu_1:20" "mvk_1:41" "read_bandwidth:0"; do
  IFS=: read -r k skip <<< "$spec"
  echo "===== $k"
  timeout 150 env MUSER_CUDA_GRAPHS=0 "$NCU" --clock-control none --kernel-name "regex:^$k\$" --launch-skip "$skip" --launch-count 1 \
    --metrics "regex:^(dram|fbpa)__.*\.(sum|avg|pct_of_peak_sustained_elapsed|avg\.pct_of_peak_sustained_elapsed)$" \
    "$B" bench --backend cuda -m "$G" -p 0 -n 2 -r 1 2>&1 | grep -E "^\s+(dram|fbpa|gpu)__" | grep -v " 0$" | head -80
done
