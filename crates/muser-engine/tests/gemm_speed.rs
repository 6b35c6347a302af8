//! Speed of the prefill matmul kernels on one thread (not a test: run with
//! `cargo test --release -p muser-engine --test gemm_speed -- --ignored --nocapture`).
#![cfg(target_arch = "x86_64")]

use muser_engine::backend::cpu::{gemm, tile};
use muser_quant::quantize::quantize_row_q8_k_ref;
use muser_quant::{BlockQ4K, BlockQ6K, BlockQ8K};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn blocks<W: bytemuck::Pod>(count: usize, rng: &mut StdRng, fix: impl Fn(&mut W)) -> Vec<W> {
    let mut v: Vec<W> = vec![bytemuck::Zeroable::zeroed(); count];
    rng.fill(bytemuck::cast_slice_mut::<W, u8>(&mut v));
    v.iter_mut().for_each(fix);
    v
}

fn columns(n: usize, nb: usize, rng: &mut StdRng) -> Vec<BlockQ8K> {
    let x: Vec<f32> = (0..n * nb * 256)
        .map(|_| rng.gen_range(-2.0f32..2.0))
        .collect();
    let mut y = vec![bytemuck::Zeroable::zeroed(); n * nb];
    quantize_row_q8_k_ref(&x, &mut y);
    y
}

/// Best of `reps` timings of f, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// The old path: 8 then 4 columns per weight row (multi-column dots).
fn old<W: bytemuck::Pod>(
    w: &[W],
    rows: usize,
    y: &[BlockQ8K],
    n: usize,
    out: &mut [f32],
    d8: gemm::DotN<W, 8>,
) {
    let nb = w.len() / rows;
    for t0 in (0..n).step_by(16) {
        for r in 0..rows {
            let wr = &w[r * nb..(r + 1) * nb];
            for t in (t0..(t0 + 16).min(n)).step_by(8) {
                let v = d8(
                    wr,
                    std::array::from_fn(|k| &y[(t + k) * nb..(t + k + 1) * nb]),
                );
                for k in 0..8 {
                    out[(t + k) * rows + r] = v[k];
                }
            }
        }
    }
}

#[test]
#[ignore]
fn prefill_kernel_speed() {
    let Some(g4) = tile::q4_k_gemm() else { return };
    let g6 = tile::q6_k_gemm().unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let n: usize = std::env::var("MUSER_SPEED_N").map_or(512, |v| v.parse().unwrap());
    // MUSER_SPEED_ONLY=attn: batched prefill attention of 512 rows (32 heads of 64 over 8 KV
    // heads), on a one-thread pool.
    if std::env::var("MUSER_SPEED_ONLY").is_ok_and(|v| v == "attn") {
        use muser_engine::backend::cpu::{attn, kv::KvLayer};
        use muser_engine::backend::KvLayerSpec;
        let (nh, nkv, hd, rows) = (32usize, 8usize, 64usize, 512usize);
        let spec = KvLayerSpec {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            window: None,
            slots: rows,
        };
        let mut kv = KvLayer::new(spec).unwrap();
        let k: Vec<f32> = (0..rows * nkv * hd)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        kv.store(&k, &k, 0);
        let q: Vec<f32> = (0..rows * nh * hd)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let mut out = vec![0f32; q.len()];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let t = pool.install(|| best(5, || attn::attend(&kv, &q, nh, 0, 0.125, &mut out)));
        let pairs = (rows * (rows + 1) / 2 * nh) as f64;
        println!(
            "attention 512 rows: {:.2} ms, {:.2} ns per (query, key)",
            t * 1e3,
            t / pairs * 1e9
        );
        return;
    }
    // MUSER_SPEED_ONLY=tile4: the 4-column-group kernels against the column kernels on
    // llama-1b's shapes, MUSER_SPEED_N columns (4 to 15), one thread.
    if std::env::var("MUSER_SPEED_ONLY").is_ok_and(|v| v == "tile4") {
        use muser_engine::backend::cpu::tile4;
        let n = n.min(15);
        for (name, rows, cols) in [
            ("gate/up 7168x2048", 7168usize, 2048usize),
            ("down 2048x7168", 2048, 7168),
            ("q/o 2048x2048", 2048, 2048),
            ("beyond L3 65536x2048", 65536, 2048),
        ] {
            let nb = cols / 256;
            let y = columns(n, nb, &mut rng);
            let w = blocks(rows * nb, &mut rng, |b: &mut BlockQ4K| {
                b.d = half::f16::from_f32(0.01);
                b.dmin = half::f16::from_f32(0.01)
            });
            let macs = (rows * cols * n) as f64;
            let panel = tile4::Panel4::new(&y, n, nb);
            let chunk: usize = std::env::var("MUSER_SPEED_ROWS").map_or(64, |v| v.parse().unwrap());
            let mut out = vec![0f32; chunk * n];
            let t4 = best(3, || {
                for r0 in (0..rows).step_by(chunk) {
                    let r1 = (r0 + chunk).min(rows);
                    tile4::gemm_q4_k(
                        &w[r0 * nb..r1 * nb],
                        r1 - r0,
                        &panel,
                        &mut out[..(r1 - r0) * n],
                    )
                }
            });
            let k4 = gemm::q4_k_cols::<4>().unwrap();
            let mut out = vec![0f32; rows * n];
            let tc = best(3, || {
                for r in 0..rows {
                    let wr = &w[r * nb..(r + 1) * nb];
                    let mut c = 0;
                    while c + 4 <= n {
                        let v = k4(
                            wr,
                            std::array::from_fn(|k| &y[(c + k) * nb..(c + k + 1) * nb]),
                        );
                        for k in 0..4 {
                            out[(c + k) * rows + r] = v[k];
                        }
                        c += 4;
                    }
                }
            });
            println!(
                "{name} n={n}: tile4 {:.1} GMAC/s, 4-column dots {:.1} GMAC/s",
                macs / t4 / 1e9,
                macs / tc / 1e9
            );
        }
        return;
    }
    // MUSER_SPEED_ONLY=q8_0: the tiled Q8_0 kernel (tasks of `tile_q8_0::rows_per_task` rows)
    // against the register tiles of `gemm::q8_0_matmul` (tasks of 64 rows) and the one-column
    // dots on llama-1b's shapes, MUSER_SPEED_N columns, one thread.
    if std::env::var("MUSER_SPEED_ONLY").is_ok_and(|v| v == "q8_0") {
        use muser_engine::backend::cpu::tile_q8_0;
        use muser_quant::quantize::quantize_row_q8_0_ref;
        use muser_quant::BlockQ8_0;
        for (name, rows, cols) in [
            ("gate/up 7168x2048", 7168usize, 2048usize),
            ("down 2048x7168", 2048, 7168),
            ("q/o 2048x2048", 2048, 2048),
            ("k/v 512x2048", 512, 2048),
            ("2048x512 (a column group's blocks in L1)", 2048, 512),
        ] {
            let nb = cols / 32;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut y: Vec<BlockQ8_0> = vec![bytemuck::Zeroable::zeroed(); n * nb];
            quantize_row_q8_0_ref(&x, &mut y);
            let w = blocks(rows * nb, &mut rng, |b: &mut BlockQ8_0| {
                b.d = half::f16::from_f32(0.01)
            });
            let macs = (rows * cols * n) as f64;
            let panel = tile_q8_0::PanelQ8_0::new(&y, n, nb);
            let chunk = tile_q8_0::rows_per_task(nb);
            let mut out = vec![0f32; chunk.max(64) * n];
            let tt = best(3, || {
                for r0 in (0..rows).step_by(chunk) {
                    let r1 = (r0 + chunk).min(rows);
                    let o = &mut out[..(r1 - r0) * n];
                    tile_q8_0::gemm_q8_0(&w[r0 * nb..r1 * nb], r1 - r0, &panel, o)
                }
            });
            let mm = gemm::q8_0_matmul().unwrap();
            let tg = best(3, || {
                for r0 in (0..rows).step_by(64) {
                    let r1 = (r0 + 64).min(rows);
                    mm(
                        &w[r0 * nb..r1 * nb],
                        r1 - r0,
                        &y,
                        n,
                        &mut out[..(r1 - r0) * n],
                    )
                }
            });
            // The one-column dots (decode's kernel below 4 columns), row by row.
            let dot = muser_quant::simd::Kernels::detect().dot_q8_0_q8_0;
            let td = best(3, || {
                for r in 0..rows {
                    for t in 0..n {
                        out[t] = dot(&w[r * nb..(r + 1) * nb], &y[t * nb..(t + 1) * nb]);
                    }
                }
            });
            println!(
                "{name} n={n}: tile_q8_0 {:.1} GMAC/s ({chunk}-row tasks), q8_0_matmul {:.1} GMAC/s, \
                 one-column dots {:.1} GMAC/s",
                macs / tt / 1e9,
                macs / tg / 1e9,
                macs / td / 1e9
            );
        }
        return;
    }
    // MUSER_SPEED_ONLY=shapes: the tiled kernels on llama-1b's prefill shapes, one thread,
    // tasks of 64 rows as the backend splits them.
    if std::env::var("MUSER_SPEED_ONLY").is_ok_and(|v| v == "shapes") {
        for (name, rows, cols, q6) in [
            ("gate/up 7168x2048 q4_k", 7168usize, 2048usize, false),
            ("down 2048x7168 q4_k", 2048, 7168, false),
            ("down 2048x7168 q6_k", 2048, 7168, true),
            ("q/o 2048x2048 q4_k", 2048, 2048, false),
        ] {
            let nb = cols / 256;
            let y = columns(n, nb, &mut rng);
            let panel = tile::Panel::new(&y, n, nb);
            let chunk = tile::rows_per_task(nb);
            let mut out = vec![0f32; chunk * n];
            let macs = (rows * cols * n) as f64;
            let t = if q6 {
                let w = blocks(rows * nb, &mut rng, |b: &mut BlockQ6K| {
                    b.d = half::f16::from_f32(0.01)
                });
                best(3, || {
                    for r0 in (0..rows).step_by(chunk) {
                        let r1 = (r0 + chunk).min(rows);
                        tile::gemm_q6_k(
                            &w[r0 * nb..r1 * nb],
                            r1 - r0,
                            &panel,
                            &mut out[..(r1 - r0) * n],
                        )
                    }
                })
            } else {
                let w = blocks(rows * nb, &mut rng, |b: &mut BlockQ4K| {
                    b.d = half::f16::from_f32(0.01);
                    b.dmin = half::f16::from_f32(0.01)
                });
                best(3, || {
                    for r0 in (0..rows).step_by(chunk) {
                        let r1 = (r0 + chunk).min(rows);
                        tile::gemm_q4_k(
                            &w[r0 * nb..r1 * nb],
                            r1 - r0,
                            &panel,
                            &mut out[..(r1 - r0) * n],
                        )
                    }
                })
            };
            println!("{name}: {:.1} GMAC/s ({:.1} ms)", macs / t / 1e9, t * 1e3);
            // The multi-column dots (8, then 4 columns) on the same shape, for comparison.
            if !q6 && n.is_multiple_of(4) {
                let w = blocks(rows * nb, &mut rng, |b: &mut BlockQ4K| {
                    b.d = half::f16::from_f32(0.01);
                    b.dmin = half::f16::from_f32(0.01)
                });
                let (k8, k4) = (
                    gemm::q4_k_cols::<8>().unwrap(),
                    gemm::q4_k_cols::<4>().unwrap(),
                );
                let mut out = vec![0f32; rows * n];
                let t = best(3, || {
                    for r in 0..rows {
                        let wr = &w[r * nb..(r + 1) * nb];
                        let mut c = 0;
                        while c + 8 <= n {
                            let v = k8(
                                wr,
                                std::array::from_fn(|k| &y[(c + k) * nb..(c + k + 1) * nb]),
                            );
                            for k in 0..8 {
                                out[(c + k) * rows + r] = v[k];
                            }
                            c += 8;
                        }
                        if c + 4 <= n {
                            let v = k4(
                                wr,
                                std::array::from_fn(|k| &y[(c + k) * nb..(c + k + 1) * nb]),
                            );
                            for k in 0..4 {
                                out[(c + k) * rows + r] = v[k];
                            }
                        }
                    }
                });
                println!("  (multi-column dots: {:.1} GMAC/s)", macs / t / 1e9);
            }
        }
        return;
    }
    let chunk = 64; // rows per task
    for (name, cols) in [("K=2048", 2048usize), ("K=7168", 7168)] {
        let nb = cols / 256;
        let y = columns(n, nb, &mut rng);
        let w4 = blocks(chunk * nb, &mut rng, |b: &mut BlockQ4K| {
            b.d = half::f16::from_f32(0.01);
            b.dmin = half::f16::from_f32(0.01)
        });
        let w6 = blocks(chunk * nb, &mut rng, |b: &mut BlockQ6K| {
            b.d = half::f16::from_f32(0.01)
        });
        let mut out = vec![0f32; chunk * n];
        let macs = (chunk * cols * n) as f64;
        let t = best(3, || g4(&w4, chunk, &y, n, &mut out));
        println!(
            "q4_k tiled, panel built inside  {name}: {:.1} GMAC/s",
            macs / t / 1e9
        );
        let panel = tile::Panel::new(&y, n, nb);
        let t = best(5, || tile::gemm_q4_k(&w4, chunk, &panel, &mut out));
        println!("q4_k tiled  {name}: {:.1} GMAC/s", macs / t / 1e9);
        let t = best(3, || g6(&w6, chunk, &y, n, &mut out));
        println!(
            "q6_k tiled, panel built inside  {name}: {:.1} GMAC/s",
            macs / t / 1e9
        );
        let t = best(5, || tile::gemm_q6_k(&w6, chunk, &panel, &mut out));
        println!("q6_k tiled  {name}: {:.1} GMAC/s", macs / t / 1e9);
        let t = best(3, || {
            old(&w4, chunk, &y, n, &mut out, gemm::q4_k_cols::<8>().unwrap())
        });
        println!("q4_k cols8  {name}: {:.1} GMAC/s", macs / t / 1e9);
        let t = best(3, || {
            old(&w6, chunk, &y, n, &mut out, gemm::q6_k_cols::<8>().unwrap())
        });
        println!("q6_k cols8  {name}: {:.1} GMAC/s", macs / t / 1e9);
    }
}

/// One thread, GB/s of weights per pass over all the columns: the GGUF-layout one-column dots
/// against the repacked kernels of `x16`, for 1, 2 and 4 columns, each format over a 8192 x 8192
/// matrix (38-55 MB: streamed from memory past this CPU's L3) and a 512 x 2048 one (in L2), at
/// each level this CPU runs (AVX-512: 16-row groups against the AVX-512 dots; AVX2: 8-row groups
/// against the AVX2 dots). Run: `cargo test --release -p muser-engine --test gemm_speed x16 --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn x16_decode_speed() {
    use muser_engine::backend::cpu::x16::X16;
    use muser_gguf::GgmlType;
    use muser_quant::simd::Kernels;
    use muser_quant::BlockQ5K;
    let mut rng = StdRng::seed_from_u64(3);
    fn one_col<W>(
        w: &[W],
        rows: usize,
        y: &[BlockQ8K],
        n: usize,
        out: &mut [f32],
        dot: fn(&[W], &[BlockQ8K]) -> f32,
    ) {
        let nb = w.len() / rows;
        for t in 0..n {
            for r in 0..rows {
                out[t * rows + r] = dot(&w[r * nb..(r + 1) * nb], &y[t * nb..(t + 1) * nb]);
            }
        }
    }
    for (level, k, r) in [
        ("avx512", Kernels::avx512(), 16),
        ("avx2", Kernels::avx2(), 8),
    ] {
        let Some(k) = k else {
            println!("{level}: not on this CPU");
            continue;
        };
        for (rows, kk) in [(8192usize, 8192usize), (512, 2048)] {
            let nb = kk / 256;
            let small = |rng: &mut StdRng| half::f16::from_f32(rng.gen_range(-1.0f32..1.0) * 1e-2);
            let mut w4: Vec<BlockQ4K> = blocks(rows * nb, &mut rng, |_| {});
            let mut w5: Vec<BlockQ5K> = blocks(rows * nb, &mut rng, |_| {});
            let mut w6: Vec<BlockQ6K> = blocks(rows * nb, &mut rng, |_| {});
            w4.iter_mut()
                .for_each(|b| (b.d, b.dmin) = (small(&mut rng), small(&mut rng)));
            w5.iter_mut()
                .for_each(|b| (b.d, b.dmin) = (small(&mut rng), small(&mut rng)));
            w6.iter_mut().for_each(|b| b.d = small(&mut rng));
            let x = |ty, b: &[u8]| X16::with_rows(ty, b, rows, nb, r).unwrap();
            let x4 = x(GgmlType::Q4_K, bytemuck::cast_slice(&w4));
            let x5 = x(GgmlType::Q5_K, bytemuck::cast_slice(&w5));
            let x6 = x(GgmlType::Q6_K, bytemuck::cast_slice(&w6));
            let reps = if rows > 1000 { 5 } else { 200 };
            for n in [1usize, 2, 4, 16, 64] {
                let y = columns(n, nb, &mut rng);
                let mut out = vec![0f32; rows * n];
                let row = |name: &str, bytes: usize, a: f64, b: f64| {
                    println!(
                        "{level} {name} {rows} x {kk}, {n} col: one-column dots {:6.1} GB/s, x16 ({r} rows) {:6.1} GB/s",
                        bytes as f64 / a / 1e9,
                        bytes as f64 / b / 1e9
                    );
                };
                // SAFETY (each gemm_into): out holds n x rows outputs.
                let a = best(reps, || {
                    one_col(&w4, rows, &y, n, &mut out, k.dot_q4_k_q8_k)
                });
                let b = best(reps, || unsafe {
                    x4.gemm_into(&y, n, 0, rows, out.as_mut_ptr(), rows)
                });
                row("Q4_K", w4.len() * 144, a, b);
                let a = best(reps, || {
                    one_col(&w5, rows, &y, n, &mut out, k.dot_q5_k_q8_k)
                });
                let b = best(reps, || unsafe {
                    x5.gemm_into(&y, n, 0, rows, out.as_mut_ptr(), rows)
                });
                row("Q5_K", w5.len() * 176, a, b);
                let a = best(reps, || {
                    one_col(&w6, rows, &y, n, &mut out, k.dot_q6_k_q8_k)
                });
                let b = best(reps, || unsafe {
                    x6.gemm_into(&y, n, 0, rows, out.as_mut_ptr(), rows)
                });
                row("Q6_K", w6.len() * 210, a, b);
                if let (true, Some(t4)) = (n >= 16, muser_engine::backend::cpu::tile::q4_k_gemm()) {
                    // The prefill tiles the repacking replaced (16 columns a tile).
                    let t = best(reps, || t4(&w4, rows, &y, n, &mut out));
                    println!(
                        "{level} Q4_K {rows} x {kk}, {n} col: tile.rs {:6.1} GB/s",
                        w4.len() as f64 * 144.0 / t / 1e9
                    );
                }
            }
        }
    }
}

/// Decode attention at depth: one row per layer over 16 layers of llama-1b's shape (32 query
/// heads of 64 over 8 KV heads), every layer's cache at `MUSER_SPEED_DEPTH` positions (default
/// 4096: 134 MB in all, streamed from memory), on pools of 1 and 2 threads, with each kernel
/// level this CPU runs (AVX-512, AVX2); ms per step (the 16 layers) and GB/s of K and V read.
/// Run: `cargo test --release -p muser-engine --test gemm_speed decode_attention -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn decode_attention_speed() {
    use muser_engine::backend::cpu::{attn, kv::KvLayer};
    use muser_engine::backend::KvLayerSpec;
    use rayon::prelude::*;
    let (nh, nkv, hd, layers) = (32usize, 8usize, 64usize, 16usize);
    let depth: usize = std::env::var("MUSER_SPEED_DEPTH").map_or(4096, |v| v.parse().unwrap());
    let window: Option<usize> = std::env::var("MUSER_SPEED_WINDOW")
        .ok()
        .map(|v| v.parse().unwrap());
    let mut rng = StdRng::seed_from_u64(5);
    let kvs: Vec<KvLayer> = (0..layers)
        .map(|_| {
            let spec = KvLayerSpec {
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                // MUSER_SPEED_WINDOW=W: sliding layers (a ring of W slots, the last W positions).
                window: window.map(|w| w.min(depth)),
                slots: window.map_or(depth, |w| w.min(depth)),
            };
            let mut kv = KvLayer::new(spec).unwrap();
            let k: Vec<f32> = (0..depth * nkv * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let v: Vec<f32> = (0..depth * nkv * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            kv.store(&k, &v, 0);
            kv
        })
        .collect();
    let q: Vec<f32> = (0..nh * hd).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let mut out = vec![0f32; q.len()];
    let seen = window.map_or(depth, |w| w.min(depth));
    let bytes = (layers * seen * nkv * hd * 2 * 2) as f64;
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        // Every kernel level this CPU runs, as `KvLayer::attend` runs a decode row: one task
        // per KV head.
        for &isa in attn::isas() {
            let g = nh / nkv;
            let t = pool.install(|| {
                best(7, || {
                    for kv in &kvs {
                        out.par_chunks_mut(g * hd)
                            .enumerate()
                            .for_each(|(kh, res)| {
                                let qs = &q[kh * g * hd..(kh + 1) * g * hd];
                                attn::attend_kv_head_with(isa, kv, qs, kh, depth - 1, 0.125, res);
                            });
                    }
                })
            });
            println!(
                "decode attention ({isa:?}), depth {depth}, {threads} thread(s): {:.3} ms a step, \
                 {:.1} GB/s",
                t * 1e3,
                bytes / t / 1e9
            );
        }
    }
}
