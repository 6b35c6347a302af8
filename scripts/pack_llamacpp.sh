#!/usr/bin/env bash
# Packs llama.cpp's source (the comparator, SPEC section 7: PyPI's llama-cpp-python 0.3.36 sdist,
# vendor/llama.cpp at commit 0c1e5709) into .llamacpp-src.tar.xz (git-ignored), small enough to
# carry to the device, where scripts/device_bench.sh builds it with LLAMA=1. Never committed.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${LLAMACPP_WORK:-target/llamacpp}
scripts/fetch_llamacpp.sh "$work" > /dev/null
# Models, docs and the backends we do not build are left out; CMake needs the rest.
tar cJf .llamacpp-src.tar.xz -C "$work/llama_cpp_python-0.3.36/vendor" \
    --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/media \
    --exclude=llama.cpp/gguf-py --exclude='llama.cpp/build*' \
    --exclude=llama.cpp/ggml/src/ggml-sycl --exclude=llama.cpp/ggml/src/ggml-vulkan \
    --exclude=llama.cpp/ggml/src/ggml-opencl --exclude=llama.cpp/ggml/src/ggml-hexagon \
    --exclude=llama.cpp/ggml/src/ggml-metal --exclude=llama.cpp/ggml/src/ggml-webgpu \
    llama.cpp
ls -la .llamacpp-src.tar.xz
