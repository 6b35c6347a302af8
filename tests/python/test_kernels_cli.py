"""`muser kernels`: fills the kernel cache with sm_90 machine code ahead of time (NVRTC, no GPU),
a second run finds every file cached, and a bad architecture is a clear error."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

MUSER = os.environ.get("MUSER_BIN", "target/release/muser")


def _run(args, cache: Path):
    env = dict(os.environ, MUSER_KERNEL_CACHE=str(cache))
    return subprocess.run([MUSER, "kernels", *args], env=env, capture_output=True, text=True, timeout=900)


def test_kernels_fill_the_cache_once(tmp_path):
    if os.environ.get("MUSER_REQUIRE_NVRTC") != "1":
        pytest.skip("NVRTC not set up (scripts/test.sh sets it up)")
    cache = tmp_path / "kernels"
    first = _run(["--arch", "sm_90"], cache)
    assert first.returncode == 0, first.stderr
    files = sorted(cache.glob("*.cubin"))
    assert len(files) >= 10
    for f in files:
        assert f.read_bytes()[:4] == b"\x7fELF", f
        assert "-sm_90-" in f.name
    compiled = [l for l in first.stdout.splitlines() if "compiled in" in l]
    assert len(compiled) == len(files), first.stdout

    second = _run([], cache)  # sm_90 is the default
    assert second.returncode == 0, second.stderr
    assert "compiled in" not in second.stdout
    assert second.stdout.count("already cached") == len(files)
    assert sorted(cache.glob("*.cubin")) == files


def test_a_bad_architecture_is_an_error(tmp_path):
    r = _run(["--arch", "compute_90"], tmp_path)
    assert r.returncode != 0
    assert "--arch compute_90" in r.stderr
    assert not any(tmp_path.iterdir())
