//! The kernels of `x16`, written once over [`Level`]: what one register of R lanes (lane r = row r
//! of the group) does at an instruction-set level (`avx512.rs`: R = 16, `avx2.rs`: R = 8). Each
//! level wraps these bodies in functions compiled for its features; the bodies and the level's
//! methods are `#[inline(always)]`, so they are compiled inside those functions.

use super::{Ahead, Lay, Sums};
use muser_quant::BlockQ8K;

/// One register of R lanes at an instruction-set level.
pub(super) trait Level {
    const R: usize;
    /// Q4_K's high nibbles taken as 16 times their values (one `vpandn` instead of a shift and a
    /// mask; the sums are shifted back, exactly): only where products are summed in i32 at once.
    const HI16: bool;
    /// Groups whose products `acc` may sum before `flush` (the i16 stage of AVX2) for values up
    /// to 15, 31 and 63.
    const SPAN4: usize;
    const SPAN5: usize;
    type I: Copy;
    type F: Copy;
    /// A sum of 4-value products per row, in i32 (and in i16 first, where the level needs it).
    type Acc: Copy;

    unsafe fn zero() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn splat8(b: i8) -> Self::I;
    /// One line (4 R bytes).
    unsafe fn line(p: *const u8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// !a & b.
    unsafe fn andnot(a: Self::I, b: Self::I) -> Self::I;
    /// (a & m4) | b per byte (b has no bit of m4 set).
    unsafe fn low_or(a: Self::I, b: Self::I, m4: Self::I) -> Self::I;
    unsafe fn srli16<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn slli16<const N: u32>(a: Self::I) -> Self::I;
    /// Each byte's bit k moved to bit 4, the others cleared.
    unsafe fn bit_to_4(x: Self::I, k: usize) -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mullo(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn srai4(a: Self::I) -> Self::I;
    unsafe fn slli5(a: Self::I) -> Self::I;
    /// The low / high i16 of each lane, sign-extended.
    unsafe fn lo16(a: Self::I) -> Self::I;
    unsafe fn hi16(a: Self::I) -> Self::I;
    /// R bytes at p, zero-extended to the lanes.
    unsafe fn u8s(p: *const u8) -> Self::I;
    /// 2 R bytes at p as R pairs of i16 (zero- / sign-extended).
    unsafe fn u8_pairs(p: *const u8) -> Self::I;
    unsafe fn i8_pairs(p: *const u8) -> Self::I;
    /// acc + per lane the two i16 of a times those of the dword `pair` (`vpdpwssd`).
    unsafe fn madd_pairs(acc: Self::I, a: Self::I, pair: i32) -> Self::I;

    unsafe fn acc_zero() -> Self::Acc;
    /// acc + per lane the 4 products of w's bytes (unsigned) with the 4 at y (signed).
    unsafe fn acc_add(acc: Self::Acc, w: Self::I, y: *const i8) -> Self::Acc;
    /// The i16 stage moved into the i32 sums.
    unsafe fn acc_flush(acc: Self::Acc) -> Self::Acc;
    unsafe fn acc_i32(acc: Self::Acc) -> Self::I;

    /// R halves at p as f32.
    unsafe fn f16s(p: *const u8) -> Self::F;
    unsafe fn splat_f(v: f32) -> Self::F;
    unsafe fn to_f(a: Self::I) -> Self::F;
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sub_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn store_f(p: *mut f32, a: Self::F);
}

/// Block (`Ahead::Block`): at the start of each super-block, every line of the bytes PF_BLOCK
/// further on (the next ~2 blocks of the group, or the next group's first ones, which follow in
/// memory), into L1. The hardware prefetchers alone left one thread at 13-15 GB/s on a Zen 5:
/// they stop at 4 KiB page boundaries, and a group's forward stream crosses one every ~1.7
/// blocks. 2-core AMD EPYC Zen 5 (2026-12-03), llama-1b Q4_K_M, one thread, tg32 tokens/s in
/// three alternated rounds: no prefetch 27.1-33.8, 1,024 bytes ahead 29.9-37.7, 2,048 33.6-40.8,
/// 4,096 37.9-47.1, 8,192 38.2-42.9 (BENCHMARKS.md).
const PF_BLOCK: usize = 4096;

/// Spread (`Ahead::Spread`): with each line the kernel reads, its share of the block's lines
/// PF_SPREAD further on, into L2 (T1). On a Zen 4 (2026-12-04, one thread, 8192 x 8192 from
/// memory) 8-64 KiB ahead gave the same speeds, 4 KiB less, and the same lines asked for at the
/// block's start or into L1 less again (BENCHMARKS.md).
const PF_SPREAD: usize = 16384;

/// Asks for the lines of [p + PF_BLOCK, p + PF_BLOCK + n) (SSE, so every level has it):
/// prefetches never fault, so past the end of the matrix they are harmless.
#[inline(always)]
fn block_ahead(p: *const u8, n: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let mut o = 0;
    while o < n {
        // SAFETY: a prefetch reads nothing and never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PF_BLOCK + o) as *const i8) };
        o += 64;
    }
}

/// Step k of `parts` of a block of n bytes at p: asks L2 for its share of the block's lines
/// PF_SPREAD further on.
#[inline(always)]
fn spread_ahead(p: *const u8, n: usize, k: usize, parts: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let lines = n / 64;
    for j in k * lines / parts..(k + 1) * lines / parts {
        // SAFETY: a prefetch reads nothing and never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PF_SPREAD + 64 * j) as *const i8) };
    }
}

/// One group's R rows of Q4_K (FIVE = false) or Q5_K against C columns (`y`: C x nb blocks) over
/// all nb blocks.
#[inline(always)]
pub(super) unsafe fn group_k4<V: Level, const C: usize, const FIVE: bool>(
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    sums: &mut Sums,
    pf: Ahead,
) {
    let l = Lay { r: V::R };
    let line = 4 * V::R;
    let (bs, qs0) = if FIVE {
        (180 * V::R, l.qs(true))
    } else {
        (148 * V::R, l.qs(false))
    };
    let hi16 = V::HI16 && !FIVE;
    let span = if FIVE { V::SPAN5 } else { V::SPAN4 };
    let m4 = V::splat8(0x0F);
    let mut acc = [V::zero_f(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * bs);
        if pf == Ahead::Block {
            block_ahead(p, bs);
        }
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [V::zero(); C];
        for ch in 0..4 {
            let mut lo = [V::acc_zero(); C];
            let mut hi = [V::acc_zero(); C];
            for q in 0..8 {
                if pf == Ahead::Spread {
                    spread_ahead(p, bs, 8 * ch + q, 32);
                }
                let v = V::line(p.add(qs0 + line * (8 * ch + q)));
                let (vl, vh) = if FIVE {
                    // Values 0..31: the nibble and the fifth bit (bit 2 ch / 2 ch + 1 of qh).
                    let h = V::line(p.add(l.qh5() + line * q));
                    (
                        V::low_or(v, V::bit_to_4(h, 2 * ch), m4),
                        V::low_or(V::srli16::<4>(v), V::bit_to_4(h, 2 * ch + 1), m4),
                    )
                } else if hi16 {
                    (V::and(v, m4), V::andnot(m4, v))
                } else {
                    (V::and(v, m4), V::and(V::srli16::<4>(v), m4))
                };
                for t in 0..C {
                    let qs = yb[t].qs.as_ptr();
                    lo[t] = V::acc_add(lo[t], vl, qs.add(64 * ch + 4 * q));
                    hi[t] = V::acc_add(hi[t], vh, qs.add(64 * ch + 32 + 4 * q));
                }
                if (q + 1) % span == 0 && q < 7 {
                    for t in 0..C {
                        lo[t] = V::acc_flush(lo[t]);
                        hi[t] = V::acc_flush(hi[t]);
                    }
                }
            }
            let sl = V::u8s(p.add(l.sc() + V::R * 2 * ch));
            let sh = V::u8s(p.add(l.sc() + V::R * (2 * ch + 1)));
            for t in 0..C {
                // HI16: the sums are 16 x the exact ones, so the shift is exact.
                let h = V::acc_i32(hi[t]);
                let h = if hi16 { V::srai4(h) } else { h };
                let s = V::add(V::mullo(V::acc_i32(lo[t]), sl), V::mullo(h, sh));
                isc[t] = V::add(isc[t], s);
            }
        }
        let d = V::f16s(p);
        let dmin = V::f16s(p.add(l.dmin()));
        let mp: [V::I; 4] = std::array::from_fn(|k| V::u8_pairs(p.add(l.mn() + 2 * V::R * k)));
        for t in 0..C {
            let bsum = &yb[t].bsums;
            let mut im = V::zero();
            for (k, m) in mp.iter().enumerate() {
                let s0 = bsum[4 * k] as i32 + bsum[4 * k + 1] as i32;
                let s1 = bsum[4 * k + 2] as i32 + bsum[4 * k + 3] as i32;
                im = V::madd_pairs(im, *m, (s0 & 0xffff) | (s1 << 16));
            }
            // d_y * d * isc - d_y * dmin * im, as the scalar reference.
            let dy = V::splat_f(yb[t].d);
            let a1 = V::mul_f(V::mul_f(dy, d), V::to_f(isc[t]));
            let a2 = V::mul_f(V::mul_f(dy, dmin), V::to_f(im));
            acc[t] = V::add_f(acc[t], V::sub_f(a1, a2));
        }
    }
    for t in 0..C {
        V::store_f(sums[t].as_mut_ptr(), acc[t]);
    }
}

/// As `group_k4` for Q6_K. Per half n of a block and dword q of its 32 values: `ql` dwords
/// 16 n + q (A) and 16 n + 8 + q (B), `qh` dword 8 n + q (H) (one triple of lines, `Lay::q6`)
/// make the groups of values 128 n + 4 q + 32 k (k = 0..3): A's low nibbles with H's bits 0-1,
/// B's with bits 2-3, A's high nibbles with bits 4-5, B's with bits 6-7; group k is in
/// sub-block 8 n + 2 k + q / 4. The -32 of every quant is taken back once per block: 32 times
/// sum_j sc_j x (sum of sub-block j's activations).
#[inline(always)]
pub(super) unsafe fn group_q6<V: Level, const C: usize>(
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    sums: &mut Sums,
    pf: Ahead,
) {
    let l = Lay { r: V::R };
    let line = 4 * V::R;
    let m4 = V::splat8(0x0F);
    let m30 = V::splat8(0x30);
    let mut acc = [V::zero_f(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * 212 * V::R);
        if pf == Ahead::Block {
            block_ahead(p, 212 * V::R);
        }
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [V::zero(); C];
        // Scale pairs as i16 (sc_2k low, sc_2k+1 high in each lane).
        let sp: [V::I; 8] = std::array::from_fn(|k| V::i8_pairs(p.add(2 * V::R * k)));
        for n in 0..2 {
            for h in 0..2 {
                let mut a = [[V::acc_zero(); C]; 4];
                for q in 4 * h..4 * h + 4 {
                    if pf == Ahead::Spread {
                        spread_ahead(p, 212 * V::R, 8 * n + q, 16);
                    }
                    let at = p.add(l.q6(n, q));
                    let (va, vb, vh) = (
                        V::line(at),
                        V::line(at.add(line)),
                        V::line(at.add(2 * line)),
                    );
                    let g = [
                        V::low_or(va, V::and(V::slli16::<4>(vh), m30), m4),
                        V::low_or(vb, V::and(V::slli16::<2>(vh), m30), m4),
                        V::low_or(V::srli16::<4>(va), V::and(vh, m30), m4),
                        V::low_or(V::srli16::<4>(vb), V::and(V::srli16::<2>(vh), m30), m4),
                    ];
                    for t in 0..C {
                        let qs = yb[t].qs.as_ptr().add(128 * n + 4 * q);
                        for k in 0..4 {
                            // Values up to 63: each group's products are moved to i32 at once.
                            a[k][t] = V::acc_flush(V::acc_add(a[k][t], g[k], qs.add(32 * k)));
                        }
                    }
                }
                // Sub-blocks j = 8 n + 2 k + h: scale pair 4 n + k, its low (h = 0) or high i16.
                for k in 0..4 {
                    let pair = sp[4 * n + k];
                    let s = if h == 0 { V::lo16(pair) } else { V::hi16(pair) };
                    for t in 0..C {
                        isc[t] = V::add(isc[t], V::mullo(V::acc_i32(a[k][t]), s));
                    }
                }
            }
        }
        let d = V::f16s(p.add(l.d6()));
        for t in 0..C {
            let bsum = yb[t].bsums.as_ptr();
            let mut corr = V::zero();
            for (k, s) in sp.iter().enumerate() {
                corr = V::madd_pairs(
                    corr,
                    *s,
                    std::ptr::read_unaligned(bsum.add(2 * k) as *const i32),
                );
            }
            let isum = V::sub(isc[t], V::slli5(corr));
            // d_y * d * isc, as the scalar reference.
            let dy = V::splat_f(yb[t].d);
            acc[t] = V::add_f(acc[t], V::mul_f(V::mul_f(dy, d), V::to_f(isum)));
        }
    }
    for t in 0..C {
        V::store_f(sums[t].as_mut_ptr(), acc[t]);
    }
}
