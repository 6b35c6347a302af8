#!/usr/bin/env bash
# Runs every test Muser has: the Rust unit and integration tests, then the Python oracle tests
# (gguf-py, numpy reference model, HF tokenizers) against the release `muser` binary.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r tests/python/requirements.txt
cargo test --workspace
cargo build --release -p muser-cli
export MUSER_BIN="$PWD/target/release/muser"
python3 -m pytest -q tests/python
