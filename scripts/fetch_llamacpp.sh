#!/usr/bin/env bash
# Fetches llama.cpp's source, the comparator (SPEC section 7): PyPI's llama-cpp-python 0.3.36
# sdist, whose vendor/llama.cpp is commit 0c1e5709 of 2026-10-01. Usage:
#   scripts/fetch_llamacpp.sh DIR          # extracts into DIR, prints DIR/.../vendor/llama.cpp
#   scripts/fetch_llamacpp.sh DIR build    # also builds llama-quantize and llama-perplexity (CPU)
# Never committed: DIR should be git-ignored (target/ is).
set -euo pipefail
dir=$1
mkdir -p "$dir"
src="$dir/llama_cpp_python-0.3.36/vendor/llama.cpp"
if [ ! -d "$src" ]; then
    python3 -m pip install -q scikit-build-core cmake ninja >&2
    (cd "$dir" && python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
        llama-cpp-python==0.3.36 >&2 && tar xzf llama_cpp_python-0.3.36.tar.gz)
fi
if [ "${2:-}" = build ] && [ ! -x "$src/build-cpu/bin/llama-perplexity" ]; then
    # AVX2/AVX-512 named explicitly: these CPUs list AMX, but -march=native code died here.
    cmake -S "$src" -B "$src/build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
        -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF \
        -DGGML_AMX_INT8=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF >&2
    cmake --build "$src/build-cpu" --target llama-quantize llama-perplexity llama-bench >&2
fi
echo "$src"
