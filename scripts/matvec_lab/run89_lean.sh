#!/usr/bin/env bash
# Lab run 89 (two chunks, in steps whose logits are read; off until this passes) in one short
# device call: llama-glimmer logits from 96 decode steps (replayed graphs) with every LM head in
# two chunks (one column included, MUSER_CUDA_LM_CHUNK_MIN=1) against the single launch, byte for
# byte; the quick parity command with invariance in two chunks (groups replayed chunked); 8 and
# 32 streams, one launch then two chunks, with the logits read and with --argmax (ROUNDS rounds, default 2). Carry target/side (binary + kernel
# cache). Full logs under $OUT.
set -u; X=target/side/muser; export MUSER_KERNEL_CACHE=$PWD/target/side/kernels; M=/tmp/m; mkdir -p $M $OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$X synth muse-tiny $M/t.gguf > $OUT/s1.log 2>&1; $X synth llama-glimmer $M/g.gguf > $OUT/s2.log 2>&1
T=$(python3 -c "import random; r=random.Random(83); print(','.join(str(r.randrange(1000)) for _ in range(96)))")
MUSER_CUDA_LM_CHUNKS=1 $X logits --backend cuda -m $M/g.gguf --tokens $T -o $M/a.npy --decode > $OUT/la.log 2>&1
MUSER_CUDA_LM_CHUNKS=2 MUSER_CUDA_LM_CHUNK_MIN=1 $X logits --backend cuda -m $M/g.gguf --tokens $T -o $M/b.npy --decode > $OUT/lb.log 2>&1
cmp $M/a.npy $M/b.npy && echo "bits llama-glimmer decode 96, one column chunked: SAME ($(stat -c %s $M/b.npy) bytes)" || echo "bits: DIFFER"
MUSER_CUDA_LM_CHUNKS=2 timeout 150 $X check --backend cuda --quick --invariance $M/t.gguf --invariance $M/g.gguf > $OUT/check.log 2>&1; echo "check rc=$? ok=$(grep -cE '^ok' $OUT/check.log) fail=$(grep -cE '^FAIL' $OUT/check.log)"
grep -E '^FAIL|^all |never dispatched|chunks|one launch' $OUT/check.log | head -16
for r in $(seq ${ROUNDS:-2}); do for K in 1 2; do for A in "" --argmax; do
    echo "round $r, chunks $K ${A:-(logits read)}: $(MUSER_CUDA_LM_CHUNKS=$K timeout 60 $X bench --backend cuda -m $M/g.gguf -p 0 -n 128 -r 2 -s 8,32 $A 2>&1 | tee $OUT/b$r$K$A.log | grep streams | awk -F'|' '{print $7 $8}' | tr '\n' ' ')"
done; done; done
