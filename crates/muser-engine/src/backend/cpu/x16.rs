//! K-quant weights (Q4_K, Q5_K, Q6_K) repacked at load for 16 rows per zmm (AVX-512 VNNI):
//! every matmul over them, decode, decode groups and prefill.
//!
//! Layout. Rows in groups of 16 (the last padded with zero blocks); per group and super-block,
//! `block_bytes(ty)` bytes, the 16 GGUF blocks' own plus at most 64 (the scales unpacked), in
//! 64-byte lines. A "dword" of a row is 4 consecutive quant bytes; dword i of the 16 rows is one
//! line, row r at 4 r, so one load brings 16 rows' 4-value groups and one `vpdpbusd` with the
//! column's 4 activation bytes broadcast adds 16 rows' 4 products. No lane is ever reduced
//! across: lane r is row r.
//!
//! Q4_K (2,368 bytes) and Q5_K (2,880): 0: the rows' `d` (f16), 32: `dmin`; 64: scale j of row r
//! at 64 + 16 j + r; 192: min pair k of row r at 192 + 32 k + 2 r (m_2k, m_2k+1: one zero
//! extension gives the i16 pairs of `vpdpwssd`); 320: `qs` dword i at 320 + 64 i. Dword i = 8 c +
//! q holds values 64 c + 4 q .. + 3 (low nibbles, sub-block 2 c) and 64 c + 32 + 4 q .. + 3 (high
//! nibbles, sub-block 2 c + 1). Q5_K: `qh` dword q at 320 + 64 q (bit j of byte l: the fifth bit
//! of value 32 j + l), then `qs` from 832.
//!
//! Q6_K (3,392): 0: scale pair k of row r at 32 k + 2 r (sc_2k, sc_2k+1, i8); 256: the rows' `d`;
//! 320: the quants in the order `group_q6` reads them, 16 triples of lines (see there).
//!
//! Every format's lines lie in the order the kernel first reads them, so a group's weights are
//! one forward stream (the first layout, with Q6_K's scales at the end of each block and Q5_K's
//! fifth bits after its quants, streamed at 7.6 GB/s against 14.5-18.4 for the one-column
//! dots from memory, one thread; Q4_K at 23.8).
//!
//! Order. Per (row, column) and block the exact integers of the scalar reference (the
//! sub-block dots times their scales; Q4_K/Q5_K the mins times the sub-block sums, Q6_K 32 times
//! the scaled sub-block sums), then its f32 step (`d_y * d * isc - d_y * dmin * im`, Q6_K `d_y *
//! d * isc`) added block by block from 0: the bits of `muser_quant::dot` and of every other
//! kernel (`tests/gemm.rs`).
//!
//! Why. With the GGUF layout a one-column dot reduces each block's lanes to one row (the
//! horizontal sums and the per-row scale steps are most of its instructions), and on a 2-core
//! Zen 4 decode of 2-4 streams was bound by that arithmetic per column (BENCHMARKS.md,
//! 2026-12-02). llama.cpp repacks Q4_K for the same reason (8 rows interleaved on AVX2).

use muser_gguf::GgmlType;
use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
use rayon::prelude::*;
use std::arch::x86_64::*;

/// Rows per group.
pub const R: usize = 16;
// Q4_K / Q5_K offsets (Q5_K's quants after its fifth bits).
const SC: usize = 64;
const MN: usize = 192;
const QS: usize = 320;
const QH5: usize = 320;
const QS5: usize = 832;
// Q6_K offsets.
const SC6: usize = 0;
const D6: usize = 256;
const Q6: usize = 320;
/// Columns per pass over a group's weights.
const CB: usize = 4;

/// Bytes per group and super-block of a format this module repacks.
pub fn block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(2368),
        GgmlType::Q5_K => Some(2880),
        GgmlType::Q6_K => Some(3392),
        _ => None,
    }
}

/// Whether this CPU runs these kernels (as the tiles: AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C).
pub fn available() -> bool {
    super::tile::available()
}

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A K-quant matrix in the layout above.
pub struct X16 {
    data: Vec<Line>,
    ty: GgmlType,
    rows: usize,
    nb: usize,
    bs: usize,
}

/// Row r's dword i (bytes 4 i .. 4 i + 3 of `src`) to line i of `o` from `at`.
fn put_dwords(o: &mut [u8], at: usize, r: usize, src: &[u8]) {
    for (i, d) in src.chunks_exact(4).enumerate() {
        o[at + 64 * i + 4 * r..at + 64 * i + 4 * r + 4].copy_from_slice(d);
    }
}

/// Where Q6_K's triple of lines for half n and dword q lies: `ql` dwords 16 n + q, 16 n + 8 + q
/// and `qh` dword 8 n + q, in `group_q6`'s order (n, then q / 4, then q % 4).
fn q6_line(n: usize, q: usize) -> usize {
    Q6 + 192 * (4 * (2 * n + q / 4) + q % 4)
}

/// Q4_K/Q5_K's d, dmin, scales and mins of row r (see the module doc).
fn put_k4_meta(o: &mut [u8], r: usize, d: half::f16, dmin: half::f16, scales: &[u8; 12]) {
    o[2 * r..2 * r + 2].copy_from_slice(&d.to_bits().to_le_bytes());
    o[32 + 2 * r..34 + 2 * r].copy_from_slice(&dmin.to_bits().to_le_bytes());
    for j in 0..8 {
        let (sc, m) = muser_quant::blocks::scale_min_k4(j, scales);
        o[SC + 16 * j + r] = sc;
        o[MN + 32 * (j / 2) + 2 * r + j % 2] = m;
    }
}

impl X16 {
    /// Repacks `rows` GGUF rows of `nb` blocks each of a format `block_bytes` knows, or None.
    pub fn new(ty: GgmlType, bytes: &[u8], rows: usize, nb: usize) -> Option<X16> {
        let bs = block_bytes(ty)?;
        let src_bs = ty.type_size();
        assert_eq!(
            bytes.len(),
            rows * nb * src_bs,
            "X16: {rows} rows of {nb} {ty} blocks"
        );
        let groups = rows.div_ceil(R);
        let mut data = vec![Line([0; 64]); groups * nb * bs / 64];
        data.par_chunks_mut(nb * bs / 64)
            .enumerate()
            .for_each(|(g, lines)| {
                let out: &mut [u8] = bytemuck::cast_slice_mut(lines);
                for b in 0..nb {
                    let o = &mut out[b * bs..(b + 1) * bs];
                    for r in 0..R.min(rows - g * R) {
                        let at = ((g * R + r) * nb + b) * src_bs;
                        let src = &bytes[at..at + src_bs];
                        match ty {
                            GgmlType::Q4_K => {
                                let blk: &BlockQ4K = bytemuck::from_bytes(src);
                                put_k4_meta(o, r, blk.d, blk.dmin, &blk.scales);
                                put_dwords(o, QS, r, &blk.qs);
                            }
                            GgmlType::Q5_K => {
                                let blk: &BlockQ5K = bytemuck::from_bytes(src);
                                put_k4_meta(o, r, blk.d, blk.dmin, &blk.scales);
                                put_dwords(o, QS5, r, &blk.qs);
                                put_dwords(o, QH5, r, &blk.qh);
                            }
                            _ => {
                                let blk: &BlockQ6K = bytemuck::from_bytes(src);
                                for (i, d) in blk.ql.chunks_exact(4).enumerate() {
                                    let (n, q) = (i / 16, i % 8);
                                    let at = q6_line(n, q) + 64 * ((i % 16) / 8) + 4 * r;
                                    o[at..at + 4].copy_from_slice(d);
                                }
                                for (i, d) in blk.qh.chunks_exact(4).enumerate() {
                                    let at = q6_line(i / 8, i % 8) + 128 + 4 * r;
                                    o[at..at + 4].copy_from_slice(d);
                                }
                                for (j, &s) in blk.scales.iter().enumerate() {
                                    o[SC6 + 32 * (j / 2) + 2 * r + j % 2] = s as u8;
                                }
                                o[D6 + 2 * r..D6 + 2 * r + 2]
                                    .copy_from_slice(&blk.d.to_bits().to_le_bytes());
                            }
                        }
                    }
                }
            });
        Some(X16 {
            data,
            ty,
            rows,
            nb,
            bs,
        })
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
        assert!(available(), "X16::gemm_into needs AVX-512 VNNI");
        assert!(
            r0.is_multiple_of(R) && r0 <= r1 && r1 <= self.rows && y.len() == n * self.nb,
            "X16::gemm_into: rows {r0}..{r1} of {}, {n} columns of {} blocks ({} given)",
            self.rows,
            self.nb,
            y.len()
        );
        let bytes: &[u8] = bytemuck::cast_slice(&self.data);
        let gb = self.nb * self.bs;
        for g in r0 / R..r1.div_ceil(R) {
            let w = &bytes[g * gb..(g + 1) * gb];
            let rows = (r1 - g * R).min(R);
            let base = g * R - r0;
            let mut c0 = 0;
            while c0 < n {
                let c = (n - c0).min(CB);
                let mut sums = [[0f32; R]; CB];
                let ys = &y[c0 * self.nb..(c0 + c) * self.nb];
                // SAFETY: the CPU has the features (asserted); the slices have the sizes the
                // kernels read.
                match (self.ty, c) {
                    (GgmlType::Q4_K, 1) => group_k4::<1, false>(w, ys, self.nb, &mut sums),
                    (GgmlType::Q4_K, 2) => group_k4::<2, false>(w, ys, self.nb, &mut sums),
                    (GgmlType::Q4_K, 3) => group_k4::<3, false>(w, ys, self.nb, &mut sums),
                    (GgmlType::Q4_K, _) => group_k4::<4, false>(w, ys, self.nb, &mut sums),
                    (GgmlType::Q5_K, 1) => group_k4::<1, true>(w, ys, self.nb, &mut sums),
                    (GgmlType::Q5_K, 2) => group_k4::<2, true>(w, ys, self.nb, &mut sums),
                    (GgmlType::Q5_K, 3) => group_k4::<3, true>(w, ys, self.nb, &mut sums),
                    (GgmlType::Q5_K, _) => group_k4::<4, true>(w, ys, self.nb, &mut sums),
                    (_, 1) => group_q6::<1>(w, ys, self.nb, &mut sums),
                    (_, 2) => group_q6::<2>(w, ys, self.nb, &mut sums),
                    (_, 3) => group_q6::<3>(w, ys, self.nb, &mut sums),
                    (_, _) => group_q6::<4>(w, ys, self.nb, &mut sums),
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

#[inline(always)]
unsafe fn line(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// Each byte's bit k moved to bit 4, the others cleared.
#[inline(always)]
unsafe fn bit_to_4(x: __m512i, k: usize) -> __m512i {
    let s = if k <= 4 {
        _mm512_sll_epi16(x, _mm_cvtsi32_si128(4 - k as i32))
    } else {
        _mm512_srl_epi16(x, _mm_cvtsi32_si128(k as i32 - 4))
    };
    _mm512_and_si512(s, _mm512_set1_epi8(0x10))
}

/// (a & 0x0F) | b per byte (b has no bit of 0x0F set).
#[inline(always)]
unsafe fn low_or(a: __m512i, b: __m512i, m4: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0xEC>(a, b, m4)
}

/// One group's 16 rows of Q4_K (FIVE = false) or Q5_K against C columns (`y`: C x nb blocks)
/// over all nb blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_k4<const C: usize, const FIVE: bool>(
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    sums: &mut [[f32; R]; CB],
) {
    let (bs, qs0) = if FIVE { (2880, QS5) } else { (2368, QS) };
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * bs);
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [_mm512_setzero_si512(); C];
        for ch in 0..4 {
            let mut lo = [_mm512_setzero_si512(); C];
            let mut hi = [_mm512_setzero_si512(); C];
            for q in 0..8 {
                let v = line(p.add(qs0 + 64 * (8 * ch + q)));
                let (vl, vh) = if FIVE {
                    // Values 0..31: the nibble and the fifth bit (bit 2 ch / 2 ch + 1 of qh).
                    let h = line(p.add(QH5 + 64 * q));
                    let vl = low_or(v, bit_to_4(h, 2 * ch), m4);
                    let vh = low_or(_mm512_srli_epi16::<4>(v), bit_to_4(h, 2 * ch + 1), m4);
                    (vl, vh)
                } else {
                    // The high nibbles as 16 x their values (the sums are scaled back below).
                    (_mm512_and_si512(v, m4), _mm512_andnot_si512(m4, v))
                };
                for t in 0..C {
                    let qs = yb[t].qs.as_ptr();
                    lo[t] = _mm512_dpbusd_epi32(lo[t], vl, dword(qs.add(64 * ch + 4 * q)));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], vh, dword(qs.add(64 * ch + 32 + 4 * q)));
                }
            }
            let sl = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(SC + 32 * ch) as *const _));
            let sh = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(SC + 32 * ch + 16) as *const _));
            for t in 0..C {
                // Q4_K: hi holds 16 x the exact sums, so the shift is exact.
                let h = if FIVE {
                    hi[t]
                } else {
                    _mm512_srai_epi32::<4>(hi[t])
                };
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
            let bsum = &yb[t].bsums;
            let mut im = _mm512_setzero_si512();
            for (k, m) in mp.iter().enumerate() {
                let s0 = bsum[4 * k] as i32 + bsum[4 * k + 1] as i32;
                let s1 = bsum[4 * k + 2] as i32 + bsum[4 * k + 3] as i32;
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

/// As `group_k4` for Q6_K. Per half n of a block and dword q of its 32 values: `ql` dwords
/// 16 n + q (A) and 16 n + 8 + q (B), `qh` dword 8 n + q (H) (one triple of lines, `q6_line`)
/// make the groups of values
/// 128 n + 4 q + 32 k (k = 0..3): A's low nibbles with H's bits 0-1, B's with bits 2-3, A's high
/// nibbles with bits 4-5, B's with bits 6-7; group k is in sub-block 8 n + 2 k + q / 4.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_q6<const C: usize>(w: &[u8], y: &[BlockQ8K], nb: usize, sums: &mut [[f32; R]; CB]) {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * 3392);
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [_mm512_setzero_si512(); C];
        // Scale pairs as i16 (sc_2k low, sc_2k+1 high in each dword).
        let sp: [__m512i; 8] = std::array::from_fn(|k| {
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.add(SC6 + 32 * k) as *const _))
        });
        for n in 0..2 {
            for h in 0..2 {
                let mut a = [[_mm512_setzero_si512(); C]; 4];
                for q in 4 * h..4 * h + 4 {
                    let at = p.add(q6_line(n, q));
                    let (va, vb, vh) = (line(at), line(at.add(64)), line(at.add(128)));
                    let g = [
                        low_or(va, _mm512_and_si512(_mm512_slli_epi16::<4>(vh), m30), m4),
                        low_or(vb, _mm512_and_si512(_mm512_slli_epi16::<2>(vh), m30), m4),
                        low_or(_mm512_srli_epi16::<4>(va), _mm512_and_si512(vh, m30), m4),
                        low_or(
                            _mm512_srli_epi16::<4>(vb),
                            _mm512_and_si512(_mm512_srli_epi16::<2>(vh), m30),
                            m4,
                        ),
                    ];
                    for t in 0..C {
                        let qs = yb[t].qs.as_ptr().add(128 * n + 4 * q);
                        for k in 0..4 {
                            a[k][t] = _mm512_dpbusd_epi32(a[k][t], g[k], dword(qs.add(32 * k)));
                        }
                    }
                }
                // Sub-blocks j = 8 n + 2 k + h: scale pair 4 n + k, its low (h = 0) or high i16.
                for k in 0..4 {
                    let pair = sp[4 * n + k];
                    let s = if h == 0 {
                        _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair))
                    } else {
                        _mm512_srai_epi32::<16>(pair)
                    };
                    for t in 0..C {
                        isc[t] = _mm512_add_epi32(isc[t], _mm512_mullo_epi32(a[k][t], s));
                    }
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(D6) as *const _));
        for t in 0..C {
            // The -32 of every quant: 32 x sum_j sc_j x (sum of sub-block j's activations).
            let bsum = yb[t].bsums.as_ptr();
            let mut corr = _mm512_setzero_si512();
            for (k, s) in sp.iter().enumerate() {
                let pair = std::ptr::read_unaligned(bsum.add(2 * k) as *const i32);
                corr = _mm512_dpwssd_epi32(corr, *s, _mm512_set1_epi32(pair));
            }
            let isum = _mm512_sub_epi32(isc[t], _mm512_slli_epi32::<5>(corr));
            // d_y * d * isc, as the scalar reference.
            let dy = _mm512_set1_ps(yb[t].d);
            let v = _mm512_mul_ps(_mm512_mul_ps(dy, d), _mm512_cvtepi32_ps(isum));
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    for t in 0..C {
        _mm512_storeu_ps(sums[t].as_mut_ptr(), acc[t]);
    }
}

/// Repacking and `gemm_into` over all rows as a [`super::tile::GemmFn`], when this CPU runs it
/// (tests and comparisons).
pub fn gemm<W: bytemuck::Pod>(ty: GgmlType) -> Option<super::tile::GemmFn<W>> {
    fn run<W: bytemuck::Pod, const T: u32>(
        w: &[W],
        rows: usize,
        y: &[BlockQ8K],
        n: usize,
        out: &mut [f32],
    ) {
        let ty = match T {
            4 => GgmlType::Q4_K,
            5 => GgmlType::Q5_K,
            _ => GgmlType::Q6_K,
        };
        let bytes: &[u8] = bytemuck::cast_slice(w);
        let nb = bytes.len() / ty.type_size() / rows.max(1);
        assert!(out.len() == rows * n, "x16 gemm: {rows} rows, {n} columns");
        let x = X16::new(ty, bytes, rows, nb).expect("a K-quant type");
        // SAFETY: out holds n x rows outputs and is borrowed mutably here.
        unsafe { x.gemm_into(y, n, 0, rows, out.as_mut_ptr(), rows) }
    }
    let f: super::tile::GemmFn<W> = match ty {
        GgmlType::Q4_K => run::<W, 4>,
        GgmlType::Q5_K => run::<W, 5>,
        GgmlType::Q6_K => run::<W, 6>,
        _ => return None,
    };
    available().then_some(f)
}

/// Rows per task of a repacked matrix: whole groups.
pub fn task_rows(r: usize) -> usize {
    r.div_ceil(R) * R
}

const _: () =
    assert!(QS + 32 * 64 == 2368 && QS5 + 32 * 64 == 2880 && Q6 + 16 * 192 == 3392 && QK_K == 256);
