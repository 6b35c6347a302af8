#!/usr/bin/env bash
# Fetches llama.cpp's source, the comparator (SPEC section 7): PyPI's llama-cpp-python 0.3.36
# sdist, whose vendor/llama.cpp is commit 0c1e5709 of 2026-10-01. Usage:
#   scripts/fetch_llamacpp.sh DIR          # extracts into DIR, prints DIR/.../vendor/llama.cpp
#   scripts/fetch_llamacpp.sh DIR build    # also builds llama-quantize, llama-perplexity,
#                                            # llama-bench and llama-server (CPU)
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
# The instruction sets named explicitly, from what this CPU lists: some of these machines list
# AMX, but -march=native code died there, and others (Zen 3) have AVX2 and no AVX-512, where an
# AVX-512 build dies with SIGILL. A build made for other flags (a cache from another machine) is
# made again.
has() { grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -qx "$1"; }
on() { if has "$1"; then echo ON; else echo OFF; fi; }
avx512=OFF
has avx512f && has avx512bw && has avx512vl && has avx512dq && avx512=ON
vnni=OFF
[ "$avx512" = ON ] && has avx512_vnni && vnni=ON
flags="-DGGML_SSE42=$(on sse4_2) -DGGML_AVX=$(on avx) -DGGML_BMI2=$(on bmi2) -DGGML_AVX2=$(on avx2) -DGGML_FMA=$(on fma) -DGGML_F16C=$(on f16c) \
-DGGML_AVX512=$avx512 -DGGML_AVX512_VNNI=$vnni -DGGML_AVX_VNNI=$(on avx_vnni)"
if [ "${2:-}" = build ]; then
    if [ "$(cat "$src/build-cpu/muser-flags" 2>/dev/null)" != "$flags" ]; then
        rm -rf "$src/build-cpu"
        # shellcheck disable=SC2086 # $flags is a list of options
        cmake -S "$src" -B "$src/build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
            $flags -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF >&2
    fi
    # Incremental: a build that has every target already takes a second.
    cmake --build "$src/build-cpu" --target llama-quantize llama-perplexity llama-bench llama-server >&2
    echo "$flags" > "$src/build-cpu/muser-flags"
fi
echo "$src"
