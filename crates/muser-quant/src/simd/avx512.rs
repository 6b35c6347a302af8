//! AVX-512 (F, BW, VL, VNNI) dot kernels: one weight row (any length for the float formats,
//! whole blocks for the quantized ones) against one activation row, as called per matrix row by
//! the engine.
//!
//! Quantized K dots work on 64 values per register. A group of 64 Q4_K/Q5_K values is 32 qs
//! bytes: they are broadcast to both 256-bit halves and shifted per half (`vpsrlvw` by 0 and 4),
//! so the low half holds sub-block 2g and the high half sub-block 2g+1, matching 64 contiguous
//! activations. `vpmaddubsw` (u8 x i8, pairs summed in i16, never saturating: the largest pair is
//! 2 * 63 * 128 = 16,128) then `vpdpwssd` (VNNI: i16 x i16 scale, pairs summed into i32 lanes)
//! accumulate one super-block in i32, converted to f32 once. The integer sums are exactly the
//! scalar reference's, and so is the f32 order (per block, block by block: `finish4`).
//! Q8_0 is signed x signed: `vpdpbusd` needs one unsigned side, so x is offset by 128 (xor 0x80)
//! and 128 * sum(y) (another `vpdpbusd` against ones) is taken back: exact for every int8. Its
//! f32 steps are the scalar reference's too (`dot_q8_0_q8_0`).
//! Float tails use masked loads (no scalar tail).
//!
//! Measured 2026-11-29 on the 2-core AMD EPYC CPU machine (AVX-512 VNNI), rows of 4096, one
//! thread, best of many passes (the machine was shared with other jobs; criterion means in the
//! crate's bench report are lower). GB/s of weights, set in L2 (512 KB) / streamed (64 MB):
//! Q4_K 36 / 29, Q5_K 34 / 29, Q6_K 67 / 34, Q8_0 56 / 34, f32 132 / 27, f16 75 / 36.
//! Q8_0 in the scalar order (2026-11-30, muser-engine's `tests/gemm_speed.rs`, one column,
//! llama-1b's shapes): 39 GMAC/s (41 GB/s) against 49 before; a model's decode, bound by
//! memory, did not change measurably (llama-1b Q8_0, 2 threads, 39-44 tokens/s both).

use super::{check_len, unpack_scales_mins_k4, Kernels};
use crate::blocks::*;
use half::{bf16, f16};
use std::arch::x86_64::*;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && super::avx2::available()
}

/// The AVX-512 table. Panics if the CPU lacks the features: the wrappers below are sound only
/// because this check ran.
pub(super) fn kernels() -> Kernels {
    assert!(
        available(),
        "the AVX-512 kernels need AVX-512 F, BW, VL, VNNI and AVX2, FMA, F16C"
    );
    // SAFETY (every wrapper): the CPU has every feature the kernels enable, checked just above.
    Kernels {
        isa: "avx512",
        dot_f32: |x, y| unsafe { dot_f32(x, y) },
        dot_f16_f32: |x, y| unsafe { dot_f16_f32(x, y) },
        dot_bf16_f32: |x, y| unsafe { dot_bf16_f32(x, y) },
        dot_q8_0_q8_0: |x, y| unsafe { dot_q8_0_q8_0(x, y) },
        dot_q4_k_q8_k: |x, y| unsafe { dot_q4_k_q8_k(x, y) },
        dot_q5_k_q8_k: |x, y| unsafe { dot_q5_k_q8_k(x, y) },
        dot_q6_k_q8_k: |x, y| unsafe { dot_q6_k_q8_k(x, y) },
        cols: None,
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load256<T>(p: *const T) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load512<T>(p: *const T) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

/// 32 bytes at `p` in both 256-bit halves.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load256_twice<T>(p: *const T) -> __m512i {
    _mm512_broadcast_i64x4(load256(p))
}

/// i16 lanes 0..16 get `lo`, lanes 16..32 get `hi` (that is, bytes 0..32 and 32..64).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn halves_epi16(lo: i16, hi: i16) -> __m512i {
    _mm512_mask_blend_epi16(0xffff_0000, _mm512_set1_epi16(lo), _mm512_set1_epi16(hi))
}

// Sixteen weights widened to f32, per float format; `m` selects the lanes to load (the others
// are zero and their memory is not touched).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load16_f32(p: *const f32, m: __mmask16) -> __m512 {
    _mm512_maskz_loadu_ps(m, p)
}
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load16_f16(p: *const f16, m: __mmask16) -> __m512 {
    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16))
}
/// bf16 is the top half of an f32: widen to u32 and shift left 16 (exact).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load16_bf16(p: *const bf16, m: __mmask16) -> __m512 {
    let w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p as *const i16));
    _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))
}

/// A float dot: four independent 16-lane FMA chains over 64 values per step, then 16 at a time,
/// then one masked step for the last 1..15 values.
macro_rules! float_dot {
    ($name:ident, $t:ty, $load16:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name(x: &[$t], y: &[f32]) -> f32 {
            check_len(stringify!($name), x.len(), y.len());
            let (n, xp, yp) = (x.len(), x.as_ptr(), y.as_ptr());
            let all = !0;
            let (mut a0, mut a1, mut a2, mut a3) = (
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
            );
            let mut i = 0;
            while i + 64 <= n {
                a0 = _mm512_fmadd_ps($load16(xp.add(i), all), _mm512_loadu_ps(yp.add(i)), a0);
                a1 = _mm512_fmadd_ps(
                    $load16(xp.add(i + 16), all),
                    _mm512_loadu_ps(yp.add(i + 16)),
                    a1,
                );
                a2 = _mm512_fmadd_ps(
                    $load16(xp.add(i + 32), all),
                    _mm512_loadu_ps(yp.add(i + 32)),
                    a2,
                );
                a3 = _mm512_fmadd_ps(
                    $load16(xp.add(i + 48), all),
                    _mm512_loadu_ps(yp.add(i + 48)),
                    a3,
                );
                i += 64;
            }
            while i + 16 <= n {
                a0 = _mm512_fmadd_ps($load16(xp.add(i), all), _mm512_loadu_ps(yp.add(i)), a0);
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u16 << (n - i)) - 1;
                a1 = _mm512_fmadd_ps(
                    $load16(xp.add(i), m),
                    _mm512_maskz_loadu_ps(m, yp.add(i)),
                    a1,
                );
            }
            _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)))
        }
    };
}

float_dot!(dot_f32, f32, load16_f32);
float_dot!(dot_f16_f32, f16, load16_f16);
float_dot!(dot_bf16_f32, bf16, load16_bf16);

/// `vpermt2w` indices gathering the `d` of 4 consecutive Q8_0 blocks (34 bytes each) from two
/// 64-byte loads at block offsets 0 and 68 bytes (words 0 and 17 of each) into words
/// `at..at + 4`; every other word takes word 0.
const fn q8_0_d_index(at: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    idx[at + 1] = 17;
    idx[at + 2] = 32;
    idx[at + 3] = 32 + 17;
    idx
}
const Q8_0_D_INDEX: [[i16; 32]; 2] = [q8_0_d_index(0), q8_0_d_index(4)];

/// Words 0..8: the `d` of the 8 consecutive Q8_0 blocks at `p` (272 bytes: the loads at 0, 68,
/// 136 and 204 end inside them). Words 8..32: don't care.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q8_0_d8(p: *const BlockQ8_0, index: &[__m512i; 2]) -> __m128i {
    let p = p as *const u8;
    let lo = _mm512_permutex2var_epi16(load512(p), index[0], load512(p.add(68)));
    let hi = _mm512_permutex2var_epi16(load512(p.add(136)), index[1], load512(p.add(204)));
    _mm512_castsi512_si128(_mm512_mask_blend_epi16(0xf0, lo, hi))
}

/// The exact integer dots of 8 Q8_0 block pairs (blocks 2k and 2k + 1 in the halves of
/// `dots[k]`, each half 8 i32 lanes): [block 0, .., block 7]. A transpose-and-add tree (integer
/// adds: any order is exact): 32-bit then 64-bit interleaves leave, per 128-bit lane l, the lane
/// sums of the four inputs; a block is lanes (0, 1) or (2, 3) of its register.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn q8_0_reduce8(dots: &[__m512i; 4]) -> __m256i {
    let a = _mm512_add_epi32(
        _mm512_unpacklo_epi32(dots[0], dots[1]),
        _mm512_unpackhi_epi32(dots[0], dots[1]),
    );
    let b = _mm512_add_epi32(
        _mm512_unpacklo_epi32(dots[2], dots[3]),
        _mm512_unpackhi_epi32(dots[2], dots[3]),
    );
    // 128-bit lane l of c: the sums of lane l of dots[0], dots[1], dots[2], dots[3].
    let c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    // Lanes 0 and 2 of e: [blocks 0, 2, 4, 6] and [blocks 1, 3, 5, 7].
    let e = _mm512_add_epi32(c, _mm512_shuffle_i64x2::<0b10_11_00_01>(c, c));
    let order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, e))
}

/// The scalar reference's order (`dot::q8_0_blocks_add`): per block the exact integer dot
/// sum(x * y), then `sum += float(dot) * (d_x * d_y)` (a product, a product, a sum: three f32
/// roundings, no fma), block by block from the first; so the bits are the reference's.
/// Eight blocks per step: sum(x * y) = sum((x + 128) * y) - 128 * sum(y), both by `vpdpbusd`,
/// two blocks per register; the eight blocks' integers gathered into one vector by
/// `q8_0_reduce8`, their eight d_x * d_y and values computed in one vector each; then the
/// eight additions to the sum in block order (a dependent chain; the next step's integer work
/// overlaps it). The last nb mod 8 blocks by `q8_0_blocks_add` itself.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    check_len("dot_q8_0_q8_0", x.len(), y.len());
    let (flip, ones, zero) = (
        _mm512_set1_epi8(-128),
        _mm512_set1_epi8(1),
        _mm512_setzero_si512(),
    );
    let index = Q8_0_D_INDEX.map(|a| load512(a.as_ptr()));
    let mut sum = _mm_setzero_ps();
    let (xs, ys) = (x.chunks_exact(8), y.chunks_exact(8));
    let (x_tail, y_tail) = (xs.remainder(), ys.remainder());
    for (bx, by) in xs.zip(ys) {
        let join = |a: &BlockQ8_0, b: &BlockQ8_0| {
            _mm512_inserti64x4(
                _mm512_castsi256_si512(load256(a.qs.as_ptr())),
                load256(b.qs.as_ptr()),
                1,
            )
        };
        let dots: [__m512i; 4] = std::array::from_fn(|k| {
            let (xq, yq) = (
                join(&bx[2 * k], &bx[2 * k + 1]),
                join(&by[2 * k], &by[2 * k + 1]),
            );
            let s = _mm512_dpbusd_epi32(zero, _mm512_xor_si512(xq, flip), yq);
            let sum_y = _mm512_dpbusd_epi32(zero, ones, yq);
            _mm512_sub_epi32(s, _mm512_slli_epi32(sum_y, 7))
        });
        let dots = _mm256_cvtepi32_ps(q8_0_reduce8(&dots));
        let dx = _mm256_cvtph_ps(q8_0_d8(bx.as_ptr(), &index));
        let dy = _mm256_cvtph_ps(q8_0_d8(by.as_ptr(), &index));
        let v = _mm256_mul_ps(dots, _mm256_mul_ps(dx, dy));
        sum = super::avx2::add8_in_order(sum, v);
    }
    crate::dot::q8_0_blocks_add(_mm_cvtss_f32(sum), x_tail, y_tail)
}

/// The (scales, mins) of a Q4_K/Q5_K block: the eight scales as i16 in each 128-bit lane, and
/// the mins dotted with the Q8_K pair sums of `bsums` (8 i32 lanes, sub-block j in lane j:
/// m_j * (bsums[2j] + bsums[2j+1])).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn k4_scales_and_mins(scales: &[u8; 12], bsums: &[i16; 16]) -> (__m512i, __m256i) {
    let (sc, m) = unpack_scales_mins_k4(scales);
    let sm = _mm_set_epi64x(m as i64, sc as i64);
    // Mins (bytes 8..16 of sm) each repeated twice, widened to 16 i16 lanes.
    let dup = _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
    let mins_dot = _mm256_madd_epi16(mins, load256(bsums.as_ptr()));
    (_mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm)), mins_dot)
}

/// `vpshufb` controls, per group g of 64 values: i16 lanes 0..16 take scale 2g, lanes 16..32
/// scale 2g+1 (from the eight i16 scales repeated in every 128-bit lane).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn k4_scale_ctrls() -> [__m512i; 4] {
    let c = |j: i16| ((2 * j + 1) << 8) | (2 * j);
    [0, 1, 2, 3].map(|g| halves_epi16(c(2 * g), c(2 * g + 1)))
}

/// [sum of x0's lanes, .. x3's] (exact: integer adds).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, AVX2, FMA and F16C (the callers' kernels check it).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub fn reduce4_512(x: &[__m512i; 4]) -> __m128i {
    let a = _mm512_add_epi32(
        _mm512_unpacklo_epi32(x[0], x[1]),
        _mm512_unpackhi_epi32(x[0], x[1]),
    );
    let b = _mm512_add_epi32(
        _mm512_unpacklo_epi32(x[2], x[3]),
        _mm512_unpackhi_epi32(x[2], x[3]),
    );
    let c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    let d = _mm512_add_epi32(c, _mm512_shuffle_i64x2::<0b01_00_11_10>(c, c));
    let e = _mm512_add_epi32(d, _mm512_shuffle_i64x2::<0b10_11_00_01>(d, d));
    _mm512_castsi512_si128(e)
}

/// As `reduce4_512` for 8-lane vectors.
///
/// # Safety
/// As `reduce4_512`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub fn reduce4_256(x: &[__m256i; 4]) -> __m128i {
    let a = _mm256_add_epi32(
        _mm256_unpacklo_epi32(x[0], x[1]),
        _mm256_unpackhi_epi32(x[0], x[1]),
    );
    let b = _mm256_add_epi32(
        _mm256_unpacklo_epi32(x[2], x[3]),
        _mm256_unpackhi_epi32(x[2], x[3]),
    );
    let c = _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c))
}

/// Four K-quant block values in the scalar reference's order (`dot.rs`): per block the
/// integers summed exactly (isc over its 16 lanes, im over 8; one transpose-reduce for the
/// four), then `d_y * d * isc - d_y * dmin * im` in f32 (one 128-bit step; Q6_K passes zero
/// mins, and `x - 0` is `x`). The one-column kernels add them to their sum block by block
/// (`finish4`), muser-engine's multi-column kernels to four columns' sums; so every kernel gives
/// a (row, column) the bits of the scalar dot.
///
/// # Safety
/// As `reduce4_512`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub fn k_values4(isc: &[__m512i; 4], im: &[__m256i; 4], dd: &[f32; 4], dm: &[f32; 4]) -> [f32; 4] {
    let mut vs = [0f32; 4];
    // SAFETY: 4 f32.
    unsafe { _mm_storeu_ps(vs.as_mut_ptr(), k_values4_m128(isc, im, dd, dm)) };
    vs
}

/// `k_values4` as the lanes of one register.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn k_values4_m128(isc: &[__m512i; 4], im: &[__m256i; 4], dd: &[f32; 4], dm: &[f32; 4]) -> __m128 {
    let fi = _mm_cvtepi32_ps(reduce4_512(isc));
    let fm = _mm_cvtepi32_ps(reduce4_256(im));
    // SAFETY: 4 f32 each.
    let (d, m) = unsafe { (_mm_loadu_ps(dd.as_ptr()), _mm_loadu_ps(dm.as_ptr())) };
    _mm_sub_ps(_mm_mul_ps(d, fi), _mm_mul_ps(m, fm))
}

/// `sum` plus the first `k` of four blocks' values (`k_values4`), in block order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn finish4(
    mut sum: f32,
    isc: &[__m512i; 4],
    im: &[__m256i; 4],
    dd: &[f32; 4],
    dm: &[f32; 4],
    k: usize,
) -> f32 {
    if k == 4 {
        // sum + v0 + v1 + v2 + v3 in that order, in registers (a store of the four and four
        // scalar reloads cost a one-thread decode about 4%).
        let v = k_values4_m128(isc, im, dd, dm);
        let mut s = _mm_set_ss(sum);
        s = _mm_add_ss(s, v);
        s = _mm_add_ss(s, _mm_movehdup_ps(v));
        s = _mm_add_ss(s, _mm_movehl_ps(v, v));
        s = _mm_add_ss(s, _mm_shuffle_ps::<0b11_11_11_11>(v, v));
        return _mm_cvtss_f32(s);
    }
    for &x in &k_values4(isc, im, dd, dm)[..k] {
        sum += x;
    }
    sum
}

/// The block loop of a K-quant dot: `$body` makes block ($bx, $by)'s (isc lanes, im lanes,
/// d_y * d, d_y * dmin). Groups of four blocks through `finish4`: the whole groups unrolled
/// (their lanes stay in registers; a closure here cost 10% of a one-thread decode), then the
/// last blocks zero-filled to four.
macro_rules! k_blocks {
    ($x:ident, $y:ident, |$bx:ident, $by:ident| $body:block) => {{
        let mut sum = 0.0f32;
        let n = $x.len();
        let n4 = n / 4 * 4;
        let mut c = 0;
        while c < n {
            let k = if c < n4 { 4 } else { n - n4 };
            let mut isc = [_mm512_setzero_si512(); 4];
            let mut im = [_mm256_setzero_si256(); 4];
            let mut dd = [0f32; 4];
            let mut dm = [0f32; 4];
            if k == 4 {
                for i in 0..4 {
                    let ($bx, $by) = (&$x[c + i], &$y[c + i]);
                    let (a, b, e, f) = $body;
                    isc[i] = a;
                    im[i] = b;
                    dd[i] = e;
                    dm[i] = f;
                }
            } else {
                for i in 0..k {
                    let ($bx, $by) = (&$x[c + i], &$y[c + i]);
                    let (a, b, e, f) = $body;
                    isc[i] = a;
                    im[i] = b;
                    dd[i] = e;
                    dm[i] = f;
                }
            }
            sum = finish4(sum, &isc, &im, &dd, &dm, k);
            c += 4;
        }
        sum
    }};
}

/// Q4_K: per group g of 64 values, 32 qs bytes: low nibbles are sub-block 2g, high nibbles
/// sub-block 2g+1; the two halves of one register after the per-half shift.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    check_len("dot_q4_k_q8_k", x.len(), y.len());
    let m4 = _mm512_set1_epi8(0x0f);
    let shift = halves_epi16(0, 4);
    let ctrls = k4_scale_ctrls();
    k_blocks!(x, y, |bx, by| {
        let (scales, mins_dot) = k4_scales_and_mins(&bx.scales, &by.bsums);
        // Two i32 partial sums so the dpwssd chains of even and odd groups overlap.
        let mut sumi = [_mm512_setzero_si512(); 2];
        for g in 0..4 {
            let q = _mm512_and_si512(
                _mm512_srlv_epi16(load256_twice(bx.qs.as_ptr().add(32 * g)), shift),
                m4,
            );
            let p = _mm512_maddubs_epi16(q, load512(by.qs.as_ptr().add(64 * g)));
            let sc = _mm512_shuffle_epi8(scales, ctrls[g]);
            sumi[g & 1] = _mm512_dpwssd_epi32(sumi[g & 1], p, sc);
        }
        (
            _mm512_add_epi32(sumi[0], sumi[1]),
            mins_dot,
            by.d * f16_to_f32(bx.d),
            by.d * f16_to_f32(bx.dmin),
        )
    })
}

/// Q5_K: as Q4_K; the fifth bit of group g is bit 2g of `qh` for the low half (sub-block 2g) and
/// bit 2g+1 for the high half. `qh` (32 bytes, in both halves) is shifted right by 2 per group
/// and tested against bit 0 (low half) or bit 1 (high half); the 16-bit shift pulls neighbour
/// bits only into bits 6-7, never tested. Set bits add 16 to the 4-bit quant.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    check_len("dot_q5_k_q8_k", x.len(), y.len());
    let (m4, sixteen) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(16));
    let shift = halves_epi16(0, 4);
    let bit = halves_epi16(0x0101, 0x0202);
    let ctrls = k4_scale_ctrls();
    k_blocks!(x, y, |bx, by| {
        let (scales, mins_dot) = k4_scales_and_mins(&bx.scales, &by.bsums);
        let mut qh = load256_twice(bx.qh.as_ptr());
        let mut sumi = [_mm512_setzero_si512(); 2];
        for g in 0..4 {
            let q = _mm512_and_si512(
                _mm512_srlv_epi16(load256_twice(bx.qs.as_ptr().add(32 * g)), shift),
                m4,
            );
            let q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bit), q, sixteen);
            qh = _mm512_srli_epi16(qh, 2);
            let p = _mm512_maddubs_epi16(q, load512(by.qs.as_ptr().add(64 * g)));
            let sc = _mm512_shuffle_epi8(scales, ctrls[g]);
            sumi[g & 1] = _mm512_dpwssd_epi32(sumi[g & 1], p, sc);
        }
        (
            _mm512_add_epi32(sumi[0], sumi[1]),
            mins_dot,
            by.d * f16_to_f32(bx.d),
            by.d * f16_to_f32(bx.dmin),
        )
    })
}

/// Q6_K: per half of 128 values, the 64 ql bytes hold values 0..64 in their low nibbles and
/// 64..128 in their high nibbles; the 32 qh bytes (in both register halves) hold the top bits of
/// values l, l+32, l+64, l+96 in bit pairs 0-1, 2-3, 4-5, 6-7, moved to bits 4-5 by per-half
/// variable shifts (<<4, <<2 for the low nibbles; >>0, >>2 for the high ones; bits crossing
/// a byte boundary land outside 0x30). The quants are used unsigned (0..63):
/// sum(sc * (q - 32) * y) = sum(sc * q * y) - 32 * sum_j sc_j * bsums_j.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    check_len("dot_q6_k_q8_k", x.len(), y.len());
    let (m4, m30) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    let (shl_lo, shr_hi) = (halves_epi16(4, 2), halves_epi16(0, 2));
    let index = super::Q6_K_SCALE_INDEX.map(|a| load512(a.as_ptr()));
    k_blocks!(x, y, |bx, by| {
        let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr() as *const __m128i));
        let s512 = _mm512_zextsi256_si512(s16);
        let bias = _mm256_madd_epi16(s16, load256(by.bsums.as_ptr()));
        let mut sumi = [_mm512_setzero_si512(); 2];
        for h in 0..2 {
            let a = load512(bx.ql.as_ptr().add(64 * h));
            let qh = load256_twice(bx.qh.as_ptr().add(32 * h));
            let lo = _mm512_or_si512(
                _mm512_and_si512(a, m4),
                _mm512_and_si512(_mm512_sllv_epi16(qh, shl_lo), m30),
            );
            let hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(a, 4), m4),
                _mm512_and_si512(_mm512_srlv_epi16(qh, shr_hi), m30),
            );
            let yq = by.qs.as_ptr().add(128 * h);
            let plo = _mm512_maddubs_epi16(lo, load512(yq));
            let phi = _mm512_maddubs_epi16(hi, load512(yq.add(64)));
            sumi[0] =
                _mm512_dpwssd_epi32(sumi[0], plo, _mm512_permutexvar_epi16(index[2 * h], s512));
            sumi[1] = _mm512_dpwssd_epi32(
                sumi[1],
                phi,
                _mm512_permutexvar_epi16(index[2 * h + 1], s512),
            );
        }
        let s = _mm512_add_epi32(sumi[0], sumi[1]);
        let s = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        let s = _mm256_sub_epi32(s, _mm256_slli_epi32(bias, 5));
        // The scalar reference's order (`dot.rs`): `sum += d_y * d * isc` per block (no mins:
        // d_y * d * isc - 0 is the same f32).
        (
            _mm512_zextsi256_si512(s),
            _mm256_setzero_si256(),
            by.d * f16_to_f32(bx.d),
            0.0,
        )
    })
}
