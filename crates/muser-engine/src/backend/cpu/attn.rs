//! Batched attention for prefill (AVX-512): the rows of one sequence over its f16 KV cache,
//! with every (row, head) result bit for bit that of `KvLayer::attend_head` (the decode path).
//!
//! `attend_head` computes, per (row, head): scores `dot_f16_f32(k_j, q) * scale` (the AVX2
//! dot: two 8-lane FMA chains over 16 values per step, then a fixed reduction tree), the
//! weights `softmax(scores)`, then `o = 0; o = fma(w_j, v_j, o)` in position order. Here the same operations are laid out for throughput:
//!
//! - K is converted once per call to f32 and transposed into blocks of 16 positions
//!   (`[block][dim][16]`), so one FMA advances the same lane chain of 16 positions; the 16
//!   chains of the AVX2 dot (lane l of its two accumulators) are kept apart and reduced with
//!   its tree. The query's values are broadcast once per 4 blocks.
//! - V is converted once per call to f32; the G query heads that share a KV head (GQA) are
//!   done together, so each V row is loaded once for G heads.
//! - the softmax is the shared one (`softmax.rs`), as in `attend_head`.
//!
//! Used when a call has enough rows for the conversions to pay (`MIN_ROWS`), the head size
//! is a multiple of 16 and the CPU has AVX-512F (with AVX2, FMA, F16C, which the decode path's
//! kernels use); otherwise the caller runs `attend_head` per (row, head).

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
    // Blocks of 16 positions, plus 3 of zeros: scores run 4 blocks at a time.
    let nblk = span.div_ceil(16) + 3;
    let kvw = nkv * hd;
    // Per KV head: K transposed ([block][dim][16] f32) and V ([pos][dim] f32), from `base`.
    let mut kt = vec![0f32; nkv * nblk * hd * 16];
    let mut vf = vec![0f32; nkv * span * hd];
    kt.par_chunks_mut(nblk * hd * 16)
        .zip(vf.par_chunks_mut(span * hd))
        .enumerate()
        .for_each(|(kh, (kt, vf))| {
            let mut row = vec![0f32; hd];
            for j in 0..span {
                let s = kv.slot(base + j) * kvw + kh * hd;
                kv.k[s..s + hd].convert_to_f32_slice(&mut row);
                let (b, l) = (j / 16, j % 16);
                for (d, &x) in row.iter().enumerate() {
                    kt[(b * hd + d) * 16 + l] = x;
                }
                kv.v[s..s + hd].convert_to_f32_slice(&mut vf[j * hd..(j + 1) * hd]);
            }
        });
    let o = OutPtr(out.as_mut_ptr());
    assert_eq!(out.len(), q.len());
    (0..n * nkv).into_par_iter().for_each(|task| {
        let (t, kh) = (task / nkv, task % nkv);
        let p = pos0 + t;
        let lo = lo_of(p);
        let kt = &kt[kh * nblk * hd * 16..(kh + 1) * nblk * hd * 16];
        let vf = &vf[kh * span * hd..(kh + 1) * span * hd];
        let heads = kh * group..(kh + 1) * group;
        let qs = &q[t * width + heads.start * hd..t * width + heads.end * hd];
        let mut res = [0f32; 1024];
        assert!(group * hd <= res.len(), "attention group of {group} x {hd} values");
        // SAFETY: the CPU has the features (`available`); the slices are sized for the
        // blocks and positions used (lo - base .. p - base < span, blocks up to 3 past it).
        unsafe { x86::group(kt, vf, hd, qs, group, lo - base, p - base, scale, &mut res[..group * hd]) };
        for (g, h) in heads.enumerate() {
            // SAFETY: row t, head h of out is inside it and only this task writes it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    res[g * hd..].as_ptr(),
                    o.at(t * width + h * hd),
                    hd,
                )
            };
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One lane chain of the AVX2 dot for 4 blocks: lane l of its accumulators (acc0 for l < 8,
    /// acc1 for l >= 8) over dims l, l + 16, ..., for 16 positions per block.
    #[inline(always)]
    unsafe fn chain(kt: *const f32, blk: usize, steps: usize, q: *const f32, l: usize) -> [__m512; 4] {
        let mut c = [_mm512_setzero_ps(); 4];
        for s in 0..steps {
            let d = 16 * s + l;
            let qd = _mm512_set1_ps(*q.add(d));
            for (k, ck) in c.iter_mut().enumerate() {
                *ck = _mm512_fmadd_ps(_mm512_loadu_ps(kt.add(k * blk + d * 16)), qd, *ck);
            }
        }
        c
    }

    #[inline(always)]
    unsafe fn add4(a: [__m512; 4], b: [__m512; 4]) -> [__m512; 4] {
        [
            _mm512_add_ps(a[0], b[0]),
            _mm512_add_ps(a[1], b[1]),
            _mm512_add_ps(a[2], b[2]),
            _mm512_add_ps(a[3], b[3]),
        ]
    }

    /// Scores of one query over key blocks b0..b1 (of 16 positions): sc[16 (b - b0) + l] =
    /// dot(k_{16b + l}, q) * scale with the AVX2 dot's chains and reduction tree: acc = acc0 +
    /// acc1; s4 = lo4 + hi4; s2 = [s4_0 + s4_2, s4_1 + s4_3]; dot = s2_0 + s2_1. Computed
    /// along the tree so that few vectors are live.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn scores(kt: &[f32], hd: usize, q: &[f32], b0: usize, b1: usize, scale: f32, sc: &mut [f32]) {
        let steps = hd / 16;
        let blk = hd * 16;
        let qp = q.as_ptr();
        // Four blocks at a time (the buffer has 3 blocks of zeros past the last).
        for b in (b0..b1).step_by(4) {
            assert!((b + 4) * blk <= kt.len() && 16 * (b + 4 - b0) <= sc.len());
            let kp = kt.as_ptr().add(b * blk);
            let acc = |l: usize| add4(chain(kp, blk, steps, qp, l), chain(kp, blk, steps, qp, l + 8));
            let s4 = |m: usize| add4(acc(m), acc(m + 4));
            let s2_0 = add4(s4(0), s4(2));
            let s2_1 = add4(s4(1), s4(3));
            let dot = add4(s2_0, s2_1);
            for (k, dk) in dot.iter().enumerate() {
                _mm512_storeu_ps(
                    sc.as_mut_ptr().add(16 * (b + k - b0)),
                    _mm512_mul_ps(*dk, _mm512_set1_ps(scale)),
                );
            }
        }
    }

    thread_local! {
        /// Per thread: scores and weights of a task.
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// o_h = sum_j w_h[j] v_j in position order (o = 0; o = fma(w_j, v_j, o)), for GH heads
    /// and ND x 16 values from d0.
    #[inline(always)]
    unsafe fn weighted<const GH: usize, const ND: usize>(
        vf: *const f32,
        hd: usize,
        w: *const f32,
        wl: usize,
        len: usize,
        res: *mut f32,
    ) {
        let mut o = [[_mm512_setzero_ps(); ND]; GH];
        for j in 0..len {
            let v = vf.add(j * hd);
            let vv: [__m512; ND] = std::array::from_fn(|k| _mm512_loadu_ps(v.add(16 * k)));
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
        let (b0, b1) = (lo / 16, p / 16 + 1);
        let len = p + 1 - lo;
        let off = lo - 16 * b0;
        let wl = len.next_multiple_of(16);
        let nsc = 16 * (b1 - b0).next_multiple_of(4);
        let mut buf = SCRATCH.with(|b| std::mem::take(&mut *b.borrow_mut()));
        if buf.len() < g * wl + nsc {
            buf.resize(g * wl + nsc, 0.0);
        }
        let (w, sc) = buf.split_at_mut(g * wl);
        // Per head: the weights softmax(scores) of positions lo..=p.
        for h in 0..g {
            scores(kt, hd, &qs[h * hd..(h + 1) * hd], b0, b1, scale, sc);
            let e = &mut sc[off..off + len];
            super::super::softmax::softmax(e);
            w[h * wl..h * wl + len].copy_from_slice(e);
        }
        // Up to 4 heads x 64 values at a time.
        let (vp, wp, rp) = (vf.as_ptr().add(lo * hd), w.as_ptr(), res.as_mut_ptr());
        for h0 in (0..g).step_by(4) {
            let gh = (g - h0).min(4);
            for d0 in (0..hd).step_by(64) {
                let nd = ((hd - d0) / 16).min(4);
                let (v, wh, r) = (vp.add(d0), wp.add(h0 * wl), rp.add(h0 * hd + d0));
                macro_rules! go {
                    ($($gh:literal, $nd:literal);*) => {
                        match (gh, nd) {
                            $(($gh, $nd) => weighted::<$gh, $nd>(v, hd, wh, wl, len, r),)*
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
