//! Batched attention for prefill (AVX-512): the rows of one sequence over its f16 KV cache,
//! with every (row, head) result bit for bit that of `KvLayer::attend_head` (the decode path).
//!
//! `attend_head` computes, per (row, head): scores `dot_f16_f32(k_j, q) * scale` (the AVX2
//! dot: two 8-lane FMA chains over 16 values per step, then a fixed reduction tree), the
//! weights `softmax(scores)`, then `o = 0; o = fma(w_j, v_j, o)` in position order. Here the same operations are laid out for throughput:
//!
//! - K is converted once per call to f32 rows (`[pos][dim]`); the 16 chains of the AVX2 dot
//!   (lane l of its two accumulators: dims l + 16 s) are the 16 lanes of one FMA chain, for four
//!   positions and the four heads of a KV group at a time, and 16 such sums are reduced by its
//!   tree at once (`sums16`). (K transposed into blocks of 16 positions, `[block][dim][16]`,
//!   makes the tree elementwise adds, but ran slower: 2.22 against 1.82 ns per (query, key),
//!   1.95 against 1.67 with the task order below.)
//! - V is converted once per call to f32; the G query heads that share a KV head (GQA) are
//!   done together, so each V row is loaded once for G heads.
//! - the softmax is the shared one (`softmax.rs`), as in `attend_head`.
//! - tasks are (KV head, row) with the KV head outermost, so a thread's consecutive tasks share
//!   one KV head's K and V (256 KB at 512 positions of 64 dims) in its L2; row-major tasks went
//!   through all heads' (2 MB) each row. One thread, 512 rows of llama-1b's shape
//!   (`tests/gemm_speed.rs`): 1.84-1.88 -> 1.67 ns per (query, key).
//! - the per-call K/V buffers are kept by the calling thread for its next call (fresh 1-2 MB
//!   buffers per layer cost page faults), and each task writes its heads straight into `out`.
//!
//! Used when a call has enough rows for the conversions to pay (`MIN_ROWS`), the head size
//! is a multiple of 16 and the CPU has AVX-512F (with AVX2, FMA, F16C, which the decode path's
//! kernels use); otherwise the caller runs `attend_head` per (row, head).
//!
//! Decode steps (`attend_kv_head`, one task per (row, KV head) of a decode group) run the same
//! scores, softmax and weighted sums straight over the f16 cache: no copy (a decode row reads
//! its context once), each K and V row loaded once for the KV head's query heads, the KV head's
//! rows read in order from its plane of the cache (`kv.rs`). llama-1b, 2 threads, tg32 at depth
//! 4096 (BENCHMARKS.md): 21-22 tokens/s with `attend_head` per (row, head) on a Zen 3, 41-43
//! with this kernel over the interleaved cache there, 33 on a Zen 4; 44 on that Zen 4 over
//! the per-head planes.

use super::kv::KvLayer;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Rows from which a call takes the batched path.
pub const MIN_ROWS: usize = 8;

/// The vector kernels of this module: AVX-512F (16-lane vectors: one FMA chain holds both of
/// the AVX2 dot's 8-lane chains) or AVX2 (the dot's two 8-lane chains as they are). Both give
/// `attend_head`'s bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
}

/// The kernels this CPU runs, fastest first (empty: none, the caller runs `attend_head`).
pub fn isas() -> &'static [Isa] {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<Vec<Isa>> = std::sync::OnceLock::new();
        HAS.get_or_init(|| {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let mut v = Vec::new();
            if avx2 && is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
            if avx2 {
                v.push(Isa::Avx2);
            }
            v
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        &[]
    }
}

/// The kernel the batched paths use on this CPU.
fn isa() -> Isa {
    isas()[0]
}

/// Whether the batched path serves a layer with this head size on this CPU.
pub fn available(head_dim: usize) -> bool {
    !isas().is_empty() && head_dim > 0 && head_dim.is_multiple_of(16)
}

/// A raw pointer shared by tasks that write disjoint parts of the output.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only its own (row, KV head) slice, and the buffer outlives them.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

thread_local! {
    /// K and V in f32 of the thread's last call, kept for the next one.
    static BUFS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Rows t of q (`[n, n_head * head_dim]`, at positions pos0 + t) over `kv`; writes out.
/// Requires `available(head_dim)`.
pub fn attend(kv: &KvLayer, q: &[f32], n_head: usize, pos0: usize, scale: f32, out: &mut [f32]) {
    attend_with(isa(), kv, q, n_head, pos0, scale, out)
}

/// `attend` on the kernels of `isa` (one of `isas()`).
pub fn attend_with(
    isa: Isa,
    kv: &KvLayer,
    q: &[f32],
    n_head: usize,
    pos0: usize,
    scale: f32,
    out: &mut [f32],
) {
    assert!(isas().contains(&isa), "attend: {isa:?} not on this CPU");
    let spec = kv.spec;
    let hd = spec.head_dim;
    let nkv = spec.n_head_kv;
    assert!(available(hd));
    let width = n_head * hd;
    let n = q.len() / width;
    if n == 0 {
        return;
    }
    let group = n_head / nkv;
    let lo_of = |p: usize| spec.window.map_or(0, |w| (p + 1).saturating_sub(w));
    // Positions seen by some row: base ..= last.
    let base = lo_of(pos0);
    let last = pos0 + n - 1;
    let span = last + 1 - base;
    // Per KV head: K and V as f32 ([pos][dim]) from `base`, K with 8 rows of zeros past the
    // end (scores run 8 positions at a time).
    let kspan = span + 8;
    // The buffers of the calling thread's previous call, grown as needed (fresh ones of 1-2 MB
    // per layer cost page faults); everything read is written below.
    let (mut kf, mut vf) = BUFS.with(|b| std::mem::take(&mut *b.borrow_mut()));
    for (b, len) in [(&mut kf, nkv * kspan * hd), (&mut vf, nkv * span * hd)] {
        if b.len() < len {
            b.resize(len, 0.0);
        }
        b.truncate(len);
    }
    kf.par_chunks_mut(kspan * hd)
        .zip(vf.par_chunks_mut(span * hd))
        .enumerate()
        .for_each(|(kh, (kf, vf))| {
            for j in 0..span {
                let s = kv.at(kh, base + j);
                kv.k()[s..s + hd].convert_to_f32_slice(&mut kf[j * hd..(j + 1) * hd]);
                kv.v()[s..s + hd].convert_to_f32_slice(&mut vf[j * hd..(j + 1) * hd]);
            }
            kf[span * hd..].fill(0.0);
        });
    let o = OutPtr(out.as_mut_ptr());
    assert_eq!(out.len(), q.len());
    (0..n * nkv).into_par_iter().for_each(|task| {
        let (kh, t) = (task / n, task % n);
        let p = pos0 + t;
        let lo = lo_of(p);
        let kf = &kf[kh * kspan * hd..(kh + 1) * kspan * hd];
        let vf = &vf[kh * span * hd..(kh + 1) * span * hd];
        let heads = kh * group..(kh + 1) * group;
        let qs = &q[t * width + heads.start * hd..t * width + heads.end * hd];
        // SAFETY: the group's heads are contiguous in row t of out, and only this task writes
        // them.
        let res = unsafe {
            std::slice::from_raw_parts_mut(o.at(t * width + heads.start * hd), group * hd)
        };
        // SAFETY: the CPU has the features (`available`); the slices hold the positions used
        // (lo - base ..= p - base < span, K up to 3 rows past it).
        unsafe { x86::group(isa, kf, vf, hd, qs, group, lo - base, p - base, scale, res) };
    });
    // Kept up to 16 MB each (a long context's would stay allocated for nothing after it).
    if kf.len() <= 1 << 22 {
        BUFS.with(|b| *b.borrow_mut() = (kf, vf));
    }
}

/// Decode: the G = n_head / n_head_kv query heads of KV head `kh` of one row at position `p`
/// (qs: `[G, head_dim]`) over the positions it sees, straight from `kv`'s f16 rows (no f32 copy:
/// a decode row reads its context once), written to res (`[G, head_dim]`). Bit for bit
/// `KvLayer::attend_head` for each of the G heads: the same scores (`scores4`'s lanes are the
/// AVX2 dot's chains), softmax and position-ordered FMAs; only the f16 -> f32 conversion moved
/// into the loads, where it is exact. Each K and V row is read once for the G heads instead of
/// once per head. Requires `available(head_dim)`.
pub fn attend_kv_head(kv: &KvLayer, qs: &[f32], kh: usize, p: usize, scale: f32, res: &mut [f32]) {
    attend_kv_head_with(isa(), kv, qs, kh, p, scale, res)
}

/// `attend_kv_head` on the kernels of `isa` (one of `isas()`).
pub fn attend_kv_head_with(
    isa: Isa,
    kv: &KvLayer,
    qs: &[f32],
    kh: usize,
    p: usize,
    scale: f32,
    res: &mut [f32],
) {
    assert!(
        isas().contains(&isa),
        "attend_kv_head: {isa:?} not on this CPU"
    );
    let spec = kv.spec;
    let hd = spec.head_dim;
    assert!(available(hd));
    let g = qs.len() / hd;
    assert_eq!(res.len(), g * hd, "attend_kv_head: {g} heads of {hd}");
    assert!(
        kh < spec.n_head_kv,
        "attend_kv_head: KV head {kh} of {}",
        spec.n_head_kv
    );
    let lo = spec.window.map_or(0, |w| (p + 1).saturating_sub(w));
    assert!(kv.holds(p), "attend_kv_head: position {p} not stored");
    let rows = Rows16 {
        k: kv.k().as_ptr() as *const u16,
        v: kv.v().as_ptr() as *const u16,
        off: kv.at(kh, 0),
        stride: hd,
        first: kv.slot(lo),
        wrap: if spec.is_ring() {
            spec.slots
        } else {
            usize::MAX
        },
    };
    // SAFETY: the CPU has the features (`available`); every position lo..=p is stored (the
    // slots of a ring, the plane up to p: checked above for p, and the cache grows in order).
    unsafe { x86::group_f16(isa, &rows, hd, qs, g, p + 1 - lo, scale, res) };
}

/// One KV head's f16 rows in the cache: relative position j's K at k + slot(j) * stride + off
/// (V the same), slot(j) = first + j, less `wrap` (a ring's slots; usize::MAX for a plane) when
/// that reaches it (a task sees at most `wrap` positions).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Rows16 {
    k: *const u16,
    v: *const u16,
    off: usize,
    stride: usize,
    first: usize,
    wrap: usize,
}

/// Other targets: `available` is false, so this is never called.
#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    use super::Isa;

    #[allow(clippy::too_many_arguments)]
    pub unsafe fn group(
        _: Isa,
        _: &[f32],
        _: &[f32],
        _: usize,
        _: &[f32],
        _: usize,
        _: usize,
        _: usize,
        _: f32,
        _: &mut [f32],
    ) {
        unreachable!("batched attention needs x86_64")
    }

    #[allow(clippy::too_many_arguments)]
    pub unsafe fn group_f16(
        _: Isa,
        _: &super::Rows16,
        _: usize,
        _: &[f32],
        _: usize,
        _: usize,
        _: f32,
        _: &mut [f32],
    ) {
        unreachable!("batched attention needs x86_64")
    }
}

thread_local! {
    /// Per thread: scores and weights of a task.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The body shared by every kernel: per head the scores, then in place the weights
/// softmax(scores), of positions 0..len, four heads at a time (a missing head repeats one, its
/// scores land in `spare`); then o = sum_j w_j v_j by blocks of up to 4 heads x `dims` values
/// (the last block of a row may be narrower).
/// `scores(q, sc)` fills sc[h][0..len] (rounded up to its step) for the 4 heads q;
/// `weighted(gh, d0, w, wl, r)` writes heads 0..gh of the block starting at head `w`'s
/// weights (rows wl apart) and values d0 .. d0 + dims to r (rows hd apart).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn heads(
    hd: usize,
    qs: &[f32],
    g: usize,
    len: usize,
    res: &mut [f32],
    dims: usize,
    mut scores: impl FnMut([&[f32]; 4], [*mut f32; 4]),
    mut weighted: impl FnMut(usize, usize, *const f32, usize, *mut f32),
) {
    let wl = len.next_multiple_of(16);
    let mut buf = SCRATCH.with(|b| std::mem::take(&mut *b.borrow_mut()));
    if buf.len() < (g + 1) * wl {
        buf.resize((g + 1) * wl, 0.0);
    }
    let (w, spare) = buf.split_at_mut(g * wl);
    for h0 in (0..g).step_by(4) {
        let q: [&[f32]; 4] = std::array::from_fn(|k| {
            let h = (h0 + k).min(g - 1);
            &qs[h * hd..(h + 1) * hd]
        });
        let sc: [*mut f32; 4] = std::array::from_fn(|k| {
            if h0 + k < g {
                w[(h0 + k) * wl..].as_mut_ptr()
            } else {
                spare.as_mut_ptr()
            }
        });
        scores(q, sc);
    }
    for h in 0..g {
        super::softmax::softmax(&mut w[h * wl..h * wl + len]);
    }
    assert!(res.len() >= g * hd);
    let (wp, rp) = (w.as_ptr(), res.as_mut_ptr());
    for h0 in (0..g).step_by(4) {
        let gh = (g - h0).min(4);
        for d0 in (0..hd).step_by(dims) {
            weighted(
                gh,
                d0,
                wp.wrapping_add(h0 * wl),
                wl,
                rp.wrapping_add(h0 * hd + d0),
            );
        }
    }
    SCRATCH.with(|b| *b.borrow_mut() = buf);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Isa, Rows16};

    /// The G query heads `qs` (`[G, hd]`) sharing one KV head, at a row that sees positions
    /// lo..=p (relative to the buffers' base) of K and V as f32 rows (K with 8 rows of
    /// padding); writes res (`[G, hd]`).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn group(
        isa: Isa,
        kt: &[f32],
        vf: &[f32],
        hd: usize,
        qs: &[f32],
        g: usize,
        lo: usize,
        p: usize,
        scale: f32,
        res: &mut [f32],
    ) {
        let len = p + 1 - lo;
        assert!((lo + len.next_multiple_of(4)) * hd <= kt.len() && (lo + len) * hd <= vf.len());
        let rows = F32Rows {
            k: kt.as_ptr().add(lo * hd),
            v: vf.as_ptr().add(lo * hd),
            hd,
        };
        match isa {
            Isa::Avx512 => avx512::group(&rows, hd, qs, g, len, scale, res),
            Isa::Avx2 => avx2::group(&rows, hd, qs, g, len, scale, res),
        }
    }

    /// `group` for one decode row over the f16 rows of `rows`: positions 0..len (relative to
    /// rows.base). The same scores, softmax and weighted sums, the loads converting f16.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn group_f16(
        isa: Isa,
        rows: &Rows16,
        hd: usize,
        qs: &[f32],
        g: usize,
        len: usize,
        scale: f32,
        res: &mut [f32],
    ) {
        let rows = F16Rows { rows, len };
        match isa {
            Isa::Avx512 => avx512::group(&rows, hd, qs, g, len, scale, res),
            Isa::Avx2 => avx2::group(&rows, hd, qs, g, len, scale, res),
        }
    }

    impl Rows16 {
        /// The offset of relative position j's row.
        #[inline(always)]
        fn at(&self, j: usize) -> usize {
            let s = self.first + j;
            let slot = if s >= self.wrap { s - self.wrap } else { s };
            slot * self.stride + self.off
        }
    }

    /// Where a task's K and V rows come from: `k(j, d)` points at value d of relative position
    /// j's K row, or is None past the positions (scores run several positions at a time; those
    /// read as zeros and land in slots softmax never sees); `v(j, d)` the same for V (always
    /// there).
    trait Rows {
        /// f16 (2 bytes a value) or f32.
        const F16: bool;
        unsafe fn k(&self, j: usize, d: usize) -> Option<*const u8>;
        unsafe fn v(&self, j: usize, d: usize) -> *const u8;
    }

    /// K and V converted to f32 for a prefill call: K padded past the positions.
    struct F32Rows {
        k: *const f32,
        v: *const f32,
        hd: usize,
    }
    impl Rows for F32Rows {
        const F16: bool = false;
        #[inline(always)]
        unsafe fn k(&self, j: usize, d: usize) -> Option<*const u8> {
            Some(self.k.add(j * self.hd + d) as *const u8)
        }
        #[inline(always)]
        unsafe fn v(&self, j: usize, d: usize) -> *const u8 {
            self.v.add(j * self.hd + d) as *const u8
        }
    }

    /// A decode row's f16 rows in the cache: one KV head's plane, position after position, so
    /// the hardware prefetchers stream it (asking for rows 8-64 positions ahead made one thread
    /// 7-24% slower on a Zen 4; with the rows strided through the cache it had been a gain).
    struct F16Rows<'a> {
        rows: &'a Rows16,
        len: usize,
    }
    impl Rows for F16Rows<'_> {
        const F16: bool = true;
        #[inline(always)]
        unsafe fn k(&self, j: usize, d: usize) -> Option<*const u8> {
            (j < self.len).then(|| self.rows.k.add(self.rows.at(j) + d) as *const u8)
        }
        #[inline(always)]
        unsafe fn v(&self, j: usize, d: usize) -> *const u8 {
            self.rows.v.add(self.rows.at(j) + d) as *const u8
        }
    }

    /// The 16-lane kernels.
    mod avx512 {
        use super::Rows;
        use std::arch::x86_64::*;

        /// 16 values of a row at p as f32 (f16: exact conversion).
        #[inline(always)]
        unsafe fn load16<R: Rows>(p: *const u8) -> __m512 {
            if R::F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
            } else {
                _mm512_loadu_ps(p as *const f32)
            }
        }

        /// The 16 horizontal sums of v by `_mm512_reduce_add_ps`'s tree (lane l + l+8, then m +
        /// m+4, then [0+2, 1+3], then 0+1), all at once: lane 4(p % 4) + p / 4 of the result is
        /// the sum of v[p].
        #[inline(always)]
        unsafe fn sums16(v: &[__m512; 16]) -> __m512 {
            let a: [__m512; 8] = std::array::from_fn(|i| {
                let (x, y) = (v[2 * i], v[2 * i + 1]);
                _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
                    _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
                )
            });
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
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b10_00_10_00>(c[0], c[1]),
                _mm512_shuffle_ps::<0b11_01_11_01>(c[0], c[1]),
            )
        }

        /// Scores of four query heads q[h] over positions 0..len of a row loader (k(j, d): values d
        /// .. d + 15 of position j; past len any finite values): sc[h][j] =
        /// dot(k_j, q_h) * scale, each dot the AVX2 dot's: its two 8-lane FMA chains over 16
        /// values per step are the 16 lanes of one chain here (lane l: dims l + 16 s), reduced by
        /// the same tree (acc0 + acc1, lo4 + hi4, [0+2, 1+3], 0+1) as `_mm512_reduce_add_ps`. Four
        /// positions at a time, each K value loaded once for the four heads; each sc[h] holds len
        /// rounded up to 4.
        #[inline(always)]
        unsafe fn scores4(
            k: impl Fn(usize, usize) -> __m512,
            hd: usize,
            q: [&[f32]; 4],
            len: usize,
            scale: f32,
            sc: [*mut f32; 4],
        ) {
            let steps = hd / 16;
            let sv = _mm512_set1_ps(scale);
            for j in (0..len).step_by(4) {
                // v[4k + h]: position j + k, head h, so that the sums come out as lanes 4h + k.
                let mut v = [_mm512_setzero_ps(); 16];
                for st in 0..steps {
                    let qv: [__m512; 4] =
                        std::array::from_fn(|h| _mm512_loadu_ps(q[h].as_ptr().add(16 * st)));
                    for kk in 0..4 {
                        let kv = k(j + kk, 16 * st);
                        for h in 0..4 {
                            v[4 * kk + h] = _mm512_fmadd_ps(kv, qv[h], v[4 * kk + h]);
                        }
                    }
                }
                let d = _mm512_mul_ps(sums16(&v), sv);
                _mm_storeu_ps(sc[0].add(j), _mm512_castps512_ps128(d));
                _mm_storeu_ps(sc[1].add(j), _mm512_extractf32x4_ps::<1>(d));
                _mm_storeu_ps(sc[2].add(j), _mm512_extractf32x4_ps::<2>(d));
                _mm_storeu_ps(sc[3].add(j), _mm512_extractf32x4_ps::<3>(d));
            }
        }

        /// o_h = sum_j w_h[j] v_j in position order (o = 0; o = fma(w_j, v_j, o)), for GH heads
        /// and ND x 16 values of a row loader (v(j, d): values d .. d + 15 of position j's part);
        #[inline(always)]
        unsafe fn weighted<const GH: usize, const ND: usize>(
            v: impl Fn(usize, usize) -> __m512,
            hd: usize,
            w: *const f32,
            wl: usize,
            len: usize,
            res: *mut f32,
        ) {
            let mut o = [[_mm512_setzero_ps(); ND]; GH];
            for j in 0..len {
                let vv: [__m512; ND] = std::array::from_fn(|k| v(j, 16 * k));
                for (hh, oh) in o.iter_mut().enumerate() {
                    let wj = _mm512_set1_ps(*w.add(hh * wl + j));
                    for k in 0..ND {
                        oh[k] = _mm512_fmadd_ps(wj, vv[k], oh[k]);
                    }
                }
            }
            for (hh, oh) in o.iter().enumerate() {
                for (k, ok) in oh.iter().enumerate() {
                    _mm512_storeu_ps(res.add(hh * hd + 16 * k), *ok);
                }
            }
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn group<R: Rows>(
            rows: &R,
            hd: usize,
            qs: &[f32],
            g: usize,
            len: usize,
            scale: f32,
            res: &mut [f32],
        ) {
            let k = |j: usize, d: usize| match rows.k(j, d) {
                Some(p) => load16::<R>(p),
                None => _mm512_setzero_ps(),
            };
            super::super::heads(
                hd,
                qs,
                g,
                len,
                res,
                64.min(hd),
                |q, sc| scores4(k, hd, q, len, scale, sc),
                |gh, d0, wh, wl, r| {
                    let nd = ((hd - d0) / 16).min(4);
                    let vload = |j: usize, d: usize| load16::<R>(rows.v(j, d0 + d));
                    macro_rules! go {
                        ($($gh:literal, $nd:literal);*) => {
                            match (gh, nd) {
                                $(($gh, $nd) => weighted::<$gh, $nd>(vload, hd, wh, wl, len, r),)*
                                _ => unreachable!(),
                            }
                        };
                    }
                    go!(4, 4; 4, 3; 4, 2; 4, 1; 3, 4; 3, 3; 3, 2; 3, 1; 2, 4; 2, 3; 2, 2; 2, 1; 1, 4; 1, 3; 1, 2; 1, 1);
                },
            )
        }
    }

    /// The 8-lane kernels: the AVX2 dot's two chains (dims 16s + 0..7 and 16s + 8..15) as two
    /// accumulators per (position, head), reduced by its tree.
    mod avx2 {
        use super::Rows;
        use std::arch::x86_64::*;

        /// 8 values of a row at p as f32 (f16: exact conversion).
        #[inline(always)]
        unsafe fn load8<R: Rows>(p: *const u8) -> __m256 {
            if R::F16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
            } else {
                _mm256_loadu_ps(p as *const f32)
            }
        }

        /// The 8 horizontal sums of t by `dot_f16_f32`'s tree after its acc0 + acc1 (lane i +
        /// i+4, then [0+2, 1+3], then 0+1), all at once: lane l of the result is the sum of
        /// t[2l] for l < 4 and of t[2(l - 4) + 1] for l >= 4.
        #[inline(always)]
        unsafe fn sums8(t: &[__m256; 8]) -> __m256 {
            let a: [__m256; 4] = std::array::from_fn(|i| {
                let (x, y) = (t[2 * i], t[2 * i + 1]);
                _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(x, y),
                    _mm256_permute2f128_ps::<0x31>(x, y),
                )
            });
            let b: [__m256; 2] = std::array::from_fn(|i| {
                let (x, y) = (a[2 * i], a[2 * i + 1]);
                _mm256_add_ps(
                    _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
                    _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
                )
            });
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b10_00_10_00>(b[0], b[1]),
                _mm256_shuffle_ps::<0b11_01_11_01>(b[0], b[1]),
            )
        }

        /// Scores of four query heads over positions 0..len (len rounded up to 2), each dot
        /// `dot_f16_f32`'s: acc0 over dims 16s + 0..7, acc1 over 16s + 8..15, acc0 + acc1, then
        /// its tree; two positions at a time, each K value loaded once for the four heads.
        #[inline(always)]
        unsafe fn scores4(
            k: impl Fn(usize, usize) -> __m256,
            hd: usize,
            q: [&[f32]; 4],
            len: usize,
            scale: f32,
            sc: [*mut f32; 4],
        ) {
            let sv = _mm256_set1_ps(scale);
            let mut out = [0f32; 8];
            for j in (0..len).step_by(2) {
                // t[2h + kk]: head h, position j + kk (so lanes h and 4 + h of the sums).
                let mut t = [_mm256_setzero_ps(); 8];
                for kk in 0..2 {
                    let mut a0 = [_mm256_setzero_ps(); 4];
                    let mut a1 = [_mm256_setzero_ps(); 4];
                    for d in (0..hd).step_by(16) {
                        let (k0, k1) = (k(j + kk, d), k(j + kk, d + 8));
                        for h in 0..4 {
                            let qp = q[h].as_ptr().add(d);
                            a0[h] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(qp), a0[h]);
                            a1[h] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(qp.add(8)), a1[h]);
                        }
                    }
                    for h in 0..4 {
                        t[2 * h + kk] = _mm256_add_ps(a0[h], a1[h]);
                    }
                }
                _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(sums8(&t), sv));
                for h in 0..4 {
                    *sc[h].add(j) = out[h];
                    *sc[h].add(j + 1) = out[4 + h];
                }
            }
        }

        /// o_h = sum_j w_h[j] v_j in position order (o = 0; o = fma(w_j, v_j, o)) for GH heads
        /// and 16 values of a row loader (v(j, d): values d .. d + 7 of position j's part);
        #[inline(always)]
        unsafe fn weighted<const GH: usize>(
            v: impl Fn(usize, usize) -> __m256,
            hd: usize,
            w: *const f32,
            wl: usize,
            len: usize,
            res: *mut f32,
        ) {
            let mut o = [[_mm256_setzero_ps(); 2]; GH];
            for j in 0..len {
                let vv = [v(j, 0), v(j, 8)];
                for (hh, oh) in o.iter_mut().enumerate() {
                    let wj = _mm256_set1_ps(*w.add(hh * wl + j));
                    oh[0] = _mm256_fmadd_ps(wj, vv[0], oh[0]);
                    oh[1] = _mm256_fmadd_ps(wj, vv[1], oh[1]);
                }
            }
            for (hh, oh) in o.iter().enumerate() {
                _mm256_storeu_ps(res.add(hh * hd), oh[0]);
                _mm256_storeu_ps(res.add(hh * hd + 8), oh[1]);
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn group<R: Rows>(
            rows: &R,
            hd: usize,
            qs: &[f32],
            g: usize,
            len: usize,
            scale: f32,
            res: &mut [f32],
        ) {
            let k = |j: usize, d: usize| match rows.k(j, d) {
                Some(p) => load8::<R>(p),
                None => _mm256_setzero_ps(),
            };
            super::super::heads(
                hd,
                qs,
                g,
                len,
                res,
                16,
                |q, sc| scores4(k, hd, q, len, scale, sc),
                |gh, d0, wh, wl, r| {
                    let vload = |j: usize, d: usize| load8::<R>(rows.v(j, d0 + d));
                    match gh {
                        4 => weighted::<4>(vload, hd, wh, wl, len, r),
                        3 => weighted::<3>(vload, hd, wh, wl, len, r),
                        2 => weighted::<2>(vload, hd, wh, wl, len, r),
                        _ => weighted::<1>(vload, hd, wh, wl, len, r),
                    }
                },
            )
        }
    }
}
