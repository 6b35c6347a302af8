//! Whole-model properties on tiny hand-built models: prefill equals token-by-token decode, the
//! sliding window hides what it should, context overflow and bad inputs are errors.

mod common;
use common::*;
use muser_engine::{EngineError, Session};

fn prefill_vs_decode(t: &Tiny, n: usize, n_ctx: usize) {
    let m = t.model();
    let toks = random_tokens(n, t.n_vocab, 3);
    let mut s = Session::new(&m, n_ctx).unwrap();
    let all = s.prefill_all(&toks).unwrap();
    assert_eq!(s.pos(), n);
    assert_eq!(
        s.logits(),
        &all[(n - 1) * t.n_vocab..],
        "logits() after prefill_all"
    );
    let mut s2 = Session::new(&m, n_ctx).unwrap();
    let nv = t.n_vocab;
    for (i, &tok) in toks.iter().enumerate() {
        let l = s2.decode(tok).unwrap();
        let e = nmse(l, &all[i * nv..(i + 1) * nv]);
        assert!(e < 1e-6, "{} position {i}: nmse {e}", t.arch);
    }
    // prefill (last logits only) agrees too
    let mut s3 = Session::new(&m, n_ctx).unwrap();
    let last = s3.prefill(&toks).unwrap();
    assert!(nmse(last, &all[(n - 1) * nv..]) < 1e-6);
    // logits are not degenerate
    let row = &all[(n - 1) * nv..];
    let (mn, mx) = row
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    assert!(mx - mn > 1e-3, "{}: flat logits", t.arch);
}

#[test]
fn prefill_equals_decode_muse() {
    prefill_vs_decode(&Tiny::new("muse"), 40, 64);
}

#[test]
fn prefill_equals_decode_llama() {
    prefill_vs_decode(&Tiny::new("llama"), 40, 64);
}

#[test]
fn prefill_equals_decode_qwen3() {
    prefill_vs_decode(&Tiny::new("qwen3"), 40, 64);
}

#[test]
fn prefill_in_several_chunks_with_ring_wraparound() {
    // 600 tokens: two prefill chunks (512 + 88); sliding rings of 16 + 511 slots wrap.
    let mut t = Tiny::new("muse");
    t.n_layer = 2;
    prefill_vs_decode(&t, 600, 700);
}

#[test]
fn sliding_window_hides_older_positions() {
    // One sliding layer of window 8: the logits at position p depend on tokens p-7..=p only.
    let mut t = Tiny::new("muse");
    t.n_layer = 1;
    t.window = 8;
    t.full_interval = 1000; // no full layer
    let m = t.model();
    let a = random_tokens(30, t.n_vocab, 11);
    let mut b = a.clone();
    b[0] = (a[0] + 1) % t.n_vocab as u32;
    let nv = t.n_vocab;
    let la = Session::new(&m, 64).unwrap().prefill_all(&a).unwrap();
    let lb = Session::new(&m, 64).unwrap().prefill_all(&b).unwrap();
    for p in 0..30 {
        let (x, y) = (&la[p * nv..(p + 1) * nv], &lb[p * nv..(p + 1) * nv]);
        if p < 8 {
            assert!(nmse(x, y) > 1e-8, "position {p} should see token 0");
        } else {
            assert_eq!(x, y, "position {p} must not see token 0");
        }
    }
    // The same with a full (NoPE) layer: every position sees token 0.
    t.full_interval = 1;
    let m = t.model();
    let la = Session::new(&m, 64).unwrap().prefill_all(&a).unwrap();
    let lb = Session::new(&m, 64).unwrap().prefill_all(&b).unwrap();
    assert!(nmse(&la[29 * nv..], &lb[29 * nv..]) > 1e-8);
}

/// A context whose KV cache cannot be had is an error naming it, not a panic: a size past
/// the bytes overflow, and one past any address space (2^56 positions of at least 4 bytes).
#[test]
fn unreservable_context_is_an_error() {
    let m = Tiny::new("llama").model();
    for n_ctx in [usize::MAX / 2, 1 << 56] {
        let err = match Session::new(&m, n_ctx) {
            Ok(_) => panic!("a context of {n_ctx} positions was reserved"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("KV cache") && err.contains(&n_ctx.to_string()),
            "{err}"
        );
    }
}

#[test]
fn context_overflow_is_an_error() {
    let m = Tiny::new("llama").model();
    let mut s = Session::new(&m, 8).unwrap();
    let err = s.prefill(&random_tokens(9, 320, 1)).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::ContextOverflow {
                n_past: 0,
                n_new: 9,
                n_ctx: 8
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("n_prompt = 9") && msg.contains("n_ctx = 8"),
        "{msg}"
    );
    s.prefill(&random_tokens(5, 320, 1)).unwrap();
    for _ in 0..3 {
        s.decode(1).unwrap();
    }
    let err = s.decode(1).unwrap_err();
    assert!(err.to_string().contains("n_ctx = 8"), "{err}");
    assert_eq!(s.pos(), 8);
    s.reset();
    s.decode(1).unwrap();
}

#[test]
fn bad_token_and_empty_prompt_are_errors() {
    let m = Tiny::new("qwen3").model();
    let mut s = Session::new(&m, 8).unwrap();
    let err = s.prefill(&[1, 320]).unwrap_err();
    assert!(
        err.to_string().contains("320") && err.to_string().contains("n_vocab = 320"),
        "{err}"
    );
    assert!(s.prefill(&[]).is_err());
    assert!(Session::new(&m, 0).is_err());
    assert_eq!(s.pos(), 0);
}

fn load_err(
    t: &Tiny,
    edit: impl FnOnce(
        &mut Vec<(muser_gguf::TensorSpec, Vec<u8>)>,
        &mut Vec<(String, muser_gguf::MetaValue)>,
    ),
) -> String {
    let mut tensors = t.tensors();
    let mut meta = t.metadata();
    edit(&mut tensors, &mut meta);
    let bytes = muser_gguf::write_to_vec(&meta, &tensors).unwrap();
    match load(bytes) {
        Ok(_) => panic!("the model should have been refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_tensor_is_named() {
    let t = Tiny::new("muse");
    let msg = load_err(&t, |ts, _| {
        ts.retain(|(s, _)| s.name != "blk.1.attn_k.weight")
    });
    assert!(msg.contains("blk.1.attn_k.weight: missing"), "{msg}");
    let msg = load_err(&t, |ts, _| ts.retain(|(s, _)| s.name != "output.weight"));
    assert!(msg.contains("output.weight: missing"), "{msg}");
}

#[test]
fn misshaped_tensor_is_named_with_expected_and_found() {
    let t = Tiny::new("llama");
    let msg = load_err(&t, |ts, _| {
        let i = ts
            .iter()
            .position(|(s, _)| s.name == "blk.2.attn_q.weight")
            .unwrap();
        let spec = muser_gguf::TensorSpec::new(
            "blk.2.attn_q.weight",
            &[256, 128],
            muser_gguf::GgmlType::Q4_K,
        );
        let data = Tiny::data(&spec, &mut rand::SeedableRng::seed_from_u64(1));
        ts[i] = (spec, data);
    });
    assert!(
        msg.contains("blk.2.attn_q.weight: expected dims [256, 256], found [256, 128]"),
        "{msg}"
    );
}

#[test]
fn unsupported_tensor_type_is_named() {
    let t = Tiny::new("llama");
    let msg = load_err(&t, |ts, _| {
        let i = ts
            .iter()
            .position(|(s, _)| s.name == "blk.0.ffn_up.weight")
            .unwrap();
        let spec = muser_gguf::TensorSpec::new(
            "blk.0.ffn_up.weight",
            &[256, 512],
            muser_gguf::GgmlType::Q4_0,
        );
        let n = spec.n_bytes().unwrap() as usize;
        ts[i] = (spec, vec![0u8; n]);
    });
    assert!(
        msg.contains("blk.0.ffn_up.weight: type Q4_0 is not supported"),
        "{msg}"
    );
}

#[test]
fn unsupported_architecture_lists_the_supported_ones() {
    let t = Tiny::new("llama");
    let msg = load_err(&t, |_, meta| {
        meta[0].1 = muser_gguf::MetaValue::String("gpt-j".into())
    });
    assert!(
        msg.contains("'gpt-j'") && msg.contains("muse, llama, qwen3"),
        "{msg}"
    );
}

#[test]
fn missing_hyperparameter_is_named() {
    let t = Tiny::new("muse");
    let msg = load_err(&t, |_, meta| {
        meta.retain(|(k, _)| k != "muse.attention.sliding_window")
    });
    assert!(msg.contains("muse.attention.sliding_window"), "{msg}");
}

#[test]
fn rope_scaling_is_refused_not_ignored() {
    let t = Tiny::new("llama");
    let msg = load_err(&t, |_, meta| {
        meta.push((
            "llama.rope.scaling.type".into(),
            muser_gguf::MetaValue::String("yarn".into()),
        ))
    });
    assert!(
        msg.contains("llama.rope.scaling.type") && msg.contains("yarn"),
        "{msg}"
    );
    let msg = load_err(&t, |ts, _| {
        let spec =
            muser_gguf::TensorSpec::new("rope_freqs.weight", &[32], muser_gguf::GgmlType::F32);
        ts.push((spec, vec![0u8; 128]));
    });
    assert!(msg.contains("rope_freqs.weight"), "{msg}");
}

/// Sets metadata key `key` (which the preset writes) to `v`.
fn set_meta(meta: &mut [(String, muser_gguf::MetaValue)], key: &str, v: muser_gguf::MetaValue) {
    let slot = meta
        .iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("the preset writes {key}"));
    slot.1 = v;
}

#[test]
fn block_count_must_match_the_files_blocks() {
    use muser_gguf::MetaValue;
    let t = Tiny::new("muse");
    let blocks = t.n_layer;
    // Past the file's blocks (up to a count whose per-block checks would never end), and short
    // of them (which would run part of the model with no error).
    for v in [
        MetaValue::U32(blocks as u32 + 1),
        MetaValue::U32(i32::MAX as u32),
        MetaValue::U64(u64::MAX / 2 + 7),
        MetaValue::U32(blocks as u32 - 1),
        MetaValue::U32(1),
    ] {
        let shown = format!("{v:?}");
        let msg = load_err(&t, |_, meta| set_meta(meta, "muse.block_count", v));
        assert!(
            msg.contains("muse.block_count")
                && msg.contains(&format!("{blocks} blocks (blk.0 .. blk.{})", blocks - 1)),
            "{shown}: {msg}"
        );
    }
}

#[test]
fn float_hyperparameters_out_of_range_are_named() {
    use muser_gguf::MetaValue;
    let t = Tiny::new("muse");
    for (key, v, bound) in [
        ("muse.attention.layer_norm_rms_epsilon", -1e-5, ">= 0"),
        ("muse.attention.post_norm_rms_epsilon", -0.5, ">= 0"),
        ("muse.rope.freq_base", 0.0, "> 0"),
        ("muse.rope.freq_base", -10000.0, "> 0"),
        ("muse.logit_scale", 0.0, "> 0"),
        ("muse.logit_scale", -0.25, "> 0"),
    ] {
        let msg = load_err(&t, |_, meta| set_meta(meta, key, MetaValue::F32(v)));
        assert!(
            msg.contains(key) && msg.contains(&format!("must be {bound}, found {v}")),
            "{key} = {v}: {msg}"
        );
    }
}

/// `kv_cache_bytes` is what a session of that context reserves: f16 K and V per layer and
/// position (a sliding layer's ring stops growing), and None past what a u64 counts.
#[test]
fn kv_cache_bytes_counts_a_sessions_cache() {
    let t = Tiny::new("llama");
    let m = t.model();
    let per_pos = (t.n_layer * t.n_head_kv * t.head_dim * 2 * 2) as u64;
    assert_eq!(m.kv_cache_bytes(1), Some(per_pos));
    assert_eq!(m.kv_cache_bytes(1000), Some(1000 * per_pos));
    assert_eq!(m.kv_cache_bytes(usize::MAX), None);
    // muse's sliding layers keep a ring: past it only the full layers grow.
    let t = Tiny::new("muse");
    let m = t.model();
    let per_pos = (t.n_layer * t.n_head_kv * t.head_dim * 2 * 2) as u64;
    let (a, b) = (
        m.kv_cache_bytes(10_000).unwrap(),
        m.kv_cache_bytes(20_000).unwrap(),
    );
    assert!(a < b && b - a < 10_000 * per_pos, "{a} {b}");
    assert_eq!(m.kv_cache_bytes(8), Some(8 * per_pos));
}
