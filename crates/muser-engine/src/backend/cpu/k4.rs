//! What the AVX-512 kernels of Q4_K and Q5_K share (`tile.rs`, `gemm.rs`): a block's d, dmin
//! and 6-bit scales are laid out alike, and a Q5_K quant is a Q4_K nibble plus a fifth bit, so
//! one kernel serves both once it reads a block's 64 quants of a group as bytes. Also the small
//! AVX-512 helpers those kernels and the Q8_0 tiles share.

use half::f16;
use muser_quant::{BlockQ4K, BlockQ5K};
use std::arch::x86_64::*;

/// i16 lanes 0..16 = a, lanes 16..32 = b.
#[inline(always)]
pub(super) unsafe fn halves_i16(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
        1,
    )
}

/// An f16 as f32 (exact; F16C).
#[inline(always)]
pub(super) unsafe fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

/// The same 32 bytes in both 256-bit halves.
#[inline(always)]
pub(super) unsafe fn load32_twice(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i))
}

/// The fields a Q4_K and a Q5_K block share (the tile kernel's inputs besides the quants).
pub trait K4Block {
    fn d(&self) -> f16;
    fn dmin(&self) -> f16;
    fn scales(&self) -> &[u8; 12];
    /// Group g's 64 quants as bytes: the low half values 64g..64g+32, the high half
    /// 64g+32..64g+64 (`shift`: 0 in the low i16 half, 4 in the high).
    ///
    /// # Safety
    /// The CPU must have AVX-512 BW.
    unsafe fn quants(&self, g: usize, m4: __m512i, shift: __m512i) -> __m512i;
}
/// Group g's Q4_K-style nibbles of `qs` as bytes (see `K4Block::quants`).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 128], g: usize, m4: __m512i, shift: __m512i) -> __m512i {
    _mm512_and_si512(
        _mm512_srlv_epi16(load32_twice(qs.as_ptr().add(32 * g)), shift),
        m4,
    )
}

/// d, dmin and the scales: the same fields in both blocks.
macro_rules! k4_fields {
    () => {
        fn d(&self) -> f16 {
            self.d
        }
        fn dmin(&self) -> f16 {
            self.dmin
        }
        fn scales(&self) -> &[u8; 12] {
            &self.scales
        }
    };
}

impl K4Block for BlockQ4K {
    k4_fields!();
    #[inline(always)]
    unsafe fn quants(&self, g: usize, m4: __m512i, shift: __m512i) -> __m512i {
        nibbles(&self.qs, g, m4, shift)
    }
}
/// Q5_K: the Q4_K nibble plus 16 times bit 2g (low half) or 2g + 1 (high half) of `qh[l]`,
/// as muser-quant's one-column kernel assembles them; values 0..31, so the kernels' i16 sums
/// of 4 products stay below 4 x 255 x 31 = 31,620.
impl K4Block for BlockQ5K {
    k4_fields!();
    #[inline(always)]
    unsafe fn quants(&self, g: usize, m4: __m512i, shift: __m512i) -> __m512i {
        // Bit 0 of each byte after a 16-bit shift by 2g / 2g + 1 is the byte's own bit.
        let hb = _mm512_and_si512(
            _mm512_srlv_epi16(
                load32_twice(self.qh.as_ptr()),
                halves_i16(2 * g as i16, 2 * g as i16 + 1),
            ),
            _mm512_set1_epi8(1),
        );
        _mm512_or_si512(nibbles(&self.qs, g, m4, shift), _mm512_slli_epi16(hb, 4))
    }
}
