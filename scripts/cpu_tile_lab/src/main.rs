//! Lab (not part of Muser's build): a Q4_K x Q8_K prefill tile with columns across lanes and
//! exact integer sums per block (the order of cpu-prefill-plan.md), against Muser's current
//! register tiles (`tile.rs`) on one thread. Checks its output bit for bit against a scalar
//! reference of the same order, then times both.
use muser_quant::blocks::scale_min_k4;
use muser_quant::quantize::quantize_row_q8_k_ref;
use muser_quant::{BlockQ4K, BlockQ8K, QK_K};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::arch::x86_64::*;
use std::time::Instant;

const TR: usize = 16; // rows of a tile
const TC: usize = 16; // columns of a tile (zmm lanes)
const CHUNK: usize = 128; // columns per outer chunk

/// Scalar reference of the new order: per block exact isc, im; v = dx * fma(d, isc, -(dmin * im)); y += v.
fn reference(w: &[BlockQ4K], rows: usize, y: &[BlockQ8K], n: usize, out: &mut [f32]) {
    let nb = w.len() / rows;
    for c in 0..n {
        for r in 0..rows {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let bw = &w[r * nb + b];
                let by = &y[c * nb + b];
                let (mut isc, mut im) = (0i32, 0i32);
                for s in 0..8 {
                    let (sc, m) = scale_min_k4(s, &bw.scales);
                    let mut dot = 0i32;
                    for l in 0..32 {
                        let v = 32 * s + l;
                        let j = v / 64;
                        let byte = bw.qs[32 * j + (v % 32)];
                        let q = if (v % 64) < 32 { byte & 15 } else { byte >> 4 };
                        dot += q as i32 * by.qs[v] as i32;
                    }
                    isc += sc as i32 * dot;
                    im += m as i32 * (by.bsums[2 * s] as i32 + by.bsums[2 * s + 1] as i32);
                }
                let v = by.d * (bw.d.to_f32()).mul_add(isc as f32, -(bw.dmin.to_f32() * im as f32));
                acc += v;
            }
            out[c * rows + r] = acc;
        }
    }
}

/// Activations of one group of 16 columns, one block: a[g][c][4] (64 groups of 4 values), the
/// sub-block sums as i16 pairs s[p][c] (sub-blocks 2p, 2p + 1), dx[c].
#[repr(C, align(64))]
struct ActTile {
    a: [i8; 64 * TC * 4],
    s: [i32; 4 * TC],
    dx: [f32; TC],
}

/// Weights of 16 rows, one block: q[r][256] bytes, sc[r][8] i32, mn[r][4] i16 pairs, d, dmin.
#[repr(C, align(64))]
struct WTile {
    q: [u8; TR * QK_K],
    sc: [i32; TR * 8],
    mn: [i32; TR * 4],
    d: [f32; TR],
    dmin: [f32; TR],
}

fn act_tiles(y: &[BlockQ8K], n: usize, nb: usize) -> Vec<ActTile> {
    let groups = n / TC;
    let mut v: Vec<ActTile> = (0..groups * nb)
        .map(|_| ActTile {
            a: [0; 64 * TC * 4],
            s: [0; 4 * TC],
            dx: [0.0; TC],
        })
        .collect();
    for gcol in 0..groups {
        for b in 0..nb {
            let t = &mut v[gcol * nb + b];
            for c in 0..TC {
                let by = &y[(gcol * TC + c) * nb + b];
                for g in 0..64 {
                    for k in 0..4 {
                        t.a[(g * TC + c) * 4 + k] = by.qs[4 * g + k];
                    }
                }
                for p in 0..4 {
                    let s0 = by.bsums[4 * p] as i32 + by.bsums[4 * p + 1] as i32;
                    let s1 = by.bsums[4 * p + 2] as i32 + by.bsums[4 * p + 3] as i32;
                    t.s[p * TC + c] = (s0 & 0xffff) | (s1 << 16);
                }
                t.dx[c] = by.d;
            }
        }
    }
    v
}

fn unpack(w: &[BlockQ4K], nb: usize, r0: usize, b: usize, t: &mut WTile) {
    for r in 0..TR {
        let bw = &w[(r0 + r) * nb + b];
        for j in 0..4 {
            for l in 0..32 {
                let byte = bw.qs[32 * j + l];
                t.q[r * QK_K + 64 * j + l] = byte & 15;
                t.q[r * QK_K + 64 * j + 32 + l] = byte >> 4;
            }
        }
        for s in 0..8 {
            let (sc, m) = scale_min_k4(s, &bw.scales);
            t.sc[r * 8 + s] = sc as i32;
            if s % 2 == 0 {
                let (_, m1) = scale_min_k4(s + 1, &bw.scales);
                t.mn[r * 4 + s / 2] = (m as i32) | ((m1 as i32) << 16);
            }
        }
        t.d[r] = bw.d.to_f32();
        t.dmin[r] = bw.dmin.to_f32();
    }
}

// The row index addresses the accumulators, the scales and the f32 sums together.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile(w: &WTile, a: &ActTile, y: &mut [__m512; TR]) {
    let mut isc = [_mm512_setzero_si512(); TR];
    for s in 0..8 {
        let mut ag = [_mm512_setzero_si512(); 8];
        for (g, v) in ag.iter_mut().enumerate() {
            *v = _mm512_load_si512(a.a.as_ptr().add((8 * s + g) * TC * 4) as *const _);
        }
        for r in 0..TR {
            let mut t = _mm512_setzero_si512();
            let base = w.q.as_ptr().add(r * QK_K + 32 * s) as *const i32;
            for (g, av) in ag.iter().enumerate() {
                t = _mm512_dpbusd_epi32(t, _mm512_set1_epi32(base.add(g).read_unaligned()), *av);
            }
            isc[r] = _mm512_add_epi32(
                isc[r],
                _mm512_mullo_epi32(t, _mm512_set1_epi32(w.sc[r * 8 + s])),
            );
        }
    }
    let sp: [__m512i; 4] =
        std::array::from_fn(|p| _mm512_load_si512(a.s.as_ptr().add(p * TC) as *const _));
    let dx = _mm512_load_ps(a.dx.as_ptr());
    for r in 0..TR {
        let mut im = _mm512_setzero_si512();
        for (p, s) in sp.iter().enumerate() {
            im = _mm512_dpwssd_epi32(im, _mm512_set1_epi32(w.mn[r * 4 + p]), *s);
        }
        let fi = _mm512_cvtepi32_ps(isc[r]);
        let fm = _mm512_cvtepi32_ps(im);
        let t1 = _mm512_mul_ps(_mm512_set1_ps(w.dmin[r]), fm);
        let u = _mm512_fmsub_ps(_mm512_set1_ps(w.d[r]), fi, t1);
        y[r] = _mm512_add_ps(y[r], _mm512_mul_ps(dx, u));
    }
}

fn proto(w: &[BlockQ4K], rows: usize, acts: &[ActTile], n: usize, nb: usize, out: &mut [f32]) {
    let mut wt = Box::new(WTile {
        q: [0; TR * QK_K],
        sc: [0; TR * 8],
        mn: [0; TR * 4],
        d: [0.0; TR],
        dmin: [0.0; TR],
    });
    let mut wts: Vec<Box<WTile>> = Vec::new();
    for c0 in (0..n).step_by(CHUNK) {
        for r0 in (0..rows).step_by(TR) {
            // the row tile's blocks unpacked once per column chunk
            wts.clear();
            for b in 0..nb {
                unpack(w, nb, r0, b, &mut wt);
                wts.push(Box::new(WTile {
                    q: wt.q,
                    sc: wt.sc,
                    mn: wt.mn,
                    d: wt.d,
                    dmin: wt.dmin,
                }));
            }
            for gcol in (c0 / TC)..((c0 + CHUNK).min(n) / TC) {
                let mut y = [unsafe { _mm512_setzero_ps() }; TR];
                for b in 0..nb {
                    unsafe { tile(&wts[b], &acts[gcol * nb + b], &mut y) };
                }
                for r in 0..TR {
                    let mut lanes = [0f32; TC];
                    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), y[r]) };
                    for c in 0..TC {
                        out[(gcol * TC + c) * rows + r0 + r] = lanes[c];
                    }
                }
            }
        }
    }
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

fn main() {
    let mut rng = StdRng::seed_from_u64(5);
    for &(rows, k) in &[
        (256usize, 512usize),
        (2048, 2048),
        (7168, 2048),
        (2048, 7168),
    ] {
        let nb = k / QK_K;
        let n = 512;
        let mut w: Vec<BlockQ4K> = vec![bytemuck::Zeroable::zeroed(); rows * nb];
        rng.fill(bytemuck::cast_slice_mut::<BlockQ4K, u8>(&mut w));
        for b in w.iter_mut() {
            b.d = half::f16::from_f32(rng.gen_range(0.001f32..0.01));
            b.dmin = half::f16::from_f32(rng.gen_range(0.001f32..0.01));
        }
        let x: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let mut y = vec![bytemuck::Zeroable::zeroed(); n * nb];
        quantize_row_q8_k_ref(&x, &mut y);
        let acts = act_tiles(&y, n, nb);
        let mut out = vec![0f32; n * rows];
        proto(&w, rows, &acts, n, nb, &mut out);
        if rows * k <= 256 * 512 {
            let mut r = vec![0f32; n * rows];
            reference(&w, rows, &y, n, &mut r);
            let same = out
                .iter()
                .zip(&r)
                .filter(|(a, b)| a.to_bits() == b.to_bits())
                .count();
            println!(
                "{rows}x{k}: {same} of {} outputs bit-identical to the scalar reference",
                r.len()
            );
            assert_eq!(same, r.len());
        }
        let macs = (rows * k * n) as f64;
        let t_proto = best(3, || {
            let acts = act_tiles(&y, n, nb);
            proto(&w, rows, &acts, n, nb, &mut out)
        });
        let g = muser_engine::backend::cpu::tile::q4_k_gemm().expect("AVX-512 VNNI");
        let t_tile = best(3, || g(&w, rows, &y, n, &mut out));
        println!(
            "{rows}x{k} x {n} cols, one thread: prototype {:.1} GMAC/s, tile.rs {:.1} GMAC/s",
            macs / t_proto / 1e9,
            macs / t_tile / 1e9
        );
    }
}
