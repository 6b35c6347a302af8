#!/usr/bin/env bash
# Lab run 89 in one short device call (when little device time is left): llama-glimmer logits
# from 96 decode steps with the LM head chunked at every width against the single launch, byte
# for byte; the quick parity command with invariance, chunked; 8 and 32 streams, A (single
# launch) then B (MUSER_CUDA_LM_CHUNKS=4), two rounds. Carry target/side (binary + kernel cache).
set -u; X=target/side/muser; export MUSER_KERNEL_CACHE=$PWD/target/side/kernels; M=/tmp/m; mkdir -p $M $OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$X synth muse-tiny $M/t.gguf > $OUT/s1.log 2>&1; $X synth llama-glimmer $M/g.gguf > $OUT/s2.log 2>&1
T=$(python3 -c "import random; r=random.Random(83); print(','.join(str(r.randrange(1000)) for _ in range(96)))")
C="MUSER_CUDA_LM_CHUNKS=4 MUSER_CUDA_LM_CHUNK_MIN=1"
$X logits --backend cuda -m $M/g.gguf --tokens $T -o $M/a.npy --decode > $OUT/la.log 2>&1
env $C $X logits --backend cuda -m $M/g.gguf --tokens $T -o $M/b.npy --decode > $OUT/lb.log 2>&1
cmp $M/a.npy $M/b.npy && echo "bits llama-glimmer decode 96: SAME ($(stat -c %s $M/b.npy) bytes)" || echo "bits: DIFFER"
env $C timeout 200 $X check --backend cuda --quick --model $M/t.gguf --invariance $M/t.gguf --invariance $M/g.gguf > $OUT/check.log 2>&1; echo "check rc=$? ok=$(grep -cE '^ok' $OUT/check.log) fail=$(grep -cE '^FAIL' $OUT/check.log)"
grep -E '^FAIL|^all |^invariance|never dispatched|chunks' $OUT/check.log | head -16
for r in 1 2; do for s in A B; do E=""; [ $s = B ] && E="MUSER_CUDA_LM_CHUNKS=4"; env $E timeout 100 $X bench --backend cuda -m $M/g.gguf -p 0 -n 128 -r 2 -s 8,32 > $OUT/b$r$s.log 2>&1; echo "round $r $s:"; grep -E 'streams' $OUT/b$r$s.log; done; done
