//! Speed of a level's multi-column K-quant dots against its one-column dot, one thread (not a
//! test: `cargo test --release -p muser-quant --test cols_speed -- --ignored --nocapture`).

use muser_quant::simd::Kernels;
use muser_quant::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn blocks<W: bytemuck::Pod>(count: usize, rng: &mut StdRng) -> Vec<W> {
    let mut v: Vec<W> = vec![bytemuck::Zeroable::zeroed(); count];
    rng.fill(bytemuck::cast_slice_mut::<W, u8>(&mut v));
    v
}

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

#[test]
#[ignore]
fn multi_column_dots_against_one_column() {
    for (rows, kk) in [(512usize, 2048usize), (256, 7168)] {
        speed(rows, kk, 16);
    }
}

fn speed(rows: usize, kk: usize, n: usize) {
    let mut rng = StdRng::seed_from_u64(7);
    let nb = kk / QK_K;
    let mut w4: Vec<BlockQ4K> = blocks(rows * nb, &mut rng);
    w4.iter_mut().for_each(|b| {
        b.d = half::f16::from_f32(0.01);
        b.dmin = half::f16::from_f32(0.01)
    });
    let mut y: Vec<BlockQ8K> = blocks(n * nb, &mut rng);
    y.iter_mut().for_each(|b| b.d = 0.01);
    for k in Kernels::all_available()
        .into_iter()
        .filter(|k| k.cols.is_some())
    {
        let kc = k.cols.unwrap();
        let col = |t: usize| &y[t * nb..(t + 1) * nb];
        let mut sink = 0.0f32;
        let one = best(20, || {
            for r in 0..rows {
                for t in 0..n {
                    sink += (k.dot_q4_k_q8_k)(&w4[r * nb..(r + 1) * nb], col(t));
                }
            }
        });
        let (c8, c4) = (
            time_cols(&w4, nb, &y, n, kc.q4_k8, &mut sink),
            time_cols(&w4, nb, &y, n, kc.q4_k4, &mut sink),
        );
        let macs = (rows * kk * n) as f64;
        println!(
            "{} Q4_K {rows}x{kk} x {n} columns: one-column {:.1} GMAC/s, x4 {:.1}, x8 {:.1} ({sink})",
            k.isa,
            macs / one / 1e9,
            macs / c4 / 1e9,
            macs / c8 / 1e9
        );
    }
}

/// Best time of `cols` over every row of `w` (rows of nb blocks) against the n columns of `y`,
/// C at a time.
fn time_cols<const C: usize>(
    w: &[BlockQ4K],
    nb: usize,
    y: &[BlockQ8K],
    n: usize,
    cols: muser_quant::simd::DotCols<BlockQ4K, C>,
    sink: &mut f32,
) -> f64 {
    let col = |t: usize| &y[t * nb..(t + 1) * nb];
    best(20, || {
        for row in w.chunks_exact(nb) {
            for t0 in (0..n).step_by(C) {
                *sink += cols(row, std::array::from_fn(|c| col(t0 + c)))[0];
            }
        }
    })
}
