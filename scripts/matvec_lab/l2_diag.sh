set -u
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
B=target/device/muser; export MUSER_KERNEL_CACHE=$PWD/target/device/kernels
G=/tmp/g.gguf; $B synth llama-glimmer $G > /dev/null 2>&1
M=lts__t_sectors_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcnode_gpc.sum,dram__bytes_read.sum,lts__t_sector_op_read_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__d_sectors_fill_sysmem.sum,lts__d_sectors_fill_device.sum,gpu__time_duration.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__d_sectors.avg.pct_of_peak_sustained_elapsed,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__xbar2lts_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__lts2xbar_cycles_active.avg.pct_of_peak_sustained_elapsed
for spec in "mvk_silu_1:20" "mvk_1:41" "read_bandwidth:0"; do
  IFS=: read -r k skip <<< "$spec"
  echo "===== $k"
  timeout 120 env MUSER_CUDA_GRAPHS=0 $NCU --clock-control none --kernel-name "regex:^$k\$" --launch-skip $skip --launch-count 1 \
    --metrics $M --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    $B bench --backend cuda -m $G -p 0 -n 2 -r 1 2>&1 | grep -vE "^==PROF==|^\| |^$" | grep -E "^\s+[a-zA-Z]" | grep -vE "OPT|INF|----" | head -60
done
