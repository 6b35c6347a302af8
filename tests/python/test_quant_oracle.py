"""Block formats: Muser's dequantizers and reference quantizers against gguf-python's
`gguf.quants`, an independent implementation of ggml's formats (SPEC section 5).

- Dequantization, bit-exact (every f32 output bit), for F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K on
  thousands of random blocks: random bytes, with the f16 scale fields (d, dmin) overwritten by
  random finite f16s, so every quant/scale bit pattern is exercised. Q8_K has no gguf-python
  implementation; it is checked against a numpy transcription of ggml's dequantize_row_q8_K.
- Quantization, byte-exact, for Q8_0 and BF16 (the formats gguf-python can quantize), on random
  data with exact ties, zero blocks and (BF16) NaN/Inf; F16 against numpy's IEEE conversion.

Muser is reached through its example binary `quant_io` (crates/muser-quant/examples), built
once per session with cargo.
"""

from __future__ import annotations

import json
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
