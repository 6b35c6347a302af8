#!/usr/bin/env python3
"""Byte-for-byte comparison of `muser quantize --pure` with llama.cpp's `llama-quantize --pure`.

Writes an F32 llama GGUF with random weights (rows of different scales, outliers included),
quantizes it with both tools to Q8_0, Q4_K, Q5_K and Q6_K (--pure) and to the Q4_K_M mix, and compares every tensor's bytes.
llama.cpp is built on the side (SPEC section 7); pass its llama-quantize with --llama-quantize.

    python3 scripts/compare_quantize.py --llama-quantize /path/to/llama-quantize [--muser target/release/muser]
"""
import argparse, os, subprocess, sys, tempfile
import numpy as np
import gguf


def write_f32_llama(path, seed=0, n_layer=2, n_embd=512, n_ff=1024, n_vocab=512):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(n_embd // 8)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)

    def mat(rows, cols):
        scale = np.exp(rng.uniform(-3, 1, size=(rows, 1)))
        m = rng.standard_normal((rows, cols)) * scale
        # sprinkle outliers and a few constant runs, which exercise the scale searches
        idx = rng.integers(0, m.size, size=m.size // 200)
        m.flat[idx] *= 8
        m[0, :64] = 0.25
        return m.astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(p + "attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_embd // 4, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_embd // 4, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def tensors(path):
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, np.asarray(t.data).view(np.uint8).tobytes()) for t in r.tensors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-quantize", required=True)
    ap.add_argument("--muser", default=os.environ.get("MUSER_BIN", "target/release/muser"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "f32.gguf")
        write_f32_llama(src, a.seed, n_layer=16)
        for ty in ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"]:
            pure = [] if ty == "Q4_K_M" else ["--pure"]
            ours, theirs = os.path.join(d, f"muser-{ty}.gguf"), os.path.join(d, f"llama-{ty}.gguf")
            subprocess.run([a.muser, "quantize", src, ours, ty] + pure, check=True, capture_output=True)
            subprocess.run([a.llama_quantize] + pure + [src, theirs, ty], check=True, capture_output=True)
            A, B = tensors(ours), tensors(theirs)
            same = [n for n in B if n in A and A[n] == B[n]]
            diff = [n for n in B if n not in same]
            print(f"{ty}: {len(same)}/{len(B)} tensors byte-identical" + (f"; differ: {diff}" if diff else ""))
            for n in diff[:3]:
                ta, tb = A.get(n), B[n]
                if ta and ta[0] == tb[0]:
                    x, y = np.frombuffer(ta[1], np.uint8), np.frombuffer(tb[1], np.uint8)
                    print(f"   {n} ({tb[0]}): {int((x != y).sum())} of {x.size} bytes differ")
                else:
                    print(f"   {n}: types {ta and ta[0]} vs {tb[0]}")
            ok &= not diff
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
