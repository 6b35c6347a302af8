//! The batched prefill attention and the decode path's per-(row, KV head) attention over the
//! f16 cache equal the per-(row, head) reference path bit for bit, and a whole prefill's logits
//! equal token-by-token decode logits bit for bit.

mod common;
use common::*;
use half::f16;
use muser_engine::backend::cpu::attn;
use muser_engine::backend::cpu::kv::KvLayer;
use muser_engine::backend::KvLayerSpec;
use muser_engine::Session;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// A layer holding positions 0..pos0+n with random K and V (as `store` would leave them).
fn layer(spec: KvLayerSpec, upto: usize, rng: &mut StdRng) -> KvLayer {
    let w = spec.n_head_kv * spec.head_dim;
    let mut kv = KvLayer::new(spec).unwrap();
    let k: Vec<f32> = (0..upto * w).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
    let v: Vec<f32> = (0..upto * w).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
    kv.store(&k, &v, 0);
    kv
}

#[test]
fn batched_attention_equals_per_head_attention_bitwise() {
    let mut rng = StdRng::seed_from_u64(5);
    // (n_head, n_head_kv, head_dim, window, pos0, rows)
    let cases = [
        (8, 2, 64, None, 0, 8),
        (8, 2, 64, None, 0, 37),
        (8, 2, 64, None, 21, 19),
        (4, 4, 128, None, 3, 40),
        (12, 2, 64, None, 100, 9),
        (6, 3, 32, Some(16), 0, 33),
        (8, 2, 64, Some(16), 50, 24),
        (4, 1, 256, Some(7), 13, 17),
    ];
    if attn::isas().is_empty() {
        return eprintln!("no AVX2: skipped");
    }
    for (&isa, (n_head, n_head_kv, head_dim, window, pos0, rows)) in attn::isas()
        .iter()
        .flat_map(|i| cases.iter().map(move |&c| (i, c)))
    {
        let slots = window.map_or(pos0 + rows, |w| w + rows - 1);
        let spec = KvLayerSpec {
            n_head,
            n_head_kv,
            head_dim,
            window,
            slots,
        };
        let kv = layer(spec, pos0 + rows, &mut rng);
        let q: Vec<f32> = (0..rows * n_head * head_dim)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut got = vec![f32::NAN; q.len()];
        attn::attend_with(isa, &kv, &q, n_head, pos0, scale, &mut got);
        let mut want = vec![f32::NAN; q.len()];
        for (i, o) in want.chunks_mut(head_dim).enumerate() {
            let (t, h) = (i / n_head, i % n_head);
            kv.attend_head(
                &q[i * head_dim..(i + 1) * head_dim],
                h,
                n_head,
                pos0 + t,
                scale,
                o,
            );
        }
        assert_eq!(
            bits(&got),
            bits(&want),
            "{isa:?}: heads {n_head}/{n_head_kv} x {head_dim}, window {window:?}, pos0 {pos0}, rows {rows}"
        );
    }
}

/// Decode cases: (n_head, n_head_kv, head_dim, window, position): GQA groups of 1 to 6 heads
/// (4 at a time in the AVX-512 kernel, so 5 and 6 leave a partial group), head sizes 32 to 256,
/// rows seeing 1 to 300 positions (not multiples of the kernel's 4), full planes and rings that
/// have wrapped.
const DECODE_CASES: [(usize, usize, usize, Option<usize>, usize); 14] = [
    (8, 2, 64, None, 0),
    (8, 2, 64, None, 1),
    (8, 2, 64, None, 4),
    (8, 2, 64, None, 298),
    (5, 5, 128, None, 37),
    (10, 5, 32, None, 66),
    (12, 4, 64, None, 130),
    (10, 2, 80, None, 17),
    (12, 2, 256, None, 9),
    (6, 1, 64, None, 203),
    (8, 2, 64, Some(16), 7),
    (8, 2, 64, Some(16), 50),
    (6, 3, 32, Some(33), 140),
    (4, 1, 256, Some(7), 13),
];

/// `grouped(kv, qs, kh, p, scale, res)` (a KV head's query heads together) against
/// `attend_head` per head, bit for bit, on every decode case with random K, V and q.
fn grouped_equals_per_head(
    seed: u64,
    grouped: impl Fn(&KvLayer, &[f32], usize, usize, f32, &mut [f32]),
) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (n_head, n_head_kv, head_dim, window, p) in DECODE_CASES {
        let slots = window.map_or(p + 1, |w| w + 3);
        let spec = KvLayerSpec {
            n_head,
            n_head_kv,
            head_dim,
            window,
            slots,
        };
        let kv = layer(spec, p + 1, &mut rng);
        let q: Vec<f32> = (0..n_head * head_dim)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let g = n_head / n_head_kv;
        let mut got = vec![f32::NAN; q.len()];
        for (kh, res) in got.chunks_mut(g * head_dim).enumerate() {
            let qs = &q[kh * g * head_dim..(kh + 1) * g * head_dim];
            grouped(&kv, qs, kh, p, scale, res);
        }
        let mut want = vec![f32::NAN; q.len()];
        for (h, o) in want.chunks_mut(head_dim).enumerate() {
            kv.attend_head(&q[h * head_dim..(h + 1) * head_dim], h, n_head, p, scale, o);
        }
        let what =
            format!("heads {n_head}/{n_head_kv} x {head_dim}, window {window:?}, position {p}");
        assert_eq!(bits(&got), bits(&want), "{what}");
        assert!(got.iter().all(|v| v.is_finite()), "{what}");
    }
}

/// Decode attention (`attend_kv_head`: K and V read as f16 by the AVX-512 and the AVX2
/// kernels, each that the CPU has) against `attend_head` per head, bit for bit.
#[test]
fn decode_attention_equals_per_head_attention_bitwise() {
    if attn::isas().is_empty() {
        return eprintln!("no AVX2: skipped");
    }
    for &isa in attn::isas() {
        grouped_equals_per_head(6, |kv, qs, kh, p, scale, res| {
            attn::attend_kv_head_with(isa, kv, qs, kh, p, scale, res)
        });
    }
}

/// `KvLayer::attend_group` (the path of CPUs without the batched kernels: a prefill's
/// attention) against `attend_head` per head, bit for bit, on every CPU.
#[test]
fn grouped_attention_equals_per_head_attention_bitwise() {
    grouped_equals_per_head(7, |kv, qs, kh, p, scale, res| {
        kv.attend_group(qs, kh, p, scale, res)
    });
}

/// Prefill (tiled matmuls, batched attention) against one token at a time (one-column dots,
/// per-head attention): every logit equal to the bit.
#[test]
fn prefill_logits_equal_decode_logits_bitwise() {
    for arch in ["llama", "qwen3", "muse"] {
        let t = Tiny::new(arch);
        let m = t.model();
        let toks = random_tokens(45, t.n_vocab, 9);
        let all = Session::new(&m, 64)
            .unwrap()
            .prefill_all(&toks)
            .unwrap()
            .to_vec();
        let mut s = Session::new(&m, 64).unwrap();
        let nv = t.n_vocab;
        for (i, &tok) in toks.iter().enumerate() {
            let l = s.decode(tok).unwrap();
            assert_eq!(
                bits(l),
                bits(&all[i * nv..(i + 1) * nv]),
                "{arch} position {i}"
            );
        }
    }
}

/// The cache returns what was stored: every (KV head, position) row a layer still holds reads
/// back as the f16 of the stored row, for full layers filled in uneven chunks and for rings
/// that wrapped several times; positions past the stored ones are not held.
#[test]
fn kv_rows_read_back_as_stored() {
    let mut rng = StdRng::seed_from_u64(11);
    // (n_head_kv, head_dim, window, slots, positions stored)
    let cases = [
        (2, 64, None, 300, 257),
        (3, 32, None, 40, 40),
        (1, 128, Some(16), 23, 101),
        (4, 16, Some(5), 9, 9),
    ];
    for (nkv, hd, window, slots, upto) in cases {
        let spec = KvLayerSpec {
            n_head: nkv * 2,
            n_head_kv: nkv,
            head_dim: hd,
            window,
            slots,
        };
        let w = nkv * hd;
        let k: Vec<f32> = (0..upto * w).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        let v: Vec<f32> = (0..upto * w).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        let mut kv = KvLayer::new(spec).unwrap();
        let mut pos = 0;
        while pos < upto {
            let n = rng.gen_range(1..=7usize).min(upto - pos);
            kv.store(&k[pos * w..(pos + n) * w], &v[pos * w..(pos + n) * w], pos);
            pos += n;
        }
        let first = window.map_or(0, |_| upto.saturating_sub(slots));
        for p in first..upto {
            assert!(kv.holds(p), "{spec:?}: position {p} not held");
            for kh in 0..nkv {
                let (a, s) = (kv.at(kh, p), p * w + kh * hd);
                for d in 0..hd {
                    assert_eq!(
                        kv.k()[a + d],
                        f16::from_f32(k[s + d]),
                        "{spec:?} K {kh} {p} {d}"
                    );
                    assert_eq!(
                        kv.v()[a + d],
                        f16::from_f32(v[s + d]),
                        "{spec:?} V {kh} {p} {d}"
                    );
                }
            }
        }
        if window.is_none() {
            assert!(
                !kv.holds(upto),
                "{spec:?}: position {upto} held before it was stored"
            );
        }
    }
    // A layer of no values (no KV head) is empty, not a bad cast of its one-byte map.
    let spec = KvLayerSpec {
        n_head: 0,
        n_head_kv: 0,
        head_dim: 64,
        window: None,
        slots: 16,
    };
    let kv = KvLayer::new(spec).unwrap();
    assert!(kv.k().is_empty() && kv.v().is_empty());
}
