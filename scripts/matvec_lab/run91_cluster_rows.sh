#!/usr/bin/env bash
# Lab run 91: decode groups of 2-32 rows on the clustered attention (attn_rows_mma_fin8_128, MUSER_ATTN_CLUSTER_ROWS=32)
# against the split kernel + attn_rows_combine (default: clusters for one row only), re-measured after
# runs 60-89 (last measured 2026-12-01). Quick parity with invariance under the switch, then A/B/A/B. Carry target/side.
set -u; X=target/side/muser; export MUSER_KERNEL_CACHE=$PWD/target/side/kernels; M=/tmp/m; mkdir -p $M $OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$X synth llama-glimmer $M/g.gguf > $OUT/s1.log 2>&1; $X synth muse-tiny $M/t.gguf > $OUT/s2.log 2>&1
MUSER_ATTN_CLUSTER_ROWS=32 timeout 100 $X check --backend cuda --quick --invariance $M/t.gguf --invariance $M/g.gguf > $OUT/check.log 2>&1; echo "check rc=$? ok=$(grep -cE '^ok' $OUT/check.log) fail=$(grep -cE '^FAIL' $OUT/check.log)"; grep -E "^FAIL" $OUT/check.log | head -5
for r in 1 2; do for R in 1 32; do
 echo "round $r rows<=$R: $(MUSER_ATTN_CLUSTER_ROWS=$R timeout 80 $X bench --backend cuda -m $M/g.gguf -p 0 -n 128 -r 2 -s 2,8,32 2>&1 | tee $OUT/b$r$R.log | grep streams | awk -F'|' '{print $7 $8}' | tr '\n' ' ')"
done; done
