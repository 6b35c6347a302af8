#!/usr/bin/env bash
# Lab run 84 (dropped): the attention gate beside the chain (`gate-side.patch`, apply to 3488b7a).
# One device call, repository root, carrying target/sideB: the patched build stripped into
# target/sideB/muser with its kernel cache, the step-trace builds included
# (`MUSER_KERNEL_CACHE=$PWD/target/sideB/kernels target/sideB/muser kernels`, then again with
# MUSER_CUDA_STEP_TRACE=1). Synthesizes muse-glimmer, compares `muser logits --decode` of 48 tokens
# byte for byte between the switch off (A) and each setting, runs two rounds of tg128 per setting,
# then traces one step with the switch off and with the gate launched serially (E).
set -uo pipefail
OUT=${OUT:-/tmp/muser-out}
mkdir -p "$OUT"
M=/tmp/m; mkdir -p $M; B=target/sideB; export MUSER_KERNEL_CACHE=$PWD/$B/kernels
$B/muser synth muse-glimmer $M/u.gguf > $OUT/synth.log 2>&1
toks=$(python3 -c "import random; r = random.Random(7); print(','.join(str(r.randrange(1000)) for _ in range(48)))")
V=("A:" "B:MUSER_CUDA_GATE_SIDE=1" "E:MUSER_CUDA_GATE_SIDE=1 MUSER_CUDA_GATE_SIDE_SERIAL=1 MUSER_CUDA_GATE_SIDE_PER_SM=4" "F:MUSER_CUDA_GATE_SIDE=1 MUSER_CUDA_GATE_SIDE_LATE_JOIN=1" "G:MUSER_CUDA_GATE_SIDE=1 MUSER_CUDA_GATE_SIDE_PER_SM=4" "H:MUSER_CUDA_GATE_SIDE=1 MUSER_CUDA_GATE_SIDE_PER_SM=4 MUSER_CUDA_GATE_SIDE_LATE_JOIN=1")
for v in "${V[@]}"; do n=${v%%:*}; e=${v#*:}; env $e timeout 60 $B/muser logits --backend cuda -m $M/u.gguf --tokens "$toks" --decode -o $M/l-$n.npy > $OUT/logits-$n.log 2>&1; cmp -s $M/l-A.npy $M/l-$n.npy && echo "bits $n identical" || echo "bits $n DIFFER"; done
for r in 1 2; do for v in "${V[@]}"; do n=${v%%:*}; e=${v#*:}; env $e timeout 60 $B/muser bench --backend cuda -m $M/u.gguf -p 0 -n 128 -r 2 > $OUT/tg-$r-$n.log 2>&1; echo "tg $r $n $(grep tg128 $OUT/tg-$r-$n.log | awk -F'|' '{print $8}')"; done; done
for v in "A:" "E:MUSER_CUDA_GATE_SIDE=1 MUSER_CUDA_GATE_SIDE_SERIAL=1 MUSER_CUDA_GATE_SIDE_PER_SM=4"; do n=${v%%:*}; e=${v#*:}; env $e MUSER_CUDA_STEP_TRACE=1 timeout 90 $B/muser bench --backend cuda -m $M/u.gguf -p 0 -n 32 -r 1 > $OUT/trace-$n.log 2>&1; echo "== trace $n: $(grep '^step trace' $OUT/trace-$n.log)"; grep -E "^\| (mvk_1|attn_rows|qkv_rows)" $OUT/trace-$n.log | head -12; done
