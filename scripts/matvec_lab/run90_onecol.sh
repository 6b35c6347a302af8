#!/usr/bin/env bash
# Lab run 90: the LM head in two chunks at one column too (MUSER_CUDA_LM_CHUNK_MIN=1), one stream's
# tg128 with the logits read, against the default (chunks from two columns on), alternated A/B/A/B
# on llama-glimmer and muse-glimmer in one call. The bits of one-column chunks in replayed steps
# were compared in run 89's last check (run89_lean.sh: identical). Carry target/side.
set -u; X=target/side/muser; export MUSER_KERNEL_CACHE=$PWD/target/side/kernels; M=/tmp/m; mkdir -p $M $OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$X synth llama-glimmer $M/g.gguf > $OUT/s1.log 2>&1; $X synth muse-glimmer $M/u.gguf > $OUT/s2.log 2>&1
for r in 1 2; do for m in g u; do for E in "MUSER_CUDA_LM_CHUNK_MIN=2" "MUSER_CUDA_LM_CHUNK_MIN=1"; do
    echo "round $r $m $E: $(env $E timeout 60 $X bench --backend cuda -m $M/$m.gguf -p 0 -n 128 -r 3 2>&1 | tee $OUT/b$r$m${E##*=}.log | grep tg128 | awk -F'|' '{print $8 $11}')"
done; done; done
