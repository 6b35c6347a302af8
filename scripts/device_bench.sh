#!/usr/bin/env bash
# One H200 call that checks and benchmarks Muser's CUDA backend (issues 4 and 5):
#   1. synthesizes muse-glimmer (16.75 GB) and llama-glimmer on the device (never carried),
#   2. runs the parity command (`muser check --backend cuda`, op by op at the Glimmer shapes,
#      and whole-model parity of the small presets against the CPU backend),
#   3. runs `muser bench --backend cuda` (pp512, tg128 at depth 0 and 8192) on both models,
#   4. optionally (LLAMA=1, with .llamacpp-src.tar.xz from scripts/pack_llamacpp.sh carried) builds llama.cpp with CUDA and
#      runs llama-bench on llama-glimmer in the same call.
# Full logs go to $OUT; a short table is printed last.
#
# Usage (device tool, repository root, carrying target/release/muser):
#   bash scripts/device_bench.sh            # QUICK=1 for the quick op check only
set -uo pipefail
BIN=${MUSER_BIN:-target/release/muser}
OUT=${OUT:-/tmp/muser-out}
MODELS=${MODELS:-/tmp/muser-models}
REPS=${REPS:-3}
mkdir -p "$OUT" "$MODELS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${LLAMA:-0}" = 1 ] && [ -f .llamacpp-src.tar.xz ]; then
    ( mkdir -p /tmp/llama && tar xJf .llamacpp-src.tar.xz -C /tmp/llama && cd /tmp/llama/llama.cpp &&
      cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF &&
      cmake --build build -j 16 --target llama-bench ) > "$OUT/llama-build.log" 2>&1 &
    LLAMA_PID=$!
fi

step() { # name limit_s command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
}

for p in muse-glimmer llama-glimmer muse-tiny muse-mid; do
    step "synth-$p" 120 "$BIN" synth "$p" "$MODELS/$p.gguf"
done
if [ "${QUICK:-0}" = 1 ]; then
    step check 120 "$BIN" check --backend cuda --quick
else
    step check 200 "$BIN" check --backend cuda --model "$MODELS/muse-tiny.gguf" --model "$MODELS/muse-mid.gguf"
fi
for m in muse-glimmer llama-glimmer; do
    step "bench-$m" 150 "$BIN" bench --backend cuda -m "$MODELS/$m.gguf" -p 512 -n 128 -r "$REPS"
    step "bench-$m-d8192" 150 "$BIN" bench --backend cuda -m "$MODELS/$m.gguf" -p 0 -n 128 -d 8192 -r 2
done

if [ -n "${LLAMA_PID:-}" ]; then
    wait "$LLAMA_PID"
    LB=/tmp/llama/llama.cpp/build/bin/llama-bench
    step llama-bench 200 "$LB" -m "$MODELS/llama-glimmer.gguf" -p 512 -n 128 -fa 1 -r "$REPS" -d 0,8192
fi

echo
echo "================ short table ================"
grep -hE "^(ok|FAIL)" "$OUT/check.log" | awk '{print $1}' | sort | uniq -c
grep -hE "never dispatched|^all |failed" "$OUT/check.log" | head -20
grep -h "^| " "$OUT"/bench-*.log | sort -u
[ -f "$OUT/llama-bench.log" ] && grep "^| " "$OUT/llama-bench.log"
cat "$OUT/summary.txt"
