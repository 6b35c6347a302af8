//! Q4_K weights repacked at load for 16 rows per zmm (AVX-512 VNNI): decode and decode groups.
//!
//! Layout. Rows in groups of 16 (the last padded with zero blocks); per group and super-block,
//! [`BLOCK`] = 2,368 bytes (the 16 GGUF blocks' 2,304 plus 64: the scales and mins unpacked):
//! - 0: the 16 rows' `d` (f16), 32: their `dmin`;
//! - 64: scale j of row r at 64 + 16 j + r (8 sub-blocks of 32 values);
//! - 192: min pair k of row r at 192 + 32 k + 2 r: (m_2k, m_2k+1), so that one zero-extension
//!   gives the i16 pairs of `vpdpwssd`;
//! - 320: the quants by dwords: dword i (bytes 4i .. 4i + 3 of `qs`) of row r at 320 + 64 i + 4 r.
//!
//! Dword i = 8 c + q of `qs` holds values 64 c + 4 q .. + 3 (low nibbles, sub-block 2 c) and
//! 64 c + 32 + 4 q .. + 3 (high nibbles, sub-block 2 c + 1). So one 64-byte load is 16 rows' 4-value
//! group of two sub-blocks: `vpand` gives the low nibbles and `vpandn` 16 times the high ones, and
//! one `vpdpbusd` with the column's 4 activation bytes broadcast adds 16 rows' 4 products. No
//! lane is ever reduced across: lane r is row r.
//!
//! Order. Per (row, column) and block the exact integers of the scalar reference (the sub-block
//! dots times their scales, the mins times the sub-block sums), then `d_y * d * isc - d_y * dmin *
//! im` in f32 added block by block from 0: the bits of `muser_quant::dot::vec_dot_q4_k_q8_k` and
//! of every other kernel (`tests/gemm.rs`, `x16_gives_the_one_column_bits`).
//!
//! Why. With the GGUF layout a one-column dot reduces each block's lanes to one row (the
//! horizontal sums and the per-row scale steps are most of its instructions), and on a 2-core
//! Zen 4 decode of 2-4 streams was bound by that arithmetic per column (BENCHMARKS.md,
//! 2026-12-02). llama.cpp repacks Q4_K for the same reason (8 rows interleaved on AVX2).

use muser_quant::{BlockQ4K, BlockQ8K, QK_K};
use rayon::prelude::*;
use std::arch::x86_64::*;

/// Rows per group.
pub const R: usize = 16;
/// Bytes per group and super-block.
pub const BLOCK: usize = 2368;
const SC: usize = 64;
const MN: usize = 192;
const QS: usize = 320;
/// Columns per pass over a group's weights.
const CB: usize = 4;

/// Whether this CPU runs these kernels (as the tiles: AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C).
pub fn available() -> bool {
    super::tile::available()
}

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A Q4_K matrix in the layout above.
pub struct Q4KX16 {
    data: Vec<Line>,
    rows: usize,
    nb: usize,
}

impl Q4KX16 {
    /// Repacks `rows` GGUF Q4_K rows of `nb` blocks each (`bytes`: rows x nb x 144).
    pub fn new(bytes: &[u8], rows: usize, nb: usize) -> Q4KX16 {
        assert_eq!(
            bytes.len(),
            rows * nb * 144,
            "Q4KX16: {rows} rows of {nb} blocks"
        );
        let blocks: &[BlockQ4K] = bytemuck::cast_slice(bytes);
        let groups = rows.div_ceil(R);
        let mut data = vec![Line([0; 64]); groups * nb * BLOCK / 64];
        data.par_chunks_mut(nb * BLOCK / 64)
            .enumerate()
            .for_each(|(g, lines)| {
                let out: &mut [u8] = bytemuck::cast_slice_mut(lines);
                for b in 0..nb {
                    let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
                    for r in 0..R.min(rows - g * R) {
                        let blk = &blocks[(g * R + r) * nb + b];
                        o[2 * r..2 * r + 2].copy_from_slice(&blk.d.to_bits().to_le_bytes());
                        o[32 + 2 * r..34 + 2 * r]
                            .copy_from_slice(&blk.dmin.to_bits().to_le_bytes());
                        for j in 0..8 {
                            let (sc, m) = muser_quant::blocks::scale_min_k4(j, &blk.scales);
                            o[SC + 16 * j + r] = sc;
                            o[MN + 32 * (j / 2) + 2 * r + j % 2] = m;
                        }
                        for i in 0..32 {
                            o[QS + 64 * i + 4 * r..QS + 64 * i + 4 * r + 4]
                                .copy_from_slice(&blk.qs[4 * i..4 * i + 4]);
                        }
                    }
                }
            });
        Q4KX16 { data, rows, nb }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// out[t * ld + r - r0] = dot(row r, y[t]) for r in r0..r1 (r0 a multiple of 16) and the `n`
    /// columns of `y` (n x nb Q8_K blocks).
    ///
    /// # Safety
    /// `out` must be valid for writes at t * ld + r - r0 for t < n, r0 <= r < r1, and not
    /// written by anyone else meanwhile.
    pub unsafe fn gemm_into(
        &self,
        y: &[BlockQ8K],
        n: usize,
        r0: usize,
        r1: usize,
        out: *mut f32,
        ld: usize,
    ) {
        assert!(available(), "Q4KX16::gemm_into needs AVX-512 VNNI");
        assert!(
            r0.is_multiple_of(R) && r0 <= r1 && r1 <= self.rows && y.len() == n * self.nb,
            "Q4KX16::gemm_into: rows {r0}..{r1} of {}, {n} columns of {} blocks ({} given)",
            self.rows,
            self.nb,
            y.len()
        );
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        for g in r0 / R..r1.div_ceil(R) {
            let w = &bytes[g * self.nb * BLOCK..(g + 1) * self.nb * BLOCK];
            let rows = (r1 - g * R).min(R);
            let base = g * R - r0;
            let mut c0 = 0;
            while c0 < n {
                let c = (n - c0).min(CB);
                let mut sums = [[0f32; R]; CB];
                let ys = &y[c0 * self.nb..(c0 + c) * self.nb];
                // SAFETY: the CPU has the features (asserted); the slices have the sizes the
                // kernel reads.
                match c {
                    1 => group::<1>(w, ys, self.nb, &mut sums),
                    2 => group::<2>(w, ys, self.nb, &mut sums),
                    3 => group::<3>(w, ys, self.nb, &mut sums),
                    _ => group::<4>(w, ys, self.nb, &mut sums),
                }
                for (t, s) in sums.iter().enumerate().take(c) {
                    let o = out.add((c0 + t) * ld + base);
                    std::ptr::copy_nonoverlapping(s.as_ptr(), o, rows);
                }
                c0 += c;
            }
        }
    }
}

#[inline(always)]
unsafe fn dword(p: *const i8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// One group's 16 rows against C columns (`y`: C x nb blocks) over all nb blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group<const C: usize>(w: &[u8], y: &[BlockQ8K], nb: usize, sums: &mut [[f32; R]; CB]) {
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * BLOCK);
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [_mm512_setzero_si512(); C];
        for ch in 0..4 {
            let mut lo = [_mm512_setzero_si512(); C];
            let mut hi = [_mm512_setzero_si512(); C];
            for q in 0..8 {
                let v = _mm512_loadu_si512(p.add(QS + 64 * (8 * ch + q)) as *const _);
                let vl = _mm512_and_si512(v, m4);
                let vh = _mm512_andnot_si512(m4, v); // 16 x the high nibbles
                for t in 0..C {
                    let qs = yb[t].qs.as_ptr();
                    lo[t] = _mm512_dpbusd_epi32(lo[t], vl, dword(qs.add(64 * ch + 4 * q)));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], vh, dword(qs.add(64 * ch + 32 + 4 * q)));
                }
            }
            let sl = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(SC + 32 * ch) as *const _));
            let sh = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(SC + 32 * ch + 16) as *const _));
            for t in 0..C {
                // hi holds 16 x the exact sums: the shift is exact.
                let h = _mm512_srai_epi32::<4>(hi[t]);
                isc[t] = _mm512_add_epi32(
                    isc[t],
                    _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sl), _mm512_mullo_epi32(h, sh)),
                );
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32) as *const _));
        let mp: [__m512i; 4] = std::array::from_fn(|k| {
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.add(MN + 32 * k) as *const _))
        });
        for t in 0..C {
            let bs = &yb[t].bsums;
            let mut im = _mm512_setzero_si512();
            for (k, m) in mp.iter().enumerate() {
                let s0 = bs[4 * k] as i32 + bs[4 * k + 1] as i32;
                let s1 = bs[4 * k + 2] as i32 + bs[4 * k + 3] as i32;
                im = _mm512_dpwssd_epi32(im, *m, _mm512_set1_epi32((s0 & 0xffff) | (s1 << 16)));
            }
            // d_y * d * isc - d_y * dmin * im, as the scalar reference.
            let dy = _mm512_set1_ps(yb[t].d);
            let a1 = _mm512_mul_ps(_mm512_mul_ps(dy, d), _mm512_cvtepi32_ps(isc[t]));
            let a2 = _mm512_mul_ps(_mm512_mul_ps(dy, dmin), _mm512_cvtepi32_ps(im));
            acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(a1, a2));
        }
    }
    for t in 0..C {
        _mm512_storeu_ps(sums[t].as_mut_ptr(), acc[t]);
    }
}

/// Repacking and `gemm_into` over all rows as a [`super::tile::GemmFn`], when this CPU runs it
/// (tests and comparisons).
pub fn q4_k_gemm() -> Option<super::tile::GemmFn<BlockQ4K>> {
    available().then_some(gemm_checked as super::tile::GemmFn<BlockQ4K>)
}

fn gemm_checked(w: &[BlockQ4K], rows: usize, y: &[BlockQ8K], n: usize, out: &mut [f32]) {
    let nb = w.len() / rows.max(1);
    assert!(
        w.len() == rows * nb && out.len() == rows * n,
        "x16 gemm: {rows} rows, {n} columns"
    );
    let x = Q4KX16::new(bytemuck::cast_slice(w), rows, nb);
    // SAFETY: out holds n x rows outputs and is borrowed mutably here.
    unsafe { x.gemm_into(y, n, 0, rows, out.as_mut_ptr(), rows) }
}

/// Rows per task of a repacked matrix: whole groups.
pub fn task_rows(r: usize) -> usize {
    r.div_ceil(R) * R
}

const _: () = assert!(QS + 32 * 64 == BLOCK && BLOCK.is_multiple_of(64) && QK_K == 256);
