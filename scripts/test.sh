#!/usr/bin/env bash
# Runs every test Muser has: the Rust unit and integration tests (including the NVRTC compile of
# every CUDA kernel, with libnvrtc from the nvidia-cuda-nvrtc wheel), then the Python oracle tests
# (gguf-py, the numpy reference model, HF tokenizers) against the release `muser` binary.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r tests/python/requirements.txt

# NVRTC from the wheel: cudarc looks for libnvrtc.so, the wheel ships libnvrtc.so.13.
nv="$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
mkdir -p target/nvrtc
ln -sf "$nv/lib/libnvrtc.so.13" target/nvrtc/libnvrtc.so
export LD_LIBRARY_PATH="$PWD/target/nvrtc:$nv/lib:${LD_LIBRARY_PATH:-}"
export MUSER_CUDA_INCLUDE="$nv/include"
export MUSER_REQUIRE_NVRTC=1

# The comparator, llama.cpp, built on the side from PyPI's source (never committed): its C
# reference quantizers and llama-quantize are byte oracles, llama-perplexity the logit oracle,
# llama-server the oracle of the server's answers.
# MUSER_SKIP_LLAMACPP=1 skips it (about 15 minutes on 2 cores the first time).
if [ "${MUSER_SKIP_LLAMACPP:-0}" != 1 ]; then
    llama_src="$(scripts/fetch_llamacpp.sh "$PWD/target/llamacpp" build)"
    export MUSER_GGML_SRC="$llama_src"
    export LLAMA_CPP_BIN="$llama_src/build-cpu/bin"
fi

cargo test --workspace
cargo build --release -p muser-cli
export MUSER_BIN="$PWD/target/release/muser"
python3 -m pytest -q tests/python
