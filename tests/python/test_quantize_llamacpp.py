"""`muser quantize` against llama.cpp's `llama-quantize` on the same F32 GGUF (issue 2): every
tensor byte-identical for Q8_0, Q4_K, Q5_K, Q6_K (--pure) and the Q4_K_M mix. Skipped unless
$LLAMA_CPP_BIN names a folder holding llama-quantize (scripts/test.sh builds it on the side)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN")
MUSER = os.environ.get("MUSER_BIN", str(REPO / "target" / "release" / "muser"))


@pytest.mark.skipif(not LLAMA_BIN or not (Path(LLAMA_BIN) / "llama-quantize").exists(),
                    reason="set LLAMA_CPP_BIN to a folder with llama.cpp's llama-quantize")
@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_matches_llama_quantize_byte_for_byte(seed):
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "compare_quantize.py"),
         "--llama-quantize", str(Path(LLAMA_BIN) / "llama-quantize"), "--muser", MUSER,
         "--seed", str(seed)],
        capture_output=True, text=True, timeout=600)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("byte-identical") == 5
