"""What the live oracles against libllama share (test_sampler_llamacpp.py, test_grammar_llamacpp.py):
compiling a C++ harness against llama.cpp's library, building Muser's side (a cargo example), and a
vocabulary-only GGUF of the shipped model's tokenizer that llama.cpp can load.

The harnesses need llama.cpp built from source: MUSER_GGML_SRC (its source directory) and
LLAMA_CPP_BIN (the directory of libllama.so), as scripts/test.sh exports them; without them the
tests that use `compile_harness` are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def compile_harness(tmp_path_factory, source: Path, *flags: str) -> Path:
    """`source` compiled against libllama (skips the test when llama.cpp is not there)."""
    src, lib = os.environ.get("MUSER_GGML_SRC"), os.environ.get("LLAMA_CPP_BIN")
    if not src or not lib:
        pytest.skip("MUSER_GGML_SRC and LLAMA_CPP_BIN (llama.cpp's source and the directory of libllama.so) not set")
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("llamacpp") / source.stem
    r = subprocess.run(
        [cxx, "-O2", "-std=c++17", *flags, f"-I{Path(src) / 'include'}",
         f"-I{Path(src) / 'ggml' / 'include'}", str(source), f"-L{lib}", "-lllama",
         f"-Wl,-rpath,{lib}", "-o", str(exe)],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    return exe


def cargo_example(package: str, example: str, release: bool = False) -> Path:
    """Builds a cargo example and returns its executable."""
    out = subprocess.run(
        ["cargo", "build", "-q", *(["--release"] if release else []), "-p", package, "--example",
         example, "--message-format=json"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == example:
            if msg.get("executable"):
                return Path(msg["executable"])
    raise RuntimeError(f"cargo did not report the {example} executable")


def vocab_only_gguf(src: Path, dst: Path) -> None:
    """A GGUF of `src`'s tokenizer alone, as a llama model llama.cpp can load vocab-only."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "llama")
    for key, v in [("context_length", 4096), ("embedding_length", 64), ("block_count", 1),
                   ("feed_forward_length", 128), ("attention.head_count", 1)]:
        w.add_uint32(f"llama.{key}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    for name, f in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(f.parts[i]) for i in f.data])
            else:
                w.add_array(name, [f.parts[i].tolist()[0] for i in f.data])
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode())
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
