//! Each CPU backend op against a short, obviously right scalar version on random non-zero
//! inputs (SPEC section 5 thresholds: elementwise and norms NMSE <= 1e-7, matmul and attention
//! <= 5e-4).

mod common;
use common::{nmse, quantize};
use half::f16;
use muser_engine::backend::cpu::CpuBuf;
use muser_engine::backend::{Backend, KvLayerSpec, NormArgs};
use muser_engine::config::{RopeParams, RopeStyle};
use muser_engine::weights::TensorView;
use muser_engine::CpuBackend;
use muser_gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn be() -> CpuBackend {
    CpuBackend::new(Some(2)).unwrap()
}

fn rand_vec(n: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0) + 0.01).collect()
}

fn buf(rows: usize, cols: usize, data: Vec<f32>) -> CpuBuf {
    CpuBuf { rows, cols, data }
}

/// A weight of `ty` and its dequantized values (what the reference computes with).
fn weight(
    be: &CpuBackend,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    rng: &mut StdRng,
) -> (muser_engine::backend::cpu::CpuWeight, Vec<f32>) {
    let vals = rand_vec(rows * cols, rng);
    let bytes = quantize(ty, &vals, cols);
    let mut deq = vec![0f32; rows * cols];
    let rb = bytes.len() / rows;
    for r in 0..rows {
        muser_quant::dequantize_row(
            ty,
            &bytes[r * rb..(r + 1) * rb],
            &mut deq[r * cols..(r + 1) * cols],
        )
        .unwrap();
    }
    let dims: Vec<u64> = if rows == 1 {
        vec![cols as u64]
    } else {
        vec![cols as u64, rows as u64]
    };
    let v = TensorView::owned("w", ty, &dims, bytes).unwrap();
    (be.weight(&v).unwrap(), deq)
}

fn ref_matmul(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * rows];
    for t in 0..n {
        for r in 0..rows {
            out[t * rows + r] = (0..cols)
                .map(|i| w[r * cols + i] as f64 * x[t * cols + i] as f64)
                .sum::<f64>() as f32;
        }
    }
    out
}

const TYPES: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn matmul_matches_dequantized_reference() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(1);
    for ty in TYPES {
        for &(rows, cols) in &[(37usize, 256usize), (300, 512), (5, 1024)] {
            for &n in &[1usize, 3, 17, 40] {
                let (w, deq) = weight(&be, ty, rows, cols, &mut rng);
                let (w2, deq2) = weight(&be, ty, 11, cols, &mut rng);
                let x = rand_vec(n * cols, &mut rng);
                let xb = buf(n, cols, x.clone());
                let mut o1 = be.buf(n, rows);
                let mut o2 = be.buf(n, 11);
                be.matmul(&xb, &mut [(&w, &mut o1), (&w2, &mut o2)]);
                let e1 = nmse(&o1.data, &ref_matmul(&deq, rows, cols, &x, n));
                let e2 = nmse(&o2.data, &ref_matmul(&deq2, 11, cols, &x, n));
                assert!(
                    e1 <= 5e-4 && e2 <= 5e-4,
                    "{ty} {rows}x{cols} n={n}: nmse {e1} {e2}"
                );
            }
        }
    }
}

/// Batch invariance at the op level: a matmul of n columns (the multi-column, tiled and Q8_0
/// tile kernels, with their leftover rows and columns) gives every column the bits of a
/// one-column matmul.
#[test]
fn matmul_columns_equal_one_column_matmuls_bitwise() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(11);
    for ty in TYPES {
        for &(rows, cols) in &[(37usize, 256usize), (8, 1280), (5, 768)] {
            for &n in &[2usize, 4, 5, 9, 12, 17, 33] {
                let (w, _) = weight(&be, ty, rows, cols, &mut rng);
                let x = rand_vec(n * cols, &mut rng);
                let mut all = be.buf(n, rows);
                be.matmul(&buf(n, cols, x.clone()), &mut [(&w, &mut all)]);
                for t in 0..n {
                    let mut one = be.buf(1, rows);
                    let xt = x[t * cols..(t + 1) * cols].to_vec();
                    be.matmul(&buf(1, cols, xt), &mut [(&w, &mut one)]);
                    let got: Vec<u32> = all.data[t * rows..(t + 1) * rows]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    let want: Vec<u32> = one.data.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{ty} {rows}x{cols}, column {t} of {n}");
                }
            }
        }
    }
}

/// Gate and up of the same and of different types: a Q8_0 gate splits its rows into tasks that
/// are not whole groups of the repacked Q4_K up (`x16`), which must still be served.
#[test]
fn gate_up_silu_matches_reference() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(2);
    let pairs = [
        (GgmlType::Q4_K, GgmlType::Q6_K, 96),
        (GgmlType::Q8_0, GgmlType::Q4_K, 300),
        (GgmlType::Q4_K, GgmlType::Q8_0, 300),
    ];
    for (tg, tu, rows) in pairs {
        for &n in &[1usize, 9] {
            let (g, gd) = weight(&be, tg, rows, 512, &mut rng);
            let (u, ud) = weight(&be, tu, rows, 512, &mut rng);
            let x = rand_vec(n * 512, &mut rng);
            let mut out = be.buf(n, rows);
            be.ffn_gate_up_silu(&buf(n, 512, x.clone()), &g, &u, &mut out);
            let (a, b) = (
                ref_matmul(&gd, rows, 512, &x, n),
                ref_matmul(&ud, rows, 512, &x, n),
            );
            let want: Vec<f32> = a
                .iter()
                .zip(&b)
                .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
                .collect();
            assert!(
                nmse(&out.data, &want) <= 5e-4,
                "{tg} gate, {tu} up, {n} columns"
            );
        }
    }
}

fn ref_rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    x.iter()
        .zip(w)
        .map(|(v, g)| (*v as f64 / (ms + eps as f64).sqrt() * *g as f64) as f32)
        .collect()
}

#[test]
fn norms_match_reference() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(3);
    let (w, wd) = weight(&be, GgmlType::F32, 1, 192, &mut rng);
    let x = rand_vec(3 * 192, &mut rng);
    let mut out = be.buf(3, 192);
    be.rmsnorm(&buf(3, 192, x.clone()), Some(&w), 1e-5, &mut out);
    let want: Vec<f32> = x
        .chunks(192)
        .flat_map(|r| ref_rmsnorm(r, &wd, 1e-5))
        .collect();
    assert!(nmse(&out.data, &want) <= 1e-7);
    // weightless (entry norm)
    be.rmsnorm(&buf(3, 192, x.clone()), None, 1e-5, &mut out);
    let want: Vec<f32> = x
        .chunks(192)
        .flat_map(|r| ref_rmsnorm(r, &[1.0; 192], 1e-5))
        .collect();
    assert!(nmse(&out.data, &want) <= 1e-7);
    // per head
    let (hw, hwd) = weight(&be, GgmlType::F32, 1, 64, &mut rng);
    let mut xb = buf(3, 192, x.clone());
    be.rmsnorm_heads(&mut xb, &hw, 64, 1e-6);
    let want: Vec<f32> = x
        .chunks(64)
        .flat_map(|h| ref_rmsnorm(h, &hwd, 1e-6))
        .collect();
    assert!(nmse(&xb.data, &want) <= 1e-7);
}

#[test]
fn residual_norm_matches_reference() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(4);
    let (pw, pwd) = weight(&be, GgmlType::F32, 1, 256, &mut rng);
    let (nw, nwd) = weight(&be, GgmlType::F32, 1, 256, &mut rng);
    let h0 = rand_vec(2 * 256, &mut rng);
    let x = rand_vec(2 * 256, &mut rng);
    for with_post in [false, true] {
        let mut h = buf(2, 256, h0.clone());
        let mut out = be.buf(2, 256);
        let post = with_post.then_some(NormArgs {
            weight: &pw,
            eps: 1e-8,
        });
        be.residual_norm(
            &mut h,
            &buf(2, 256, x.clone()),
            post,
            NormArgs {
                weight: &nw,
                eps: 1e-5,
            },
            &mut out,
        );
        let mut want_h = Vec::new();
        let mut want_o = Vec::new();
        for (hr, xr) in h0.chunks(256).zip(x.chunks(256)) {
            let br = if with_post {
                ref_rmsnorm(xr, &pwd, 1e-8)
            } else {
                xr.to_vec()
            };
            let nh: Vec<f32> = hr.iter().zip(&br).map(|(a, b)| a + b).collect();
            want_o.extend(ref_rmsnorm(&nh, &nwd, 1e-5));
            want_h.extend(nh);
        }
        assert!(nmse(&h.data, &want_h) <= 1e-7 && nmse(&out.data, &want_o) <= 1e-7);
    }
}

#[test]
fn rope_matches_formula() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(5);
    for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
        for n_rot in [64usize, 32] {
            let rope = RopeParams {
                style,
                freq_base: 10000.0,
                n_rot,
            };
            let x = rand_vec(3 * 128, &mut rng); // 3 rows, 2 heads of 64
            let mut xb = buf(3, 128, x.clone());
            be.rope(&mut xb, 64, &rope, 7);
            let mut want = x.clone();
            for t in 0..3 {
                for h in 0..2 {
                    let o = t * 128 + h * 64;
                    for i in 0..n_rot / 2 {
                        let th = (7 + t) as f64 / 10000f64.powf(2.0 * i as f64 / n_rot as f64);
                        let (a, b) = match style {
                            RopeStyle::Interleaved => (o + 2 * i, o + 2 * i + 1),
                            RopeStyle::Neox => (o + i, o + i + n_rot / 2),
                        };
                        let (x0, x1) = (x[a] as f64, x[b] as f64);
                        want[a] = (x0 * th.cos() - x1 * th.sin()) as f32;
                        want[b] = (x0 * th.sin() + x1 * th.cos()) as f32;
                    }
                }
            }
            assert!(nmse(&xb.data, &want) <= 1e-7, "{style:?} n_rot {n_rot}");
        }
    }
}

#[test]
fn gate_and_lm_head_match_reference() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(6);
    let a = rand_vec(64, &mut rng);
    let g = rand_vec(64, &mut rng);
    let mut ab = buf(1, 64, a.clone());
    be.sigmoid_gate(&mut ab, &buf(1, 64, g.clone()));
    let want: Vec<f32> = a
        .iter()
        .zip(&g)
        .map(|(a, g)| a / (1.0 + (-g).exp()))
        .collect();
    assert!(nmse(&ab.data, &want) <= 1e-7);

    let (w, wd) = weight(&be, GgmlType::Q8_0, 50, 256, &mut rng);
    let x = rand_vec(3 * 256, &mut rng);
    for softcap in [None, Some(0.5f32)] {
        let mut out = be.buf(2, 50);
        be.lm_head(&buf(3, 256, x.clone()), 1, &w, 0.7, softcap, &mut out);
        let want: Vec<f32> = ref_matmul(&wd, 50, 256, &x[256..], 2)
            .iter()
            .map(|v| match softcap {
                Some(c) => c * (v * 0.7 / c).tanh(),
                None => v * 0.7,
            })
            .collect();
        assert!(nmse(&out.data, &want) <= 5e-4, "{softcap:?}");
    }
}

#[test]
fn attention_matches_naive_reference() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(7);
    let (n_head, n_kv, hd) = (4usize, 2usize, 32usize);
    for window in [None, Some(5usize)] {
        // Ring of 7 slots for a window of 5 (batches of up to 3 rows).
        let spec = KvLayerSpec {
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
            window,
            slots: if window.is_some() { 7 } else { 64 },
        };
        let mut kv = be.kv_cache(&[spec]).unwrap();
        let (mut ks, mut vs) = (Vec::new(), Vec::new()); // f16-rounded history
        let mut pos = 0;
        for n in [3usize, 1, 3, 2, 1, 3] {
            let k = rand_vec(n * n_kv * hd, &mut rng);
            let v = rand_vec(n * n_kv * hd, &mut rng);
            let q = rand_vec(n * n_head * hd, &mut rng);
            be.kv_store(
                &mut kv,
                0,
                &buf(n, n_kv * hd, k.clone()),
                &buf(n, n_kv * hd, v.clone()),
                pos,
            );
            ks.extend(k.iter().map(|x| f16::from_f32(*x).to_f32()));
            vs.extend(v.iter().map(|x| f16::from_f32(*x).to_f32()));
            let mut out = be.buf(n, n_head * hd);
            let scale = 1.0 / (hd as f32).sqrt();
            be.attention(
                &buf(n, n_head * hd, q.clone()),
                &kv,
                0,
                pos,
                scale,
                &mut out,
            );
            let mut want = vec![0f32; n * n_head * hd];
            for t in 0..n {
                let p = pos + t;
                let lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
                for h in 0..n_head {
                    let kh = h / (n_head / n_kv);
                    let qh = &q[(t * n_head + h) * hd..][..hd];
                    let s: Vec<f64> = (lo..=p)
                        .map(|j| {
                            (0..hd)
                                .map(|i| qh[i] as f64 * ks[(j * n_kv + kh) * hd + i] as f64)
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for i in 0..hd {
                        want[(t * n_head + h) * hd + i] = (lo..=p)
                            .zip(&s)
                            .map(|(j, sj)| (sj - m).exp() / z * vs[(j * n_kv + kh) * hd + i] as f64)
                            .sum::<f64>()
                            as f32;
                    }
                }
            }
            let e = nmse(&out.data, &want);
            // Same f16-rounded K/V on both sides: only f32 rounding separates them.
            assert!(e <= 1e-9, "window {window:?} pos {pos}: nmse {e}");
            pos += n;
        }
    }
}

#[test]
fn embed_returns_dequantized_rows() {
    let be = be();
    let mut rng = StdRng::seed_from_u64(8);
    let (w, wd) = weight(&be, GgmlType::Q6_K, 20, 256, &mut rng);
    let mut out = be.buf(3, 256);
    be.embed(&w, &[4, 19, 4], &mut out);
    for (t, tok) in [4usize, 19, 4].iter().enumerate() {
        assert_eq!(out.row(t), &wd[tok * 256..(tok + 1) * 256]);
    }
}

/// A thread count outside 1..=MAX_THREADS is an error naming the bound, before any thread
/// starts (100,000 threads took the OS over a minute to start); counts inside it start.
#[test]
fn thread_counts_out_of_range_are_errors() {
    use muser_engine::backend::cpu::MAX_THREADS;
    for (n, bound) in [
        (0, "at least 1"),
        (MAX_THREADS + 1, "at most 512"),
        (100_000, "at most 512"),
    ] {
        let err = CpuBackend::new(Some(n)).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains(bound)),
            "{n} threads: {err:?}"
        );
    }
    for n in [1, 3] {
        assert!(CpuBackend::new(Some(n)).is_ok(), "{n} threads refused");
    }
}
