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
//! its context once), each K and V row loaded once for the KV head's query heads, and the rows
//! (strided through the cache, one KV head's slice of each position's row) asked for 32
//! positions ahead. llama-1b, 2 threads, tg32 at depth 4096: 21-22 tokens/s with `attend_head`
//! per (row, head), 43-44 now (BENCHMARKS.md).

use super::kv::KvLayer;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Rows from which a call takes the batched path.
pub const MIN_ROWS: usize = 8;

/// Whether the batched path serves a layer with this head size on this CPU.
pub fn available(head_dim: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let has = *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        });
        has && head_dim > 0 && head_dim.is_multiple_of(16)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = head_dim;
        false
    }
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
    let kvw = nkv * hd;
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
                let s = kv.slot(base + j) * kvw + kh * hd;
                kv.k[s..s + hd].convert_to_f32_slice(&mut kf[j * hd..(j + 1) * hd]);
                kv.v[s..s + hd].convert_to_f32_slice(&mut vf[j * hd..(j + 1) * hd]);
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
        unsafe { x86::group(kf, vf, hd, qs, group, lo - base, p - base, scale, res) };
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
    let kvw = spec.n_head_kv * hd;
    let last = kv.slot(p) * kvw + kh * hd + hd;
    assert!(
        last <= kv.k.len() && last <= kv.v.len(),
        "attend_kv_head: position {p} not stored"
    );
    let rows = Rows16 {
        k: kv.k.as_ptr() as *const u16,
        v: kv.v.as_ptr() as *const u16,
        off: kh * hd,
        stride: kvw,
        base: lo,
        slots: if spec.is_ring() { spec.slots } else { 0 },
    };
    // SAFETY: the CPU has the features (`available`); every position lo..=p is stored (the
    // slots of a ring, the plane up to p: checked above for p, and the cache grows in order).
    unsafe { x86::group_f16(&rows, hd, qs, g, p + 1 - lo, scale, res) };
}

/// One KV head's f16 rows in the cache: position j's K at k + slot(j) * stride + off (V the
/// same), slot(j) = j, or j % slots for a ring (slots > 0); positions from `base`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Rows16 {
    k: *const u16,
    v: *const u16,
    off: usize,
    stride: usize,
    base: usize,
    slots: usize,
}

/// Other targets: `available` is false, so this is never called.
#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn group(
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

    pub unsafe fn group_f16(
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

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
    /// prefetch(j) is called once per position before its loads.
    #[inline(always)]
    unsafe fn scores4(
        k: impl Fn(usize, usize) -> __m512,
        prefetch: impl Fn(usize),
        hd: usize,
        q: [&[f32]; 4],
        len: usize,
        scale: f32,
        sc: [*mut f32; 4],
    ) {
        let steps = hd / 16;
        let sv = _mm512_set1_ps(scale);
        for j in (0..len).step_by(4) {
            for kk in 0..4 {
                prefetch(j + kk);
            }
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

    thread_local! {
        /// Per thread: scores and weights of a task.
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// o_h = sum_j w_h[j] v_j in position order (o = 0; o = fma(w_j, v_j, o)), for GH heads
    /// and ND x 16 values of a row loader (v(j, d): values d .. d + 15 of position j's part);
    /// prefetch(j) once per position before its loads.
    #[inline(always)]
    unsafe fn weighted<const GH: usize, const ND: usize>(
        v: impl Fn(usize, usize) -> __m512,
        prefetch: impl Fn(usize),
        hd: usize,
        w: *const f32,
        wl: usize,
        len: usize,
        res: *mut f32,
    ) {
        let mut o = [[_mm512_setzero_ps(); ND]; GH];
        for j in 0..len {
            prefetch(j);
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

    /// The G query heads `qs` (`[G, hd]`) sharing one KV head, at a row that sees positions
    /// lo..=p (relative to the buffers' base); writes res (`[G, hd]`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn group(
        kt: &[f32], // K as f32 rows (8 rows of padding)
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
        let (kp, vp) = (kt.as_ptr().add(lo * hd), vf.as_ptr().add(lo * hd));
        let rows = Loaders {
            k: |j: usize, d: usize| _mm512_loadu_ps(kp.add(j * hd + d)),
            v: |j: usize, d: usize| _mm512_loadu_ps(vp.add(j * hd + d)),
            kpf: |_: usize| {},
            vpf: |_: usize| {},
        };
        heads(&rows, hd, qs, g, len, scale, res)
    }

    use super::Rows16;

    impl Rows16 {
        /// The offset of relative position j's row.
        #[inline(always)]
        fn at(&self, j: usize) -> usize {
            let pos = self.base + j;
            let slot = if self.slots > 0 {
                pos % self.slots
            } else {
                pos
            };
            slot * self.stride + self.off
        }
    }

    /// Positions ahead whose K or V row a decode task asks the cache for.
    const PF: usize = 32;

    /// 16 f16 values at p as f32 (exact).
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    /// `group` for one decode row over the f16 rows of `rows`: positions 0..len (relative to
    /// rows.base). The same scores, softmax and weighted sums, the loads converting f16.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn group_f16(
        rows: &Rows16,
        hd: usize,
        qs: &[f32],
        g: usize,
        len: usize,
        scale: f32,
        res: &mut [f32],
    ) {
        // The rows are a KV head's slice of each position's row of the cache (strided): each
        // load would wait on memory without a prefetch PF positions ahead (36% of the kernel's
        // samples sat on the first K load of a position before this).
        let pf = |base: *const u16, j: usize| {
            if j + PF < len {
                let p = base.add(rows.at(j + PF)) as *const i8;
                for line in (0..2 * hd).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(line));
                }
            }
        };
        let loaders = Loaders {
            // Positions past len (scores4 runs 4 at a time) read as zeros: their scores land
            // in slots softmax never sees.
            k: |j: usize, d: usize| {
                if j < len {
                    load16(rows.k.add(rows.at(j) + d))
                } else {
                    _mm512_setzero_ps()
                }
            },
            v: |j: usize, d: usize| load16(rows.v.add(rows.at(j) + d)),
            kpf: |j: usize| pf(rows.k, j),
            vpf: |j: usize| pf(rows.v, j),
        };
        heads(&loaders, hd, qs, g, len, scale, res)
    }

    /// Where a task's K and V rows come from: values d .. d + 15 of relative position j, and a
    /// prefetch of what a position needs some way ahead.
    struct Loaders<K, V, KP, VP> {
        k: K,
        v: V,
        kpf: KP,
        vpf: VP,
    }

    /// The body shared by `group` and `group_f16`: per head the scores, then in place the weights
    /// softmax(scores), of positions 0..len, four heads at a time (a missing head repeats one,
    /// its scores land in `spare`); then o = sum_j w_j v_j, up to 4 heads x 64 values at a time.
    /// The prefetches run with the first pass over the positions only.
    #[inline(always)]
    unsafe fn heads<K, V, KP, VP>(
        rows: &Loaders<K, V, KP, VP>,
        hd: usize,
        qs: &[f32],
        g: usize,
        len: usize,
        scale: f32,
        res: &mut [f32],
    ) where
        K: Fn(usize, usize) -> __m512,
        V: Fn(usize, usize) -> __m512,
        KP: Fn(usize),
        VP: Fn(usize),
    {
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
                    w.as_mut_ptr().add((h0 + k) * wl)
                } else {
                    spare.as_mut_ptr()
                }
            });
            let kpf = |j: usize| {
                if h0 == 0 {
                    (rows.kpf)(j)
                }
            };
            scores4(&rows.k, kpf, hd, q, len, scale, sc);
        }
        for h in 0..g {
            super::super::softmax::softmax(&mut w[h * wl..h * wl + len]);
        }
        let (wp, rp) = (w.as_ptr(), res.as_mut_ptr());
        for h0 in (0..g).step_by(4) {
            let gh = (g - h0).min(4);
            for d0 in (0..hd).step_by(64) {
                let nd = ((hd - d0) / 16).min(4);
                let (wh, r) = (wp.add(h0 * wl), rp.add(h0 * hd + d0));
                let vload = |j: usize, d: usize| (rows.v)(j, d0 + d);
                let vpf = |j: usize| {
                    if h0 == 0 && d0 == 0 {
                        (rows.vpf)(j)
                    }
                };
                macro_rules! go {
                    ($($gh:literal, $nd:literal);*) => {
                        match (gh, nd) {
                            $(($gh, $nd) => weighted::<$gh, $nd>(vload, vpf, hd, wh, wl, len, r),)*
                            _ => unreachable!(),
                        }
                    };
                }
                go!(4, 4; 4, 3; 4, 2; 4, 1; 3, 4; 3, 3; 3, 2; 3, 1; 2, 4; 2, 3; 2, 2; 2, 1; 1, 4; 1, 3; 1, 2; 1, 1);
            }
        }
        SCRATCH.with(|b| *b.borrow_mut() = buf);
    }
}
