#!/usr/bin/env bash
# A CUDA 13.0 nvcc on a machine without the toolkit (this one: no GPU), assembled from PyPI's
# NVIDIA wheels into target/cuda13, so that the standalone lab programs (scripts/matvec_lab/*.cu,
# host code included) compile here before they spend device time; they still run only on the GPU.
#   bash scripts/local_nvcc.sh        # once (downloads ~150 MB), then:
#   target/cuda13/bin/nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/chain scripts/matvec_lab/chain.cu
set -euo pipefail
# Versions of one CUDA 13.0 release: a newer runtime's headers call device functions that this
# nvcc's libdevice lacks (ptxas: unresolved __nv_idp4a_s_s_impl).
V=13.0.88 RT=13.0.96 CCCL=13.0.85
ROOT=${1:-target/cuda13}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for pkg in nvidia-cuda-nvcc==$V nvidia-nvvm==$V nvidia-cuda-crt==$V nvidia-cuda-runtime==$RT nvidia-cuda-cccl==$CCCL; do
    pip download --quiet --no-deps -d "$TMP/whl" "$pkg"
done
for w in "$TMP"/whl/*.whl; do python3 -m zipfile -e "$w" "$TMP/x"; done
S="$TMP/x/nvidia/cu13"
rm -rf "$ROOT" && mkdir -p "$ROOT/include/cccl" "$ROOT/lib64"
cp -r "$S/bin" "$S/nvvm" "$ROOT/"
# The toolkit's include holds the runtime's, crt's and nvcc's headers; cccl's (nv/target, cuda/std)
# go under include/cccl, where nvcc.profile looks for them.
for d in "$S"/include/*; do
    case $(basename "$d") in cccl | nv | cub | thrust | cuda) cp -r "$d" "$ROOT/include/cccl/" ;; *) cp -r "$d" "$ROOT/include/" ;; esac
done
cp "$S"/lib/libcudart* "$S"/lib/libcudadevrt.a "$ROOT/lib64/" 2>/dev/null || true
ln -sf libcudart.so.13 "$ROOT/lib64/libcudart.so"
chmod +x "$ROOT"/bin/* "$ROOT"/nvvm/bin/*
"$ROOT/bin/nvcc" --version | tail -1
