"""Block formats: Muser's dequantizers and reference quantizers against gguf-python's
`gguf.quants`, an independent implementation of ggml's formats (SPEC section 5).

- Dequantization, bit-exact (every f32 output bit), for F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K on
  thousands of random blocks: random bytes, with the f16 scale fields (d, dmin) overwritten by
  random finite f16s, so every quant/scale bit pattern is exercised. Q8_K has no gguf-python
  implementation; it is checked against a numpy transcription of ggml's dequantize_row_q8_K.
- Quantization, byte-exact, for Q8_0 and BF16 (the formats gguf-python can quantize), on random
  data with exact ties, zero blocks and (BF16) NaN/Inf; F16 against numpy's IEEE conversion.

- Optionally, K-quant quantization byte-exact against ggml's own C reference quantizers
  (`quantize_row_{q4_K,q5_K,q6_K,q8_K,q8_0}_ref`): set MUSER_GGML_SRC to a ggml or llama.cpp
  checkout; its ggml-quants.c is compiled here with the system C compiler for the baseline x86-64
  ISA (no FMA contraction), as llama.cpp builds it into ggml-base. Skipped otherwise.

Muser is reached through its example binary `quant_io` (crates/muser-quant/examples), built
once per session with cargo.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

REPO = Path(__file__).resolve().parents[2]

# type -> (values per block, bytes per block, byte offsets of the f16 scale fields)
LAYOUT = {
    "F16": (1, 2, ()),
    "BF16": (1, 2, ()),
    "Q8_0": (32, 34, (0,)),
    "Q4_K": (256, 144, (0, 2)),
    "Q5_K": (256, 176, (0, 2)),
    "Q6_K": (256, 210, (208,)),
}
N_BLOCKS = {"F16": 200_000, "BF16": 200_000, "Q8_0": 20_000, "Q4_K": 4_000, "Q5_K": 4_000, "Q6_K": 4_000}


@pytest.fixture(scope="session")
def quant_io() -> Path:
    """Builds the example once and returns its path."""
    out = subprocess.run(
        ["cargo", "build", "-q", "-p", "muser-quant", "--example", "quant_io", "--message-format=json"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "quant_io":
            if msg.get("executable"):
                return Path(msg["executable"])
    raise RuntimeError("cargo did not report the quant_io executable")


def run_io(exe: Path, tmp: Path, cmd: str, ty: str, data: bytes) -> bytes:
    src, dst = tmp / f"{cmd}_{ty}.in", tmp / f"{cmd}_{ty}.out"
    src.write_bytes(data)
    r = subprocess.run([str(exe), cmd, ty, str(src), str(dst)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return dst.read_bytes()


def random_finite_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random finite f16 bit patterns (normals, subnormals, zeros of both signs)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exp_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exp_all_ones] &= 0xBFFF  # clear the top exponent bit: finite
    return bits


def random_blocks(ty: str, n_blocks: int, seed: int) -> np.ndarray:
    per, size, f16_fields = LAYOUT[ty]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in f16_fields:
        raw[:, off : off + 2] = random_finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.mark.parametrize("ty", ["F16", "BF16", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_dequantize_bit_exact(quant_io, tmp_path, ty):
    raw = random_blocks(ty, N_BLOCKS[ty], seed=int.from_bytes(ty.encode(), "little"))
    if ty == "F16":
        # Only finite f16s: NaN payloads are not part of the format contract.
        raw = random_finite_f16(np.random.default_rng(1), raw.size // 2).view(np.uint8).reshape(raw.shape)
    ours = np.frombuffer(run_io(quant_io, tmp_path, "dequant", ty, raw.tobytes()), dtype=np.uint32)
    want = dequantize(raw.reshape(-1), QT[ty]).astype(np.float32).reshape(-1).view(np.uint32)
    assert ours.shape == want.shape
    bad = np.flatnonzero(ours != want)
    assert bad.size == 0, (
        f"{ty}: {bad.size} of {want.size} values differ; first at {bad[0]}: "
        f"ours {ours[bad[0]]:#010x} gguf {want[bad[0]]:#010x}"
    )


def test_dequantize_q8_k_matches_ggml_formula(quant_io, tmp_path):
    """Q8_K (292 B: d f32, qs int8[256], bsums int16[16]) is not in gguf-python: y = d * q."""
    n = 2_000
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(n, 292), dtype=np.uint8)
    d = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 2, n)).astype(np.float32)
    raw[:, 0:4] = d.view(np.uint8).reshape(n, 4)
    ours = np.frombuffer(run_io(quant_io, tmp_path, "dequant", "Q8_K", raw.tobytes()), dtype=np.float32)
    q = raw[:, 4:260].view(np.int8).astype(np.float32)
    want = (d[:, None] * q).reshape(-1)
    np.testing.assert_array_equal(ours.view(np.uint32), want.view(np.uint32))


def q8_0_inputs(n_blocks: int) -> np.ndarray:
    """Random blocks of varied scale, with exact .5 ties after scaling, and zero blocks."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((n_blocks, 32)) * 10.0 ** rng.uniform(-4, 3, (n_blocks, 1))).astype(np.float32)
    # Blocks whose max is 127 (so d = 1 exactly) and whose other values are k + 0.5: every value
    # is a tie for roundf, which rounds halves away from zero (banker's rounding would differ).
    ties = rng.integers(-126, 126, size=(n_blocks // 8, 32)).astype(np.float32) + 0.5
    ties[:, 0] = 127.0
    x[: n_blocks // 8] = ties
    x[n_blocks // 8 : n_blocks // 8 + 16] = 0.0
    return x


def test_quantize_q8_0_byte_exact(quant_io, tmp_path):
    x = q8_0_inputs(20_000)
    ours = run_io(quant_io, tmp_path, "quant", "Q8_0", x.astype("<f4").tobytes())
    want = quantize(x, QT.Q8_0).tobytes()
    assert len(ours) == len(want)
    a, b = np.frombuffer(ours, np.uint8).reshape(-1, 34), np.frombuffer(want, np.uint8).reshape(-1, 34)
    bad = np.flatnonzero((a != b).any(axis=1))
    assert bad.size == 0, f"{bad.size} blocks differ; first {bad[0]}: ours {a[bad[0]]} gguf {b[bad[0]]}"


def test_quantize_bf16_byte_exact(quant_io, tmp_path):
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 1 << 32, size=300_000, dtype=np.uint64).astype(np.uint32)
    # Exact ties (low half 0x8000) with both parities, infinities, NaNs (signalling and quiet).
    bits[:1000] = (bits[:1000] & 0xFFFF0000) | 0x8000
    bits[1000:1004] = [0x7F800000, 0xFF800000, 0x7F800001, 0xFFC00000]
    x = bits.view(np.float32)
    ours = np.frombuffer(run_io(quant_io, tmp_path, "quant", "BF16", x.tobytes()), np.uint16)
    want = quantize(x, QT.BF16).reshape(-1).view(np.uint16)
    bad = np.flatnonzero(ours != want)
    assert bad.size == 0, f"{bad.size} differ; first x={bits[bad[0]]:#010x}: ours {ours[bad[0]]:#06x} gguf {want[bad[0]]:#06x}"


def test_quantize_f16_matches_ieee(quant_io, tmp_path):
    rng = np.random.default_rng(13)
    bits = rng.integers(0, 1 << 32, size=300_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    x = np.concatenate([x, (rng.standard_normal(100_000) * 10.0 ** rng.uniform(-9, 5, 100_000)).astype(np.float32)])
    ours = np.frombuffer(run_io(quant_io, tmp_path, "quant", "F16", x.tobytes()), np.uint16)
    with np.errstate(over="ignore"):  # large finite values round to +-inf, as they should
        want = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(ours, want)


def test_quant_io_rejects_bad_input(quant_io, tmp_path):
    src, dst = tmp_path / "bad.in", tmp_path / "bad.out"
    src.write_bytes(b"\0" * 100)  # not whole Q4_K blocks, nor whole Q8_0 f32 blocks
    for args in (["dequant", "Q4_K"], ["quant", "Q8_0"], ["dequant", "Q4_0"], ["frobnicate", "F32"]):
        r = subprocess.run([str(quant_io), *args, str(src), str(dst)], capture_output=True, text=True)
        assert r.returncode == 1 and "quant_io:" in r.stderr, (args, r.stderr)


# ----------------------------------------------------------------------------------------
# Optional: ggml's C reference quantizers as the oracle (MUSER_GGML_SRC)

HARNESS_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-quants.h"
/* Symbols ggml-quants.c references outside the reference quantizers; never called here. */
void ggml_abort(const char * file, int line, const char * fmt, ...) { abort(); }
size_t ggml_row_size(enum ggml_type type, int64_t ne) { abort(); }
const char * ggml_type_name(enum ggml_type type) { abort(); }
size_t ggml_type_size(enum ggml_type type) { abort(); }
int main(int argc, char ** argv) {
    FILE * f = fopen(argv[2], "rb");
    fseek(f, 0, SEEK_END); long n = ftell(f) / 4; fseek(f, 0, SEEK_SET);
    float * x = malloc(n * 4);
    if (fread(x, 4, n, f) != (size_t) n) return 3;
    fclose(f);
    void * y = calloc(n * 2, 1);
    size_t bytes;
    if      (!strcmp(argv[1], "Q4_K")) { quantize_row_q4_K_ref(x, y, n); bytes = n / 256 * 144; }
    else if (!strcmp(argv[1], "Q5_K")) { quantize_row_q5_K_ref(x, y, n); bytes = n / 256 * 176; }
    else if (!strcmp(argv[1], "Q6_K")) { quantize_row_q6_K_ref(x, y, n); bytes = n / 256 * 210; }
    else if (!strcmp(argv[1], "Q8_K")) { quantize_row_q8_K_ref(x, y, n); bytes = n / 256 * 292; }
    else if (!strcmp(argv[1], "Q8_0")) { quantize_row_q8_0_ref(x, y, n); bytes = n / 32 * 34; }
    else return 2;
    FILE * o = fopen(argv[3], "wb");
    fwrite(y, 1, bytes, o);
    fclose(o);
    return 0;
}
"""


@pytest.fixture(scope="session")
def ggml_ref(tmp_path_factory) -> Path:
    root = os.environ.get("MUSER_GGML_SRC")
    if not root:
        pytest.skip("MUSER_GGML_SRC (a ggml or llama.cpp checkout) not set")
    root = Path(root)
    ggml = root / "ggml" if (root / "ggml" / "src" / "ggml-quants.c").exists() else root
    src = ggml / "src"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not (src / "ggml-quants.c").exists() or cc is None:
        pytest.skip(f"no {src / 'ggml-quants.c'} or no C compiler")
    out = tmp_path_factory.mktemp("ggml")
    (out / "harness.c").write_text(HARNESS_C)
    inc = [f"-I{ggml / 'include'}", f"-I{src}", f"-I{src / 'ggml-cpu'}"]
    exe = out / "ggml_ref"
    # -DNDEBUG as in a release build: nearest_int's range assert would abort on the extreme data.
    subprocess.run([cc, "-O2", "-DNDEBUG", "-std=gnu11", "-ffp-contract=off", *inc, str(src / "ggml-quants.c"),
                    str(out / "harness.c"), "-lm", "-o", str(exe)], check=True, capture_output=True)
    return exe


def k_quant_datasets(n: int):
    rng = np.random.default_rng(21)
    per_block = lambda lo, hi, k: 10.0 ** rng.uniform(lo, hi, (n // k, 1)).repeat(k, 0).ravel()
    yield "gaussian", rng.standard_normal(n) * per_block(-5, 3, 256)
    yield "offset", rng.standard_normal(n) + rng.uniform(-3, 3, (n // 32, 1)).repeat(32, 0).ravel()
    yield "cos", 0.1 + 2 * np.cos(np.arange(n, dtype=np.float32))
    yield "heavy-tailed", rng.standard_t(2, n)
    sparse = rng.standard_normal(n)
    sparse[rng.random(n) < 0.9] = 0
    yield "sparse", sparse
    yield "half-integers", rng.integers(-40, 40, n) / 2
    yield "positive", np.abs(rng.standard_normal(n))
    yield "constant-per-32", np.repeat(rng.standard_normal(n // 32), 32)
    tiny = rng.standard_normal(n)
    tiny[: n // 8] = 0
    tiny[n // 8 : n // 4] *= 1e-20
    yield "zeros-and-tiny", tiny
    # Subnormal to huge block scales, with NaN and infinities: garbage in, the same garbage out.
    extreme = rng.standard_normal(n) * 10.0 ** rng.uniform(-45, 30, (n // 32, 1)).repeat(32, 0).ravel()
    extreme[rng.integers(0, n, 60)] = [np.nan] * 20 + [np.inf] * 20 + [-np.inf] * 20
    yield "extreme", extreme


@pytest.mark.parametrize("ty", ["Q4_K", "Q5_K", "Q6_K", "Q8_K", "Q8_0"])
def test_quantize_byte_exact_with_ggml_c(quant_io, ggml_ref, tmp_path, ty):
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_K": 292, "Q8_0": 34}[ty]
    for name, x in k_quant_datasets(256 * 2000):
        x = np.ascontiguousarray(x, dtype=np.float32)
        ours = np.frombuffer(run_io(quant_io, tmp_path, "quant", ty, x.tobytes()), np.uint8)
        (tmp_path / "x.f32").write_bytes(x.tobytes())
        subprocess.run([str(ggml_ref), ty, str(tmp_path / "x.f32"), str(tmp_path / "c.bin")], check=True)
        want = np.fromfile(tmp_path / "c.bin", np.uint8)
        bad = np.flatnonzero((ours.reshape(-1, size) != want.reshape(-1, size)).any(axis=1))
        assert bad.size == 0, f"{ty} on {name}: {bad.size} of {want.size // size} blocks differ (first {bad[0]})"
