#!/usr/bin/env bash
# The CPU backend on the device machine's CPU (its many cores), side by side with llama.cpp's CPU
# build, in one call: synthesizes llama-1b (Q4_K_M), builds llama.cpp from the carried source
# (.llamacpp-src.tar.xz, scripts/pack_llamacpp.sh) without CUDA, then alternates
# `muser bench --backend cpu` with and without the K-quant repacking (MUSER_CPU_X16=0) and runs
# llama.cpp's llama-batched-bench / llama-bench on the same file. Logs in $OUT, a short table last.
#   MUSER_BIN=target/device/muser bash scripts/device_cpu_bench.sh   (carry target/device and
#   .llamacpp-src.tar.xz)
set -uo pipefail
BIN=${MUSER_BIN:-target/release/muser}
OUT=${OUT:-/tmp/muser-out}
T=${THREADS:-$(nproc)}
STREAMS=${STREAMS:-1,2,4,8,16,32}
mkdir -p "$OUT" /tmp/m
lscpu > "$OUT/lscpu.txt" 2>&1
grep -m1 "Model name" "$OUT/lscpu.txt"
( mkdir -p /tmp/llama && tar xJf .llamacpp-src.tar.xz -C /tmp/llama && cd /tmp/llama/llama.cpp &&
  cmake -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF &&
  cmake --build build-cpu -j "$(nproc)" --target llama-bench llama-batched-bench ) > "$OUT/llama-build.log" 2>&1 &
LB=$!
"$BIN" synth llama-1b /tmp/m/llama-1b.gguf > "$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; exit 1; }
M=/tmp/m/llama-1b.gguf
wait $LB; echo "llama.cpp build rc=$?"
L=/tmp/llama/llama.cpp/build-cpu/bin
for i in 1 2; do
  for v in 1 0; do
    MUSER_CPU_X16=$([ $v = 1 ] && echo q4_k,q5_k,q6_k || echo 0) timeout 200 "$BIN" bench -m $M --backend cpu --threads $T \
      -p 512 -n 32 -r 2 -s $STREAMS > "$OUT/muser-x16$v-$i.log" 2>&1
    echo "muser x16=$v run $i: $(grep -E 'pp512|tg32' "$OUT/muser-x16$v-$i.log" | awk -F'|' '{printf "%s %s |", $7, $8}')"
  done
  timeout 200 $L/llama-batched-bench -m $M -t $T -npp 4 -ntg 32 -npl $STREAMS > "$OUT/llama-batched-$i.log" 2>&1
  echo "llama.cpp batched run $i: $(grep -E '^\|  *4 ' "$OUT/llama-batched-$i.log" | awk -F'|' '{printf "B=%s %s |", $4, $9}')"
done
timeout 200 $L/llama-bench -m $M -t $T -p 512 -n 32 -r 2 > "$OUT/llama-bench.log" 2>&1
grep -E "pp512|tg32" "$OUT/llama-bench.log"
