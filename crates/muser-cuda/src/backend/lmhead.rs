//! The LM head in row chunks, its logits read back while the later chunks still compute (lab
//! run 89; `MUSER_CUDA_LM_CHUNKS=K`, default 2; 1 turns it off).
//!
//! A decode step ends with the LM head, and the step waits for its logits to come back over
//! PCIe after it: at 32 streams of a 202k vocabulary that is 25.9 MB, ~0.5 ms a step. The
//! vocabulary's rows are independent, so the head may run as K launches over row windows of the
//! same resident matrix (`Job::window`, no copy of the weights). Each launch writes its
//! `[n][rows]` block to a scratch buffer; `scale_softcap_into` scales it into its columns of
//! the `[n][V]` logits and an event marks the chunk done. A read into page-locked memory
//! (`read_pinned`) then copies each chunk's part of every row on a second stream behind that
//! chunk's event, so chunk c's copy runs while chunk c + 1 computes. Every value is the one the
//! single launch makes: a row's sum never depends on which launch holds the row.
//!
//! In a captured decode step the events are recorded as external event nodes on a branch of the
//! capture (fork from the stream after the chunk, join at the end), so the kernels' own edges
//! stay kernel to kernel and keep their programmatic (PDL) links.
//!
//! Only steps whose logits the host reads back run chunked (`Backend::will_read_logits`): when
//! they are reduced on the GPU (`argmax`, `top_k`, as `muser serve` does), the single launch is
//! faster. H100, llama-glimmer, 2026-12-06: two chunks +0.45-0.75% at 8, 16 and 32 streams
//! reading the logits, -0.1-0.2% with the GPU argmax (BENCHMARKS.md, lab README run 89).
//! On by default (K = 2) since a GPU compared a replayed step's chunked logits with the single
//! launch's byte for byte (`scripts/matvec_lab/run89_lean.sh`, H100, 2026-12-06 ~05:07: 96
//! llama-glimmer decode steps from one column on, identical; 8/32 streams +0.5%/+0.9%).

use super::{cfg1, ck, grow, CudaBackend};
use crate::matvec::{row_chunks, window_offset, DeviceMatrix, Job};
use cudarc::driver::{sys, CudaEvent, CudaStream, PushKernelArg};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Rows a chunk holds a multiple of: the widest row tile of any matvec route (`mmw_*`, 64).
const CHUNK_UNIT: usize = 64;

/// Most columns an LM head runs chunked at: decode groups and batched prefills' last rows, not a
/// prompt's every position (`muser perplexity`), whose chunk scratch would double its logits.
const CHUNK_MAX_COLS: usize = 64;

/// The chunked LM head's settings and the state of its last launch.
pub(super) struct LmChunks {
    /// Chunks (1: the single launch).
    k: AtomicUsize,
    /// Fewest columns (rows of the step) that run chunked.
    min_cols: AtomicUsize,
    /// The host reads the coming steps' logits back (`Backend::will_read_logits`).
    read: AtomicBool,
    state: Mutex<LmState>,
}

#[derive(Default)]
struct LmState {
    /// The stream the chunks' reads are issued on (and, in a capture, their events' branch).
    side: Option<Arc<CudaStream>>,
    /// Recorded when chunk c's logits are in place.
    done: Vec<CudaEvent>,
    /// Capture only: where the branch that records `done[c]` leaves the stream.
    fork: Vec<CudaEvent>,
    /// Capture only: where the branch joins the stream again.
    join: Option<CudaEvent>,
    /// What the last LM head left in which buffer, if it ran chunked.
    last: Option<LmRead>,
}

/// A chunked LM head's output: `n` rows of `v` logits at device address `buf`, column windows
/// `ranges[c]` complete once `done[c]` has completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LmRead {
    buf: u64,
    n: usize,
    v: usize,
    ranges: Vec<(usize, usize)>,
}

impl LmChunks {
    /// From `MUSER_CUDA_LM_CHUNKS` (default 2; 1: one launch) and `MUSER_CUDA_LM_CHUNK_MIN`
    /// (default 2; lab run 90: chunks at one column lose).
    pub(super) fn from_env() -> LmChunks {
        let get = |name, d| crate::matvec::env_usize(name).unwrap_or(d).max(1);
        LmChunks {
            k: AtomicUsize::new(get("MUSER_CUDA_LM_CHUNKS", 2)),
            min_cols: AtomicUsize::new(get("MUSER_CUDA_LM_CHUNK_MIN", 2)),
            read: AtomicBool::new(true),
            state: Mutex::new(LmState::default()),
        }
    }
}

/// The pieces of a read of values `first..first + len` of an `[n][v]` buffer that lie in
/// columns `r0..r1`: (index in the buffer, offset in the destination, count), row by row.
pub(super) fn chunk_pieces(
    first: usize,
    len: usize,
    v: usize,
    r0: usize,
    r1: usize,
) -> Vec<(usize, usize, usize)> {
    if len == 0 || v == 0 {
        return Vec::new();
    }
    let end = first + len;
    (first / v..=(end - 1) / v)
        .filter_map(|j| {
            let (a, b) = ((j * v + r0).max(first), (j * v + r1).min(end));
            (a < b).then(|| (a, a - first, b - a))
        })
        .collect()
}

impl CudaBackend {
    /// The LM head's chunks (`MUSER_CUDA_LM_CHUNKS`; 1: one launch).
    pub fn lm_chunks(&self) -> usize {
        self.lm.k.load(Relaxed)
    }
    /// The chunks the coming LM heads run in: `lm_chunks` while the host reads their logits
    /// back, else 1.
    pub(super) fn lm_chunks_now(&self) -> usize {
        if self.lm.read.load(Relaxed) {
            self.lm_chunks()
        } else {
            1
        }
    }
    /// `Backend::will_read_logits`.
    pub(super) fn set_lm_read(&self, read: bool) {
        self.lm.read.store(read, Relaxed);
    }
    /// The fewest columns an LM head runs chunked at (`MUSER_CUDA_LM_CHUNK_MIN`, default 2).
    pub fn lm_chunk_min(&self) -> usize {
        self.lm.min_cols.load(Relaxed)
    }
    /// Sets `lm_chunks` and the fewest columns that run chunked (`muser check`).
    pub fn set_lm_chunks(&self, k: usize, min_cols: usize) {
        self.lm.k.store(k.max(1), Relaxed);
        self.lm.min_cols.store(min_cols.max(1), Relaxed);
    }

    /// The row windows an LM head of `n` columns over `m` runs in, or none (one launch): chunks
    /// off, logits not read back, too few or too many columns, a type whose rows are not
    /// contiguous windows, or too few rows.
    pub(super) fn lm_plan(&self, n: usize, m: &DeviceMatrix) -> Vec<(usize, usize)> {
        let k = self.lm_chunks_now();
        if k < 2 || n < self.lm.min_cols.load(Relaxed) || n > CHUNK_MAX_COLS {
            return Vec::new();
        }
        let plan = row_chunks(m.rows, k, CHUNK_UNIT);
        let windows = plan
            .iter()
            .all(|&(r0, _)| window_offset(m.ty, m.rows, m.cols, r0).is_some());
        if plan.len() < 2 || !windows {
            return Vec::new();
        }
        plan
    }

    /// The LM head of `plan`'s chunks: each window of `m` times the `n` columns of the activation
    /// already quantized at `x` (width `k`), into `scratch`, then scaled into the `[n][m.rows]`
    /// logits at `out`, then its event.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lm_head_chunks(
        &self,
        plan: &[(usize, usize)],
        m: &DeviceMatrix,
        x: u64,
        k: usize,
        n: usize,
        ws: &mut super::Workspace,
        out: u64,
        scale: f32,
        cap: f32,
    ) {
        grow(&self.gpu, &mut ws.lm_out, n * m.rows);
        let lo = self.p(&ws.lm_out);
        let mut st = self.lm.state.lock().unwrap();
        self.lm_events(&mut st, plan.len());
        let capturing = self.gpu.stream.capture_status().ok()
            != Some(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        for (c, &(r0, r1)) in plan.iter().enumerate() {
            let y = lo + (n * r0 * 4) as u64;
            let job = ck(Job::window(m, y, r0, r1), "lm_head window");
            ck(
                self.gpu.matvec_jobs(&[job], x, k, n, &ws.act),
                "lm_head matvec",
            );
            let (ni, rows, v, r0i) = (n as i32, (r1 - r0) as i32, m.rows as i32, r0 as i32);
            let mut b = self
                .gpu
                .stream
                .launch_builder(self.kernel("scale_softcap_into"));
            b.arg(&y)
                .arg(&out)
                .arg(&ni)
                .arg(&rows)
                .arg(&v)
                .arg(&r0i)
                .arg(&scale)
                .arg(&cap);
            // SAFETY: the scratch holds n * m.rows values (grown above), chunk c's n x rows at
            // n * r0; out holds n rows of m.rows values, of which columns r0..r1 are written.
            ck(
                unsafe { b.launch(cfg1(n * (r1 - r0), 256)) },
                "scale_softcap_into",
            );
            self.lm_mark(&st, c, capturing);
        }
        if capturing {
            // The branch rejoins the stream, as a capture must end with every fork joined.
            let (side, join) = (st.side.as_ref().unwrap(), st.join.as_ref().unwrap());
            ck(join.record(side), "lm_head join");
            ck(self.gpu.stream.wait(join), "lm_head join");
        }
        st.last = Some(LmRead {
            buf: out,
            n,
            v: m.rows,
            ranges: plan.to_vec(),
        });
    }

    /// The side stream and `count` events of each kind, made once.
    fn lm_events(&self, st: &mut LmState, count: usize) {
        if st.side.is_none() {
            st.side = Some(ck(self.gpu.ctx.new_stream(), "lm_head stream"));
            st.join = Some(ck(self.gpu.ctx.new_event(None), "lm_head event"));
        }
        while st.done.len() < count {
            st.done
                .push(ck(self.gpu.ctx.new_event(None), "lm_head event"));
            st.fork
                .push(ck(self.gpu.ctx.new_event(None), "lm_head event"));
        }
    }

    /// Records `done[c]` behind what the stream holds: directly, or in a capture as an external
    /// event node on a branch that leaves the stream here.
    fn lm_mark(&self, st: &LmState, c: usize, capturing: bool) {
        if !capturing {
            ck(st.done[c].record(&self.gpu.stream), "lm_head event");
            return;
        }
        let side = st.side.as_ref().unwrap();
        ck(st.fork[c].record(&self.gpu.stream), "lm_head fork");
        ck(side.wait(&st.fork[c]), "lm_head fork");
        // SAFETY: both handles are alive (owned by the state); the side stream is capturing
        // (it waited on an event of the capture above), so this adds an event record node.
        let r = unsafe {
            sys::cuEventRecordWithFlags(
                st.done[c].cu_event(),
                side.cu_stream(),
                sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
            )
        };
        ck(r.result(), "lm_head event");
    }

    /// Forgets the last chunked LM head (an LM head of one launch, or a replayed step without
    /// one, wrote the logits since).
    pub(super) fn lm_forget(&self) {
        self.lm.state.lock().unwrap().last = None;
    }
    /// What the LM head of the step being recorded left (kept with its graph).
    pub(super) fn lm_last(&self) -> Option<LmRead> {
        self.lm.state.lock().unwrap().last.clone()
    }
    /// A replayed step's LM head, as its capture left it.
    pub(super) fn lm_replayed(&self, last: Option<LmRead>) {
        self.lm.state.lock().unwrap().last = last;
    }

    /// `read_pinned` of a chunked LM head's logits: each chunk's pieces of every part on the
    /// side stream behind that chunk's event, then one wait. False (nothing done) unless `buf`
    /// holds the last chunked LM head's output.
    pub(super) fn lm_read(
        &self,
        buf: u64,
        total: usize,
        parts: &mut [(usize, &mut [f32])],
    ) -> bool {
        let st = self.lm.state.lock().unwrap();
        let Some(lm) = st
            .last
            .as_ref()
            .filter(|l| l.buf == buf && l.n * l.v == total)
        else {
            return false;
        };
        let side = st.side.as_ref().expect("a chunked LM head made its stream");
        for (c, &(r0, r1)) in lm.ranges.iter().enumerate() {
            ck(side.wait(&st.done[c]), "read logits");
            for (first, dst) in parts.iter_mut() {
                for (src, at, cnt) in chunk_pieces(*first, dst.len(), lm.v, r0, r1) {
                    // SAFETY: src..src + cnt lies in the buffer (the parts were checked against
                    // it); dst is page-locked memory borrowed mutably for this call, and both
                    // streams are synchronized before it returns.
                    ck(
                        unsafe {
                            cudarc::driver::result::memcpy_dtoh_async(
                                &mut dst[at..at + cnt],
                                buf + (src * 4) as u64,
                                side.cu_stream(),
                            )
                        },
                        "read logits",
                    );
                }
            }
        }
        ck(side.synchronize(), "read logits");
        ck(self.gpu.stream.synchronize(), "read logits");
        self.lm_reads.fetch_add(1, Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_pieces;
    use crate::matvec::row_chunks;

    #[test]
    fn chunk_pieces_cover_every_part_once() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(89);
        for _ in 0..300 {
            let (n, v) = (rng.gen_range(1..6), rng.gen_range(1..300));
            let chunks = row_chunks(v, rng.gen_range(1..6), rng.gen_range(1..9));
            assert_eq!(chunks.first().unwrap().0, 0);
            assert_eq!(chunks.last().unwrap().1, v);
            assert!(chunks
                .windows(2)
                .all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1));
            let first = rng.gen_range(0..n * v);
            let len = rng.gen_range(0..=n * v - first);
            // Each destination value is written exactly once, from its own source index.
            let mut seen = vec![0u32; len];
            for &(r0, r1) in &chunks {
                for (src, at, cnt) in chunk_pieces(first, len, v, r0, r1) {
                    assert_eq!(src, first + at);
                    for i in 0..cnt {
                        assert!((r0..r1).contains(&((src + i) % v)));
                        seen[at + i] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "n {n} v {v} {chunks:?}");
        }
    }
}
