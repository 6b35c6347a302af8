//! Register-tiled prefill matmul (AVX-512 VNNI): Q4_K / Q5_K / Q6_K weights x Q8_K activations,
//! a tile of R = 4 weight rows x C = 4 activation columns at a time. Serves every matmul of
//! 8 columns or more (`matmul::TILE_MIN_COLUMNS`). Q5_K runs the Q4_K microkernel: its unpack
//! adds the fifth bit, so the quants are 0..31 instead of 0..15 (a lane's i16 half stays below
//! 4 x 255 x 31 = 31,620), and the scales, mins and the f32 work are Q4_K's, as in muser-quant's
//! one-column kernels. On a Q5_K llama-1b (2 threads, 2026-11-30) pp512 went from 105 tokens/s
//! (one-column dots per column) to 337-354.
//!
//! Layout. The activation columns are copied once per matmul into a [`Panel`]: each block's 256
//! quants plus 128 (unsigned bytes), 64-byte aligned; the `bsums` of two neighbouring columns
//! side by side; the scales `d` of four neighbouring columns side by side (columns padded to a
//! multiple of 4). A task's weight rows are unpacked once, 4 rows x 1 block at a time: the
//! quants as bytes (Q4_K nibbles / Q6_K 6-bit values), the sub-block scales as the i16 vectors
//! the multiply wants, the mins, the f32 block scales.
//!
//! Loop nest (`gemm_body`). Columns in chunks of 128 (their activations and their tiles'
//! accumulators stay in L2); per chunk, row tile and step of 8 blocks (the row tile's unpacked
//! blocks stay in L1), every column tile of the chunk runs the step's blocks into its f32
//! accumulators; after the last step the sums are reduced and stored.
//!
//! Microkernel (inline asm: the 16 i32 sums in zmm0..15, the columns' quants of two groups in
//! zmm16..23, a row's quants and scales in zmm24..26). Per block and per pair of 64-value
//! groups, for each of the 16 (row, column) pairs, Q4_K: y = dot(a1 + 128, q1) per i32 lane
//! (`vpdpbusd` from zero), shifted to the high i16, plus dot(a0 + 128, q0) (both in 0..=15,300,
//! so no carry crosses the i16 boundary), then one `vpdpwssd` multiplies the two i16 halves by
//! the two groups' sub-block scales into the sum, which starts from minus 128 x the scaled
//! quant sums (the +128 taken back). Q6_K: two `vpdpbusd` (quants unsigned, activations
//! signed, |dot| < 2^15) blended into the i16 halves, then `vpdpwssd`. That is 3 multiply-port
//! instructions per 128 products (the one-column kernel needs 4: `vpmaddubsw` + `vpdpwssd` per
//! group); the shift and blend run on other ports. A row's quants and scales are loaded once
//! for 4 columns, a column's quants once for 4 rows. Then per block: the 16 sums to f32 and one
//! FMA each with d_row * d_column (the 16 products from one multiply, broadcast by `vpermps`),
//! for Q4_K also the mins (`vpmaddwd` of the mins with two columns' bsums at once, one FMA per
//! two pairs); the f32 accumulators live in memory (L1).
//!
//! Exactness. Per (row, column) every i32 lane ends a block holding exactly the integer of the
//! same lane in muser-quant's AVX-512 one-column kernel (same 4 values per lane per group, same
//! scales; integer sums are exact in any order), and the f32 work is that kernel's: one
//! conversion and one FMA per block in block order (for Q4_K the mins too, on 8 lanes), the
//! same products `d_row * d_column`, the same final reduction tree (`_mm512_reduce_add_ps`'s,
//! done for 16 pairs at once). So a matmul gives bit for bit what one-column dots give, and
//! prefill logits equal decode logits. Tested in `tests/gemm.rs`.
//!
//! Speed (2026-11-29, 2-core AMD EPYC Zen 5, one thread, `tests/gemm_speed.rs`, 512 columns):
//! Q4_K 7168x2048 ~190 GMAC/s, 2048x7168 ~170, Q6_K 2048x7168 ~170; the multi-column dots it
//! replaces ran at ~90-100. The bound is the multiply ports: per block a 4 x 4 tile issues 96
//! VNNI instructions and 34 f32 multiply/FMA ones, 65 cycles at 2 per cycle (about 250 GMAC/s
//! at 4.2 GHz); the rest goes to loads of the f32 accumulators and to the L2 streams.

use super::k4::K4Block;
use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};

/// Rows x columns of a tile.
pub const R: usize = 4;
pub const C: usize = 4;

/// out[t * rows + r] = dot(W[r], y[t]) for a row-major `rows x nb` block matrix `w` and `n`
/// activation columns of `nb` blocks each (`y` is `n x nb`).
pub type GemmFn<W> = fn(w: &[W], rows: usize, y: &[BlockQ8K], n: usize, out: &mut [f32]);

/// Whether this CPU runs the tiled kernels.
pub fn available() -> bool {
    super::gemm::has_avx512_vnni()
}

/// The tiled Q4_K kernel (panel built inside) when this CPU runs it.
pub fn q4_k_gemm() -> Option<GemmFn<BlockQ4K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel::new(y, n, w.len() / rows.max(1));
        gemm_q4_k(w, rows, &p, out)
    })
}

/// The tiled Q5_K kernel (panel built inside) when this CPU runs it.
pub fn q5_k_gemm() -> Option<GemmFn<BlockQ5K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel::new(y, n, w.len() / rows.max(1));
        gemm_q5_k(w, rows, &p, out)
    })
}

/// The tiled Q6_K kernel (panel built inside) when this CPU runs it.
pub fn q6_k_gemm() -> Option<GemmFn<BlockQ6K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel::new(y, n, w.len() / rows.max(1));
        gemm_q6_k(w, rows, &p, out)
    })
}

/// 64 bytes, 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

const ZERO_LINE: Line = Line([0; 64]);

/// Q8_K activation columns in the tile kernels' layout.
pub struct Panel {
    n: usize,
    nb: usize,
    /// Column t, block i: 4 lines of quants plus 128 (as u8) at (t * nb + i) * 4.
    qs: Vec<Line>,
    /// Column pair p (columns 2p, 2p+1), block i: line p * nb + i holds bsums(2p) then
    /// bsums(2p+1), 16 i16 each.
    bsums2: Vec<Line>,
    /// Column quad u (columns 4u..4u+4), block i: d at (u * nb + i) * 4 + (t - 4u).
    d: Vec<f32>,
}

impl Panel {
    /// Lays out `n` columns of `nb` Q8_K blocks each (`y` is `n x nb`), four columns per
    /// task on the current rayon pool.
    pub fn new(y: &[BlockQ8K], n: usize, nb: usize) -> Panel {
        use rayon::prelude::*;
        assert_eq!(y.len(), n * nb, "panel: {n} columns of {nb} blocks");
        let np = n.div_ceil(C) * C;
        let mut qs = vec![ZERO_LINE; np * nb * 4];
        let mut bsums2 = vec![ZERO_LINE; np / 2 * nb];
        let mut d = vec![0f32; np * nb];
        if nb > 0 {
            qs.par_chunks_mut(C * nb * 4)
                .zip(bsums2.par_chunks_mut(C / 2 * nb))
                .zip(d.par_chunks_mut(C * nb))
                .enumerate()
                .for_each(|(u, ((qs, bsums2), d))| {
                    for c in 0..C.min(n.saturating_sub(C * u)) {
                        let t = C * u + c;
                        for i in 0..nb {
                            let b = &y[t * nb + i];
                            let q = &mut qs[(c * nb + i) * 4..(c * nb + i) * 4 + 4];
                            for (g, line) in q.iter_mut().enumerate() {
                                // a + 128: the unsigned side of `vpdpbusd`.
                                for (o, &v) in line.0.iter_mut().zip(&b.qs[64 * g..64 * g + 64]) {
                                    *o = v as u8 ^ 0x80;
                                }
                            }
                            let half = (c % 2) * 32;
                            bsums2[c / 2 * nb + i].0[half..half + 32]
                                .copy_from_slice(bytemuck::cast_slice(&b.bsums));
                            d[i * C + c] = b.d;
                        }
                    }
                });
        }
        Panel {
            n,
            nb,
            qs,
            bsums2,
            d,
        }
    }

    pub fn n(&self) -> usize {
        self.n
    }
}

fn check_shapes_into<W>(what: &str, w: &[W], rows: usize, p: &Panel, ld: usize) {
    assert!(available(), "{what} needs AVX-512 VNNI");
    assert_eq!(
        w.len(),
        rows * p.nb,
        "{what}: {} blocks for {rows} rows of {}",
        w.len(),
        p.nb
    );
    assert!(ld >= rows, "{what}: row stride {ld} < {rows} rows");
    assert!(p.nb > 0 || rows == 0);
}

fn check_shapes<W>(what: &str, w: &[W], rows: usize, p: &Panel, out: &[f32]) {
    assert!(available(), "{what} needs AVX-512 VNNI");
    assert_eq!(
        w.len(),
        rows * p.nb,
        "{what}: {} blocks for {rows} rows of {}",
        w.len(),
        p.nb
    );
    assert_eq!(out.len(), rows * p.n, "{what}: output of {} x {rows}", p.n);
    assert!(p.nb > 0 || rows == 0);
}

/// Columns per chunk: the chunk's activations (and its tiles' accumulators) stay in L2.
const CHUNK: usize = 128;
/// Blocks per K step: a row tile's unpacked blocks of one step (8 x 2 KB) stay in L1 while
/// the column tiles of the chunk pass over them.
const KC: usize = 8;

/// Rows of a task for `nb` blocks per row, in whole tiles: the task's unpacked rows (about
/// 544 bytes per row and block) stay in L2 (with a chunk's activations) while every column
/// chunk passes over them. The backend's own rule may cut it further for balance.
pub fn rows_per_task(nb: usize) -> usize {
    let tiles = 300 * 1024 / (std::mem::size_of::<x86::Q4W>() * nb.max(1));
    tiles.clamp(1, 16) * R
}

thread_local! {
    static Q4_BUF: std::cell::RefCell<Vec<x86::Q4W>> = const { std::cell::RefCell::new(Vec::new()) };
    static Q6_BUF: std::cell::RefCell<Vec<x86::Q6W>> = const { std::cell::RefCell::new(Vec::new()) };
    static ACC_BUF: std::cell::RefCell<Vec<x86::Acc>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs f on this thread's buffer of at least `len` items (contents stale: callers overwrite
/// what they read).
fn with_buf<T, R2, F: FnOnce(&mut [T]) -> R2>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>,
    len: usize,
    zero: fn() -> T,
    f: F,
) -> R2 {
    let mut buf = key.with(|b| std::mem::take(&mut *b.borrow_mut()));
    if buf.len() < len {
        buf.resize_with(len, zero);
    }
    let r = f(&mut buf[..len]);
    key.with(|b| *b.borrow_mut() = buf);
    r
}

/// The loop nest shared by the formats: every row tile unpacked once; then for each chunk of
/// columns, each row tile, each step of KC blocks, every column tile of the chunk runs those
/// blocks into its accumulators (the last step stores the sums).
macro_rules! gemm_body {
    ($w:ident, $rows:ident, $p:ident, $out:ident, $ld:ident, $key:ident, $T:ty, $unpack:path, $tile:path, $finish:path) => {{
        let nb = $p.nb;
        let tiles = $rows.div_ceil(R);
        with_buf(&$key, tiles * nb, <$T>::zero, |buf| {
            for (k, b) in buf.chunks_exact_mut(nb).enumerate() {
                let r0 = k * R;
                let rr = R.min($rows - r0);
                // SAFETY: the features were checked; rows r0..r0+rr exist.
                unsafe { $unpack(&$w[r0 * nb..(r0 + rr) * nb], rr, nb, b) };
            }
            with_buf(&ACC_BUF, CHUNK / C, x86::Acc::zero, |accs| {
                for c0 in (0..$p.n).step_by(CHUNK) {
                    let c1 = (c0 + CHUNK).min($p.n);
                    for (k, b) in buf.chunks_exact(nb).enumerate() {
                        let r0 = k * R;
                        let rr = R.min($rows - r0);
                        for k0 in (0..nb).step_by(KC) {
                            let k1 = (k0 + KC).min(nb);
                            for (j, t0) in (c0..c1).step_by(C).enumerate() {
                                let acc = &mut accs[j];
                                // SAFETY: column tile t0..t0+4 (t0 < c1) is inside the padded
                                // panel; blocks k0..k1 <= nb; the finish writes out[t * ld + r]
                                // only for t < c1 <= n, r < r0 + rr <= rows (inside out by the
                                // caller's contract).
                                unsafe {
                                    $tile(&b[k0..k1], $p, t0, k0, acc, k0 == 0);
                                    if k1 == nb {
                                        let o = $out.add(t0 * $ld + r0);
                                        $finish(acc, o, $ld, rr, C.min(c1 - t0));
                                    }
                                }
                            }
                        }
                    }
                }
            })
        })
    }};
}

/// out[t * rows + r] = dot(W[r], column t) for every row of `w` (`rows x nb` blocks).
pub fn gemm_q4_k(w: &[BlockQ4K], rows: usize, p: &Panel, out: &mut [f32]) {
    gemm_k4("gemm_q4_k", w, rows, p, out)
}

/// As [`gemm_q4_k`], writing out[t * ld + r].
///
/// # Safety
/// `out` must be valid for writes at t * ld + r for every column t < n and row r < rows, and
/// no one else may access those elements meanwhile.
pub unsafe fn gemm_q4_k_into(w: &[BlockQ4K], rows: usize, p: &Panel, out: *mut f32, ld: usize) {
    gemm_k4_into("gemm_q4_k", w, rows, p, out, ld)
}

/// As [`gemm_q4_k`] for Q5_K weights (the Q4_K tile kernel over quants 0..31).
pub fn gemm_q5_k(w: &[BlockQ5K], rows: usize, p: &Panel, out: &mut [f32]) {
    gemm_k4("gemm_q5_k", w, rows, p, out)
}

/// As [`gemm_q4_k_into`] for Q5_K weights.
///
/// # Safety
/// As [`gemm_q4_k_into`].
pub unsafe fn gemm_q5_k_into(w: &[BlockQ5K], rows: usize, p: &Panel, out: *mut f32, ld: usize) {
    gemm_k4_into("gemm_q5_k", w, rows, p, out, ld)
}

fn gemm_k4<B: K4Block>(what: &str, w: &[B], rows: usize, p: &Panel, out: &mut [f32]) {
    check_shapes(what, w, rows, p, out);
    // SAFETY: out holds n x rows.
    unsafe { gemm_k4_into(what, w, rows, p, out.as_mut_ptr(), rows) }
}

/// # Safety
/// As [`gemm_q4_k_into`].
unsafe fn gemm_k4_into<B: K4Block>(
    what: &str,
    w: &[B],
    rows: usize,
    p: &Panel,
    out: *mut f32,
    ld: usize,
) {
    check_shapes_into(what, w, rows, p, ld);
    gemm_body!(
        w,
        rows,
        p,
        out,
        ld,
        Q4_BUF,
        x86::Q4W,
        x86::unpack_k4::<B>,
        x86::tile_q4_k,
        x86::finish_q4_k
    )
}

/// As [`gemm_q4_k`] for Q6_K weights.
pub fn gemm_q6_k(w: &[BlockQ6K], rows: usize, p: &Panel, out: &mut [f32]) {
    check_shapes("gemm_q6_k", w, rows, p, out);
    // SAFETY: out holds n x rows.
    unsafe { gemm_q6_k_into(w, rows, p, out.as_mut_ptr(), rows) }
}

/// As [`gemm_q4_k_into`] for Q6_K weights.
///
/// # Safety
/// As [`gemm_q4_k_into`].
pub unsafe fn gemm_q6_k_into(w: &[BlockQ6K], rows: usize, p: &Panel, out: *mut f32, ld: usize) {
    check_shapes_into("gemm_q6_k", w, rows, p, ld);
    gemm_body!(
        w,
        rows,
        p,
        out,
        ld,
        Q6_BUF,
        x86::Q6W,
        x86::unpack_q6_k,
        x86::tile_q6_k,
        x86::finish_q6_k
    )
}

const _: () = assert!(QK_K == 256);

mod x86 {
    use super::super::k4::{f16_to_f32, halves_i16, load32_twice, K4Block};
    use super::{Line, Panel, C, R};
    use muser_quant::BlockQ6K;
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// Four rows of one Q4_K block, unpacked (byte offsets used by the asm in brackets).
    #[repr(C, align(64))]
    pub struct Q4W {
        /// [256r + 64g] Row r, group g (values 64g..64g+64): the quants 0..15 as bytes.
        q: [[__m512i; 4]; R],
        /// [1024 + 128r + 64h] Row r, group pair h (groups 2h, 2h+1): per i32 lane j, the
        /// scale of lane j's sub-block in group 2h (low i16) and in group 2h+1 (high i16).
        s: [[__m512i; 2]; R],
        /// [1536 + 64r] Row r: the 8 mins each twice as i16 (pairing with the 16 bsums), in
        /// both halves.
        mins: [__m512i; R],
        /// [1792 + 64r] Row r: minus 128 times the scaled quant sums of each lane, the sums'
        /// starting value (it takes back the 128 added to the activations).
        corr: [__m512i; R],
        /// [2048] d of row r in lanes 4r..4r+4 (one per column of the tile); [2112] dmin.
        d: [f32; 16],
        dmin: [f32; 16],
    }

    /// Four rows of one Q6_K block, unpacked.
    #[repr(C, align(64))]
    pub struct Q6W {
        /// [256r + 64g] Row r, group g: the quants 0..63 as bytes.
        q: [[__m512i; 4]; R],
        /// [1024 + 128r + 64h] Row r, group pair h: per i32 lane, the sub-block scales of
        /// group 2h (low i16) and 2h+1 (high i16).
        s: [[__m512i; 2]; R],
        /// [1536 + 64r] Row r: the 16 scales as i16, in both halves.
        scales: [__m512i; R],
        /// [1792] d of row r in lanes 4r..4r+4.
        d: [f32; 16],
    }

    impl Acc {
        pub fn zero() -> Acc {
            // SAFETY: all-zero bytes are valid f32 vectors.
            unsafe { std::mem::zeroed() }
        }
    }

    impl Q4W {
        pub fn zero() -> Q4W {
            // SAFETY: all-zero bytes are a valid Q4W (integer and float vectors).
            unsafe { std::mem::zeroed() }
        }
    }
    impl Q6W {
        pub fn zero() -> Q6W {
            // SAFETY: as above.
            unsafe { std::mem::zeroed() }
        }
    }

    const _: () = assert!(std::mem::size_of::<Q4W>() == 2176);
    const _: () = assert!(std::mem::size_of::<Q6W>() == 1856);

    /// The f32 accumulators of a tile, in the one-column kernels' lanes.
    #[repr(C, align(64))]
    pub struct Acc {
        /// [64p] Pair p = 4r + c (Q4_K: 16 lanes); for Q6_K the first 8 are used as [2r + k]:
        /// columns 2k (lanes 0..8) and 2k+1 (lanes 8..16) of row r.
        acc: [__m512; 16],
        /// [1024 + 64(2r + k)] Q4_K mins: columns 2k (lanes 0..8) and 2k+1 of row r.
        acc_m: [__m512; 8],
    }

    /// The accumulators' starting value.
    static ZERO_ACC: Acc = Acc {
        acc: [unsafe { std::mem::transmute::<[f32; 16], __m512>([0.0; 16]) }; 16],
        acc_m: [unsafe { std::mem::transmute::<[f32; 16], __m512>([0.0; 16]) }; 8],
    };

    /// The packed 6-bit scales and mins of a Q4_K block as two u64 (eight bytes each).
    #[inline(always)]
    fn scales_mins_k4(s: &[u8; 12]) -> (u64, u64) {
        let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
        let (a, b, c) = (word(0), word(4), word(8));
        let sc_lo = a & 0x3f3f_3f3f;
        let m_lo = b & 0x3f3f_3f3f;
        let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
        let m_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
        (
            sc_lo as u64 | (sc_hi as u64) << 32,
            m_lo as u64 | (m_hi as u64) << 32,
        )
    }

    /// `vpermw` tables over [8 scales, 8 mins] (i16): the pair scales of group pair h (i16
    /// lane 2j + k: scale of sub-block 2(2h + k) + j/8), then the mins each twice in each half.
    const fn k4_index(h: usize) -> [i16; 32] {
        let mut idx = [0i16; 32];
        let mut w = 0;
        while w < 32 {
            let (j, k) = (w / 2, w % 2);
            idx[w] = (2 * (2 * h + k) + j / 8) as i16;
            w += 1;
        }
        idx
    }
    const fn k4_mins_index() -> [i16; 32] {
        let mut idx = [0i16; 32];
        let mut w = 0;
        while w < 32 {
            idx[w] = (8 + (w % 16) / 2) as i16;
            w += 1;
        }
        idx
    }
    const K4_INDEX: [[i16; 32]; 3] = [k4_index(0), k4_index(1), k4_mins_index()];

    /// Two groups' per-lane i32 values (each < 2^15 in magnitude) as the low and high i16 of
    /// each lane.
    #[inline(always)]
    unsafe fn pack_pair(lo: __m512i, hi: __m512i) -> __m512i {
        _mm512_mask_blend_epi16(0xaaaa_aaaa, lo, _mm512_slli_epi32(hi, 16))
    }

    /// Unpacks `rr` rows (<= 4) of `nb` Q4_K or Q5_K blocks into one `Q4W` per block (rows past
    /// `rr` zero).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn unpack_k4<B: K4Block>(w: &[B], rr: usize, nb: usize, buf: &mut [Q4W]) {
        let m4 = _mm512_set1_epi8(0x0f);
        let ones = _mm512_set1_epi8(1);
        let zero = _mm512_setzero_si512();
        let shift = halves_i16(0, 4);
        let index = K4_INDEX.map(|a| _mm512_loadu_si512(a.as_ptr() as *const _));
        for (i, u) in buf[..nb].iter_mut().enumerate() {
            if rr < R {
                *u = Q4W::zero();
            }
            for r in 0..rr {
                let b = &w[r * nb + i];
                for g in 0..4 {
                    u.q[r][g] = b.quants(g, m4, shift);
                }
                let (sc, m) = scales_mins_k4(b.scales());
                let sm = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_set_epi64x(
                    m as i64, sc as i64,
                )));
                u.s[r][0] = _mm512_permutexvar_epi16(index[0], sm);
                u.s[r][1] = _mm512_permutexvar_epi16(index[1], sm);
                u.mins[r] = _mm512_permutexvar_epi16(index[2], sm);
                // The kernel multiplies a + 128: each lane gains 128 * scale * (its 4 quants'
                // sum) per group, taken back by starting from minus that.
                let mut corr = zero;
                for h in 0..2 {
                    let s0 = _mm512_dpbusd_epi32(zero, ones, u.q[r][2 * h]);
                    let s1 = _mm512_dpbusd_epi32(zero, ones, u.q[r][2 * h + 1]);
                    corr = _mm512_dpwssd_epi32(corr, pack_pair(s0, s1), u.s[r][h]);
                }
                u.corr[r] = _mm512_sub_epi32(zero, _mm512_slli_epi32(corr, 7));
                let (d, dmin) = (f16_to_f32(b.d()), f16_to_f32(b.dmin()));
                for c in 0..C {
                    u.d[4 * r + c] = d;
                    u.dmin[4 * r + c] = dmin;
                }
            }
        }
    }

    /// `vpermw` tables over the 16 Q6_K scales (i16): group pair h, i16 lane 2j + k: the scale
    /// of the sub-block of lane j in group 2h + k (group g = values 64g..64g+64, lane j = values
    /// 4j..4j+4 of it: sub-block 4g + j/4); then the 16 scales in both halves.
    const fn k6_index(h: usize) -> [i16; 32] {
        let mut idx = [0i16; 32];
        let mut w = 0;
        while w < 32 {
            let (j, k) = (w / 2, w % 2);
            idx[w] = (4 * (2 * h + k) + j / 4) as i16;
            w += 1;
        }
        idx
    }
    const fn k6_scales_index() -> [i16; 32] {
        let mut idx = [0i16; 32];
        let mut w = 0;
        while w < 32 {
            idx[w] = (w % 16) as i16;
            w += 1;
        }
        idx
    }
    const K6_INDEX: [[i16; 32]; 3] = [k6_index(0), k6_index(1), k6_scales_index()];

    /// Unpacks `rr` rows (<= 4) of `nb` Q6_K blocks into one `Q6W` per block.
    ///
    /// Q6_K group g (values 64g..64g+64 of the block): half h = g / 2, low nibbles of ql[64h..
    /// 64h+64] for g even, high nibbles for g odd; the top two bits from qh[32h..32h+32] bit
    /// pairs (0-1: values l, 2-3: l+32, 4-5: l+64, 6-7: l+96 of the half), exactly as the
    /// one-column kernel assembles them.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn unpack_q6_k(w: &[BlockQ6K], rr: usize, nb: usize, buf: &mut [Q6W]) {
        let m4 = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        let shl_lo = halves_i16(4, 2);
        let shr_hi = halves_i16(0, 2);
        let index = K6_INDEX.map(|a| _mm512_loadu_si512(a.as_ptr() as *const _));
        for (i, u) in buf[..nb].iter_mut().enumerate() {
            if rr < R {
                *u = Q6W::zero();
            }
            for r in 0..rr {
                let b = &w[r * nb + i];
                for h in 0..2 {
                    let a = _mm512_loadu_si512(b.ql.as_ptr().add(64 * h) as *const _);
                    let hb = load32_twice(b.qh.as_ptr().add(32 * h));
                    u.q[r][2 * h] = _mm512_or_si512(
                        _mm512_and_si512(a, m4),
                        _mm512_and_si512(_mm512_sllv_epi16(hb, shl_lo), m30),
                    );
                    u.q[r][2 * h + 1] = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16(a, 4), m4),
                        _mm512_and_si512(_mm512_srlv_epi16(hb, shr_hi), m30),
                    );
                }
                let s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
                    b.scales.as_ptr() as *const __m128i,
                )));
                u.s[r][0] = _mm512_permutexvar_epi16(index[0], s16);
                u.s[r][1] = _mm512_permutexvar_epi16(index[1], s16);
                u.scales[r] = _mm512_permutexvar_epi16(index[2], s16);
                let d = f16_to_f32(b.d);
                for c in 0..C {
                    u.d[4 * r + c] = d;
                }
            }
        }
    }

    /// Lanes 0..8 take lane `a` of a 16-lane vector, lanes 8..16 lane `a + 1`.
    const fn pair_index(a: i32) -> [i32; 16] {
        let mut idx = [0i32; 16];
        let mut l = 0;
        while l < 16 {
            idx[l] = a + (l / 8) as i32;
            l += 1;
        }
        idx
    }
    /// [2r + k]: the products of row r with columns 2k, 2k+1, eight lanes each.
    #[repr(C, align(64))]
    struct PairIndex([[i32; 16]; 8]);
    static PAIR_INDEX: PairIndex = PairIndex([
        pair_index(0),
        pair_index(2),
        pair_index(4),
        pair_index(6),
        pair_index(8),
        pair_index(10),
        pair_index(12),
        pair_index(14),
    ]);

    #[repr(C, align(64))]
    struct BcastIndex([[i32; 16]; 16]);
    static BCAST_INDEX: BcastIndex = BcastIndex({
        let mut t = [[0i32; 16]; 16];
        let mut p = 0;
        while p < 16 {
            t[p] = [p as i32; 16];
            p += 1;
        }
        t
    });

    // The asm below keeps the 16 sums of a tile in zmm0..zmm15 (pair p = 4r + c in zmm p),
    // the activations of the tile's 4 columns for two groups in zmm16..19 and zmm20..23, a
    // row's quants and pair scales in zmm24..26, temporaries in zmm27..31.

    /// zmm16..19 <- group line $g0 of the 4 columns, zmm20..23 <- line $g1.
    macro_rules! load_columns {
        ($g0:literal, $g1:literal) => {
            concat!(
                "vmovdqa64 zmm16, zmmword ptr [{a} + ",
                $g0,
                "]\n",
                "vmovdqa64 zmm17, zmmword ptr [{a} + {cs} + ",
                $g0,
                "]\n",
                "vmovdqa64 zmm18, zmmword ptr [{a} + {cs}*2 + ",
                $g0,
                "]\n",
                "vmovdqa64 zmm19, zmmword ptr [{a3} + ",
                $g0,
                "]\n",
                "vmovdqa64 zmm20, zmmword ptr [{a} + ",
                $g1,
                "]\n",
                "vmovdqa64 zmm21, zmmword ptr [{a} + {cs} + ",
                $g1,
                "]\n",
                "vmovdqa64 zmm22, zmmword ptr [{a} + {cs}*2 + ",
                $g1,
                "]\n",
                "vmovdqa64 zmm23, zmmword ptr [{a3} + ",
                $g1,
                "]\n",
            )
        };
    }

    /// The panel holds a + 128: back to a (zmm29 holds 0x80 bytes), for Q6_K.
    macro_rules! xor_columns {
        () => {
            concat!(
                "vpxord zmm16, zmm16, zmm29\n",
                "vpxord zmm17, zmm17, zmm29\n",
                "vpxord zmm18, zmm18, zmm29\n",
                "vpxord zmm19, zmm19, zmm29\n",
                "vpxord zmm20, zmm20, zmm29\n",
                "vpxord zmm21, zmm21, zmm29\n",
                "vpxord zmm22, zmm22, zmm29\n",
                "vpxord zmm23, zmm23, zmm29\n",
            )
        };
    }

    /// Q4_K, one (row, column) pair, two groups: y = dot(a1 + 128, q1) per lane, shifted to
    /// the high i16, plus dot(a0 + 128, q0) (in 0..=15,300: no carry into the high i16), times
    /// the pair scales into the sum.
    macro_rules! q4_pair {
        ($acc:literal, $a0:literal, $a1:literal) => {
            concat!(
                "vpxord zmm27, zmm27, zmm27\n",
                "vpdpbusd zmm27, zmm",
                $a1,
                ", zmm25\n",
                "vpslld zmm27, zmm27, 16\n",
                "vpdpbusd zmm27, zmm",
                $a0,
                ", zmm24\n",
                "vpdpwssd zmm",
                $acc,
                ", zmm27, zmm26\n",
            )
        };
    }

    /// Q6_K, one pair, two groups: the dots of unsigned quants and signed activations (|dot|
    /// < 2^15) blended into the low and high i16, times the pair scales into the sum.
    macro_rules! q6_pair {
        ($acc:literal, $a0:literal, $a1:literal) => {
            concat!(
                "vpxord zmm27, zmm27, zmm27\n",
                "vpdpbusd zmm27, zmm24, zmm",
                $a0,
                "\n",
                "vpxord zmm28, zmm28, zmm28\n",
                "vpdpbusd zmm28, zmm25, zmm",
                $a1,
                "\n",
                "vpslld zmm28, zmm28, 16\n",
                "vmovdqu16 zmm27{{k1}}, zmm28\n",
                "vpdpwssd zmm",
                $acc,
                ", zmm27, zmm26\n",
            )
        };
    }

    /// A row of the tile for one group pair: its quants (at byte offsets $q0, $q1 of the
    /// unpacked block) and pair scales ($s), then the 4 columns into sums $p0..$p3.
    macro_rules! row {
        ($pair:ident, $q0:literal, $q1:literal, $s:literal, $p0:literal, $p1:literal, $p2:literal, $p3:literal) => {
            concat!(
                "vmovdqa64 zmm24, zmmword ptr [{w} + ",
                $q0,
                "]\n",
                "vmovdqa64 zmm25, zmmword ptr [{w} + ",
                $q1,
                "]\n",
                "vmovdqa64 zmm26, zmmword ptr [{w} + ",
                $s,
                "]\n",
                $pair!($p0, "16", "20"),
                $pair!($p1, "17", "21"),
                $pair!($p2, "18", "22"),
                $pair!($p3, "19", "23"),
            )
        };
    }

    /// Both group pairs of a block for the 4 x 4 tile.
    macro_rules! block_sums {
        ($pair:ident, $fix:expr) => {
            concat!(
                load_columns!("0", "64"),
                $fix,
                row!($pair, "0", "64", "1024", "0", "1", "2", "3"),
                row!($pair, "256", "320", "1152", "4", "5", "6", "7"),
                row!($pair, "512", "576", "1280", "8", "9", "10", "11"),
                row!($pair, "768", "832", "1408", "12", "13", "14", "15"),
                load_columns!("128", "192"),
                $fix,
                row!($pair, "128", "192", "1088", "0", "1", "2", "3"),
                row!($pair, "384", "448", "1216", "4", "5", "6", "7"),
                row!($pair, "640", "704", "1344", "8", "9", "10", "11"),
                row!($pair, "896", "960", "1472", "12", "13", "14", "15"),
            )
        };
    }

    /// Q4_K: pair p's sum to f32, times its product (broadcast from the scratch), plus its
    /// accumulator, stored back.
    macro_rules! q4_acc {
        ($p:literal) => {
            concat!(
                "vcvtdq2ps zmm",
                $p,
                ", zmm",
                $p,
                "\n",
                "vmovdqa64 zmm31, zmmword ptr [{bidx} + 64*",
                $p,
                "]\n",
                "vpermps zmm31, zmm31, zmm30\n",
                "vfmadd213ps zmm",
                $p,
                ", zmm31, zmmword ptr [{acc_in} + 64*",
                $p,
                "]\n",
                "vmovaps zmmword ptr [{acc} + 64*",
                $p,
                "], zmm",
                $p,
                "\n",
            )
        };
    }

    /// Q4_K mins of row $r, columns 2$k and 2$k+1 (their bsums in zmm $bs; the dmin products
    /// in zmm29).
    macro_rules! q4_mins {
        ($r:literal, $k:literal, $bs:literal) => {
            concat!(
                "vpmaddwd zmm28, zmm",
                $bs,
                ", zmmword ptr [{w} + 1536 + 64*",
                $r,
                "]\n",
                "vcvtdq2ps zmm28, zmm28\n",
                "vmovdqa64 zmm31, zmmword ptr [{pidx} + 64*(2*",
                $r,
                "+",
                $k,
                ")]\n",
                "vpermps zmm31, zmm31, zmm29\n",
                "vfmadd213ps zmm28, zmm31, zmmword ptr [{acc_in} + 1024 + 64*(2*",
                $r,
                "+",
                $k,
                ")]\n",
                "vmovaps zmmword ptr [{acc} + 1024 + 64*(2*",
                $r,
                "+",
                $k,
                ")], zmm28\n",
            )
        };
    }

    /// Q6_K, row $r, columns 2$k, 2$k+1 (sums in zmm $s0, $s1, bsums in zmm $bs): fold each column's 16 lanes
    /// to 8 as the one-column kernel does, subtract 32 * scales . bsums, to f32, times the
    /// products (zmm29), plus the accumulator.
    macro_rules! q6_acc {
        ($r:literal, $k:literal, $bs:literal, $s0:literal, $s1:literal) => {
            concat!(
                "vshufi64x2 zmm30, zmm",
                $s0,
                ", zmm",
                $s1,
                ", 0x44\n",
                "vshufi64x2 zmm31, zmm",
                $s0,
                ", zmm",
                $s1,
                ", 0xee\n",
                "vpaddd zmm30, zmm30, zmm31\n",
                "vpmaddwd zmm31, zmm",
                $bs,
                ", zmmword ptr [{w} + 1536 + 64*",
                $r,
                "]\n",
                "vpslld zmm31, zmm31, 5\n",
                "vpsubd zmm30, zmm30, zmm31\n",
                "vcvtdq2ps zmm30, zmm30\n",
                "vmovdqa64 zmm31, zmmword ptr [{pidx} + 64*(2*",
                $r,
                "+",
                $k,
                ")]\n",
                "vpermps zmm31, zmm31, zmm29\n",
                "vfmadd213ps zmm30, zmm31, zmmword ptr [{acc_in} + 64*(2*",
                $r,
                "+",
                $k,
                ")]\n",
                "vmovaps zmmword ptr [{acc} + 64*(2*",
                $r,
                "+",
                $k,
                ")], zmm30\n",
            )
        };
    }

    /// The horizontal sums of 16 vectors v_p (pair p = 4r + c), each by
    /// `_mm512_reduce_add_ps`'s tree (lane l + lane l+8, then m + m+4, then [0+2, 1+3], then
    /// 0+1), all 16 at once, from the first step's results: a[i] = [v_{2i} lanes 0..8 + lanes
    /// 8..16 | the same of v_{2i+1}]. Stores pair (r, c) at out[c * ld + r] for r < rr, c < cc.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn store_sums(a: &[__m512; 8], out: *mut f32, ld: usize, rr: usize, cc: usize) {
        let b: [__m512; 4] = std::array::from_fn(|i| {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
            )
        });
        let c: [__m512; 2] = std::array::from_fn(|i| {
            let (x, y) = (b[2 * i], b[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
                _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
            )
        });
        // Lane 4c + r holds pair (r, c).
        let d = _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(c[0], c[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(c[0], c[1]),
        );
        let k: __mmask8 = (1u8 << rr) - 1;
        let cols = [
            _mm512_castps512_ps128(d),
            _mm512_extractf32x4_ps::<1>(d),
            _mm512_extractf32x4_ps::<2>(d),
            _mm512_extractf32x4_ps::<3>(d),
        ];
        for (col, v) in cols.into_iter().enumerate().take(cc) {
            _mm_mask_storeu_ps(out.add(col * ld), k, v);
        }
    }

    /// One 4 x 4 Q4_K tile over blocks k0..k0 + w.len() into the accumulators (which the
    /// first blocks of a tile, `first`, start from zero).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn tile_q4_k(
        w: &[Q4W],
        p: &Panel,
        t0: usize,
        k0: usize,
        acc: *mut Acc,
        first: bool,
    ) {
        let nb = p.nb;
        let cs = nb * 4 * std::mem::size_of::<Line>();
        let mut a = p.qs.as_ptr().add((t0 * nb + k0) * 4);
        let mut bs = p.bsums2.as_ptr().add(t0 / 2 * nb + k0);
        let bst = nb * std::mem::size_of::<Line>();
        let mut dcol = p.d.as_ptr().add((t0 / C * nb + k0) * C);
        let accp = acc;
        for (i, u) in w.iter().enumerate() {
            let acc_in = if first && i == 0 {
                &ZERO_ACC as *const Acc
            } else {
                accp as *const Acc
            };
            asm!(
                // Sums start at the correction for the +128 of the activations.
                "vmovdqa64 zmm0, zmmword ptr [{w} + 1792]",
                "vmovdqa64 zmm1, zmm0",
                "vmovdqa64 zmm2, zmm0",
                "vmovdqa64 zmm3, zmm0",
                "vmovdqa64 zmm4, zmmword ptr [{w} + 1856]",
                "vmovdqa64 zmm5, zmm4",
                "vmovdqa64 zmm6, zmm4",
                "vmovdqa64 zmm7, zmm4",
                "vmovdqa64 zmm8, zmmword ptr [{w} + 1920]",
                "vmovdqa64 zmm9, zmm8",
                "vmovdqa64 zmm10, zmm8",
                "vmovdqa64 zmm11, zmm8",
                "vmovdqa64 zmm12, zmmword ptr [{w} + 1984]",
                "vmovdqa64 zmm13, zmm12",
                "vmovdqa64 zmm14, zmm12",
                "vmovdqa64 zmm15, zmm12",
                block_sums!(q4_pair, ""),
                // Products d_row * d_column (lane 4r + c) and dmin_row * d_column.
                "vbroadcastf32x4 zmm29, xmmword ptr [{dcol}]",
                "vmulps zmm30, zmm29, zmmword ptr [{w} + 2048]",
                "vmulps zmm29, zmm29, zmmword ptr [{w} + 2112]",
                q4_acc!("0"), q4_acc!("1"), q4_acc!("2"), q4_acc!("3"),
                q4_acc!("4"), q4_acc!("5"), q4_acc!("6"), q4_acc!("7"),
                q4_acc!("8"), q4_acc!("9"), q4_acc!("10"), q4_acc!("11"),
                q4_acc!("12"), q4_acc!("13"), q4_acc!("14"), q4_acc!("15"),
                "vmovdqa64 zmm16, zmmword ptr [{bs}]",
                "vmovdqa64 zmm17, zmmword ptr [{bs} + {bst}]",
                q4_mins!("0", "0", "16"), q4_mins!("0", "1", "17"),
                q4_mins!("1", "0", "16"), q4_mins!("1", "1", "17"),
                q4_mins!("2", "0", "16"), q4_mins!("2", "1", "17"),
                q4_mins!("3", "0", "16"), q4_mins!("3", "1", "17"),
                w = in(reg) u as *const Q4W,
                a = in(reg) a,
                cs = in(reg) cs,
                a3 = in(reg) (a as *const u8).add(3 * cs),
                dcol = in(reg) dcol,
                bs = in(reg) bs,
                bst = in(reg) bst,
                acc = in(reg) accp,
                acc_in = in(reg) acc_in,
                pidx = in(reg) PAIR_INDEX.0.as_ptr(),
                bidx = in(reg) BCAST_INDEX.0.as_ptr(),
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
                out("zmm28") _, out("zmm29") _, out("zmm30") _, out("zmm31") _,
                options(nostack),
            );
            a = a.add(4);
            bs = bs.add(1);
            dcol = dcol.add(C);
        }
    }

    /// Q4_K: the one-column kernel's reduction sum(acc - [acc_m, 0]) of the 16 pairs, stored
    /// at out[c * ld + r] for r < rr, c < cc.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn finish_q4_k(acc: &Acc, out: *mut f32, ld: usize, rr: usize, cc: usize) {
        // Pairs 2i, 2i+1 are row r = i / 2, columns 2k, 2k+1 (k = i % 2), whose mins share
        // acc_m[i]: lanes l < 8 of [v_2i | v_2i+1] are (acc - acc_m) + acc of lane l + 8.
        let a: [__m512; 8] = std::array::from_fn(|i| {
            let (x, y) = (acc.acc[2 * i], acc.acc[2 * i + 1]);
            let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y);
            let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y);
            _mm512_add_ps(_mm512_sub_ps(lo, acc.acc_m[i]), hi)
        });
        store_sums(&a, out, ld, rr, cc);
    }

    /// As `tile_q4_k` for Q6_K.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn tile_q6_k(
        w: &[Q6W],
        p: &Panel,
        t0: usize,
        k0: usize,
        acc: *mut Acc,
        first: bool,
    ) {
        let nb = p.nb;
        let cs = nb * 4 * std::mem::size_of::<Line>();
        let mut a = p.qs.as_ptr().add((t0 * nb + k0) * 4);
        let mut bs = p.bsums2.as_ptr().add(t0 / 2 * nb + k0);
        let bst = nb * std::mem::size_of::<Line>();
        let mut dcol = p.d.as_ptr().add((t0 / C * nb + k0) * C);
        let accp = acc;
        for (i, u) in w.iter().enumerate() {
            let acc_in = if first && i == 0 {
                &ZERO_ACC as *const Acc
            } else {
                accp as *const Acc
            };
            asm!(
                "mov {k:e}, 0xaaaaaaaa",
                "kmovd k1, {k:e}",
                "mov {k:e}, 0x80808080",
                "vpbroadcastd zmm29, {k:e}",
                "vpxord zmm0, zmm0, zmm0", "vpxord zmm1, zmm1, zmm1",
                "vpxord zmm2, zmm2, zmm2", "vpxord zmm3, zmm3, zmm3",
                "vpxord zmm4, zmm4, zmm4", "vpxord zmm5, zmm5, zmm5",
                "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7",
                "vpxord zmm8, zmm8, zmm8", "vpxord zmm9, zmm9, zmm9",
                "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
                "vpxord zmm12, zmm12, zmm12", "vpxord zmm13, zmm13, zmm13",
                "vpxord zmm14, zmm14, zmm14", "vpxord zmm15, zmm15, zmm15",
                block_sums!(q6_pair, xor_columns!()),
                "vbroadcastf32x4 zmm29, xmmword ptr [{dcol}]",
                "vmulps zmm29, zmm29, zmmword ptr [{w} + 1792]",
                "vmovdqa64 zmm16, zmmword ptr [{bs}]",
                "vmovdqa64 zmm17, zmmword ptr [{bs} + {bst}]",
                q6_acc!("0", "0", "16", "0", "1"), q6_acc!("0", "1", "17", "2", "3"),
                q6_acc!("1", "0", "16", "4", "5"), q6_acc!("1", "1", "17", "6", "7"),
                q6_acc!("2", "0", "16", "8", "9"), q6_acc!("2", "1", "17", "10", "11"),
                q6_acc!("3", "0", "16", "12", "13"), q6_acc!("3", "1", "17", "14", "15"),
                k = out(reg) _,
                w = in(reg) u as *const Q6W,
                a = in(reg) a,
                cs = in(reg) cs,
                a3 = in(reg) (a as *const u8).add(3 * cs),
                dcol = in(reg) dcol,
                bs = in(reg) bs,
                bst = in(reg) bst,
                acc = in(reg) accp,
                acc_in = in(reg) acc_in,
                pidx = in(reg) PAIR_INDEX.0.as_ptr(),
                out("k1") _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
                out("zmm28") _, out("zmm29") _, out("zmm30") _, out("zmm31") _,
                options(nostack),
            );
            a = a.add(4);
            bs = bs.add(1);
            dcol = dcol.add(C);
        }
    }

    /// Q6_K: the one-column kernel's reduction sum([acc, 0]) of the 16 pairs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn finish_q6_k(acc: &Acc, out: *mut f32, ld: usize, rr: usize, cc: usize) {
        // acc[i] holds columns 2k, 2k+1 of row i / 2 in lanes 0..8, 8..16; their upper eight
        // lanes in the one-column kernel are +0.0, added in the tree's first step.
        let zero = _mm512_setzero_ps();
        let a: [__m512; 8] = std::array::from_fn(|i| _mm512_add_ps(acc.acc[i], zero));
        store_sums(&a, out, ld, rr, cc);
    }
}
