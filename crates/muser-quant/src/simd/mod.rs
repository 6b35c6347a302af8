//! x86 SIMD dot kernels (AVX2, AVX-512) beside the scalar references, and the run-time choice
//! among them (`Kernels::detect`). Each kernel computes the same dot as its counterpart in
//! `crate::dot`, within 1e-4 relative: the quantized kernels form exactly the same integer sums
//! per block as the scalar ones, only the f32 accumulation across blocks may be ordered
//! differently. The Q8_0 kernels of every level and the AVX-512 K-quant kernels keep the scalar
//! order (per block the exact integers, then the reference's f32 step, block by block), so their
//! bits are the scalar dots' (tested), and muser-engine's multi-column and tiled kernels give
//! those same bits.
//!
//! Levels:
//! - `avx2`: AVX2 + FMA + F16C (`avx2.rs`).
//! - `avx512`: AVX-512 F/BW/VL + VNNI, plus AVX2/FMA/F16C (`avx512.rs`). A CPU with AVX-512 but
//!   no VNNI (Skylake-X) gets the AVX2 level; decode is bandwidth-bound and AVX2 reaches it there.
//!   AVX-512 BF16 is not used: its dot (`vdpbf16ps`) needs bf16 activations, ours are f32, and
//!   widening bf16 weights to f32 is one shift.
//!
//! The environment variable `MUSER_ISA=scalar|avx2|avx512` caps the level `detect` picks (to
//! benchmark or test a lower one); it never raises it above what the CPU has.
//!
//! This module never allocates and never panics except on mismatched slice lengths (as the
//! scalar references do).

use crate::blocks::*;
use half::{bf16, f16};

/// `vpermw` indices for Q6_K: for half h and part p (values 64p..64p+64 of the half), i16 lane
/// i takes scale 8h + 4p + i/8 (each 16-value sub-block is 8 i16 pair sums).
const fn q6_k_scale_index(h: usize, p: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        idx[i] = (8 * h + 4 * p + i / 8) as i16;
        i += 1;
    }
    idx
}
pub const Q6_K_SCALE_INDEX: [[i16; 32]; 4] = [
    q6_k_scale_index(0, 0),
    q6_k_scale_index(0, 1),
    q6_k_scale_index(1, 0),
    q6_k_scale_index(1, 1),
];

/// Panics when a weight row and its activation differ in length, as the scalar dots do.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn check_len(what: &str, a: usize, b: usize) {
    assert_eq!(
        a, b,
        "{what}: weight and activation lengths differ ({a} vs {b})"
    );
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
/// The exact 4-way lane sums of the AVX-512 kernels' per-block order, for the multi-column
/// kernels that must give the same bits (muser-engine's `gemm.rs`).
#[cfg(target_arch = "x86_64")]
pub use avx512::{k_values4, reduce4_256, reduce4_512};

/// The dot kernels chosen for this CPU, once, by feature detection.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// "scalar", "avx2" or "avx512": what `detect` chose.
    pub isa: &'static str,
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub dot_f16_f32: fn(&[f16], &[f32]) -> f32,
    pub dot_bf16_f32: fn(&[bf16], &[f32]) -> f32,
    pub dot_q8_0_q8_0: fn(&[BlockQ8_0], &[BlockQ8_0]) -> f32,
    pub dot_q4_k_q8_k: fn(&[BlockQ4K], &[BlockQ8K]) -> f32,
    pub dot_q5_k_q8_k: fn(&[BlockQ5K], &[BlockQ8K]) -> f32,
    pub dot_q6_k_q8_k: fn(&[BlockQ6K], &[BlockQ8K]) -> f32,
    /// Multi-column K-quant dots whose every column has the bits of this level's one-column dot
    /// (`None` where the level has none of its own: scalar; AVX-512's multi-column and tiled
    /// kernels live in muser-engine and keep the scalar order).
    pub cols: Option<KCols>,
}

/// A C-column dot: out[c] = dot(w, y[c]).
pub type DotCols<W, const C: usize> = fn(&[W], [&[BlockQ8K]; C]) -> [f32; C];

/// The multi-column K-quant dots of a level, 2, 4 and 8 columns: a weight block is unpacked once
/// for all the columns (decode groups and prefill reuse each weight row across columns).
#[derive(Clone, Copy)]
pub struct KCols {
    pub q4_k2: DotCols<BlockQ4K, 2>,
    pub q4_k4: DotCols<BlockQ4K, 4>,
    pub q4_k8: DotCols<BlockQ4K, 8>,
    pub q5_k2: DotCols<BlockQ5K, 2>,
    pub q5_k4: DotCols<BlockQ5K, 4>,
    pub q5_k8: DotCols<BlockQ5K, 8>,
    pub q6_k2: DotCols<BlockQ6K, 2>,
    pub q6_k4: DotCols<BlockQ6K, 4>,
    pub q6_k8: DotCols<BlockQ6K, 8>,
}

impl Kernels {
    /// The scalar reference kernels.
    pub fn scalar() -> Kernels {
        use crate::dot::*;
        Kernels {
            isa: "scalar",
            dot_f32: vec_dot_f32,
            dot_f16_f32: vec_dot_f16_f32,
            dot_bf16_f32: vec_dot_bf16_f32,
            dot_q8_0_q8_0: vec_dot_q8_0_q8_0,
            dot_q4_k_q8_k: vec_dot_q4_k_q8_k,
            dot_q5_k_q8_k: vec_dot_q5_k_q8_k,
            dot_q6_k_q8_k: vec_dot_q6_k_q8_k,
            cols: None,
        }
    }

    /// The AVX2 + FMA + F16C kernels, if this CPU runs them.
    pub fn avx2() -> Option<Kernels> {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            return Some(avx2::kernels());
        }
        None
    }

    /// The AVX-512 (F, BW, VL, VNNI) kernels, if this CPU runs them.
    pub fn avx512() -> Option<Kernels> {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            return Some(avx512::kernels());
        }
        None
    }

    /// Every level this CPU runs, lowest first (scalar is always there).
    pub fn all_available() -> Vec<Kernels> {
        [Some(Kernels::scalar()), Kernels::avx2(), Kernels::avx512()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The fastest kernels this CPU runs, capped by `MUSER_ISA` when set (detected once, then
    /// cached).
    pub fn detect() -> &'static Kernels {
        static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
        K.get_or_init(|| Kernels::best_up_to(std::env::var("MUSER_ISA").ok().as_deref()))
    }

    /// The fastest available level not above `cap` ("scalar", "avx2", "avx512"; `None` or an
    /// unknown name: no cap).
    pub fn best_up_to(cap: Option<&str>) -> Kernels {
        let rank = |isa: &str| ["scalar", "avx2", "avx512"].iter().position(|&n| n == isa);
        let cap = cap.and_then(|c| rank(c.trim())).unwrap_or(usize::MAX);
        Kernels::all_available()
            .into_iter()
            .rfind(|k| rank(k.isa).unwrap() <= cap)
            .expect("the scalar level is always available")
    }
}

/// Unpack Q4_K/Q5_K's 12 packed scale bytes into (eight 6-bit scales, eight 6-bit mins), one per
/// byte (sub-block j in byte j of each little-endian u64), working on three little-endian u32
/// words at once (SPEC section 8): for j < 4 scale j and min j are the low 6 bits of bytes j and
/// j+4; for j >= 4 the low 4 bits come from byte j+4's low (scale) or high (min) nibble and the
/// top 2 bits from the top 2 bits of byte j-4 (scale) or byte j (min).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
fn unpack_scales_mins_k4(s: &[u8; 12]) -> (u64, u64) {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let sc_lo = w0 & 0x3f3f_3f3f;
    let m_lo = w1 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let m_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        m_lo as u64 | (m_hi as u64) << 32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_scales_matches_the_spec_byte_rule() {
        let mut state = 0x1234_5678u32;
        for _ in 0..1000 {
            let mut s = [0u8; 12];
            for b in &mut s {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *b = (state >> 24) as u8;
            }
            let (sc, m) = unpack_scales_mins_k4(&s);
            let (sc, m) = (sc.to_le_bytes(), m.to_le_bytes());
            for j in 0..8 {
                let (want_sc, want_m) = if j < 4 {
                    (s[j] & 63, s[j + 4] & 63)
                } else {
                    (
                        (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4,
                        (s[j + 4] >> 4) | (s[j] >> 6) << 4,
                    )
                };
                assert_eq!((sc[j], m[j]), (want_sc, want_m), "sub-block {j} of {s:?}");
            }
        }
    }

    #[test]
    fn isa_cap_never_raises_the_level() {
        assert_eq!(Kernels::best_up_to(Some("scalar")).isa, "scalar");
        let best = Kernels::best_up_to(None).isa;
        assert_eq!(Kernels::best_up_to(Some("avx512")).isa, best);
        let avx2 = Kernels::best_up_to(Some("avx2")).isa;
        assert!(avx2 == "avx2" || avx2 == "scalar");
    }
}
