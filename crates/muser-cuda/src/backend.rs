//! `CudaBackend`: the engine's `Backend` on one GPU. Weights are uploaded once (a progress bar
//! while they go), activations are f32 device buffers, the KV cache is f16 on the device, and
//! every op of the decode chain is one kernel (or a fused group) of `kernels/`.
//!
//! The trait's ops return no `Result`: a driver error in the middle of a forward pass (a lost
//! device, an illegal address) panics with the driver's message. Everything that can be checked
//! before the first token (no driver, no device, no NVRTC, an unsupported tensor type) is an
//! error from `CudaBackend::new` or `Backend::weight`.
//!
//! All work goes to one stream in order; the host waits only where it reads a buffer back.
//!
//! Decode groups (the `*_rows` ops): each row's position and KV cache come from two small device
//! tables (`RowTables`), uploaded only when the group's positions or caches change (once per
//! step), so RoPE, the KV store and attention of all rows are one launch each.
//!
//! Decode steps are CUDA graphs (`decode_step`): a step's tokens, positions and cache table are
//! uploaded first, and every launch of the step reads them from device memory, so its launches
//! depend only on the step's shape: the group size, the attention head chunks of each layer
//! (which change at a few context lengths) and the addresses of the scratch buffers. The first
//! step of a shape runs op by op (it grows the buffers it needs), the second is captured into a
//! graph, and later ones replay it: one launch from the host per token instead of ~15 per
//! layer. `MUSER_CUDA_GRAPHS=0` turns this off; profiling (`set_profiling`) does too.

use crate::device::{CudaError, Gpu};
use crate::graph::{pdl_enabled, StepGraph};
use crate::matvec::{dptr, ActScratch, DeviceMatrix, Job};
use cudarc::driver::{sys, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use muser_engine::backend::{Backend, Heads, KvHost, KvLayerSpec, NormArgs};
use muser_engine::config::{RopeParams, RopeStyle};
use muser_engine::weights::TensorView;
use muser_engine::{EngineError, Result};
use muser_gguf::GgmlType;
use std::sync::Mutex;

mod lmhead;

/// A resident weight: a matrix in its (possibly repacked) block layout, or a 1-D tensor
/// dequantized to f32 (norm weights).
pub struct CudaWeight {
    pub name: String,
    pub matrix: Option<DeviceMatrix>,
    pub vector: Option<CudaSlice<f32>>, // (cols)
    pub rows: usize,
    pub cols: usize,
}

impl CudaWeight {
    fn mat(&self) -> &DeviceMatrix {
        self.matrix
            .as_ref()
            .unwrap_or_else(|| panic!("{} is a vector, used as a matrix", self.name))
    }
    fn vec_ptr(&self, gpu: &Gpu) -> u64 {
        dptr(
            gpu,
            self.vector
                .as_ref()
                .unwrap_or_else(|| panic!("{} is a matrix, used as a vector", self.name)),
        )
    }
}

/// An f32 matrix `[rows, cols]` on the device, row-major.
pub struct CudaBuf {
    pub rows: usize,
    pub cols: usize,
    pub data: CudaSlice<f32>,
}

/// The KV cache of one layer: K and V `[slots, n_head_kv * head_dim]` f16 (a ring for sliding
/// layers, a plane of `slots` = n_ctx positions for full layers).
pub struct CudaKvLayer {
    pub spec: KvLayerSpec,
    pub k: CudaSlice<u16>, // f16 bits
    pub v: CudaSlice<u16>, // f16 bits
}

pub struct CudaKv {
    pub layers: Vec<CudaKvLayer>,
}

/// The device tables of the decode group last seen: positions, and per (layer, row) the row's
/// cache of that layer (K, V addresses and slots: `RowKv` in attention.cu).
struct RowTables {
    pos: Vec<i32>,
    pos_dev: CudaSlice<i32>, // (n)
    n: usize,
    kv: Vec<u64>, // (layers, n, 3); prefill tables: (layers, 3), every row the same
    kv_dev: CudaSlice<u64>, // (layers, n, 3)
}

/// Scratch buffers, grown on demand.
struct Workspace {
    act: ActScratch,
    tokens: CudaSlice<u32>,
    /// The tokens last uploaded to `tokens`.
    tokens_host: Vec<u32>,
    o_part: CudaSlice<f32>,
    ml_part: CudaSlice<f32>,
    argmax: CudaSlice<u32>,
    /// `top_k`: the slices' keys, then each row's TOPK_MAX keys (argmax.cu).
    topk_part: CudaSlice<u64>,
    topk_out: CudaSlice<u64>,
    /// The chunked LM head's `[n][rows]` blocks, chunk after chunk (`lmhead`).
    lm_out: CudaSlice<f32>,
}

pub struct CudaBackend {
    pub gpu: Gpu,
    ws: Mutex<Workspace>,
    rows: Mutex<RowTables>,
    /// The row tables of prefill chunks on the per-row attention (`prefill_tables`).
    prefill_rows: Mutex<RowTables>,
    upload: Mutex<Option<indicatif::ProgressBar>>,
    /// Per-op time (synchronizing around each op) when profiling is on: op -> (calls, seconds).
    profile: Mutex<Option<std::collections::BTreeMap<String, (u64, f64)>>>,
    /// Decode steps are recorded and replayed as graphs (see the module doc).
    graphs: std::sync::atomic::AtomicBool,
    /// Ops left out of every step (`MUSER_CUDA_ABLATE=residual_norm,quantize,qkv_rows,attention_rows`):
    /// a measuring tool only, whose output is wrong by design. `muser bench` with it shows what
    /// a step would cost if those kernels (launches, waits and work) cost nothing: the most
    /// that fusing them away could gain. `shared_quads` (read by `matvec::mvk_flags`) leaves the
    /// one-column matvecs' shared row quads uncompleted, for the same purpose.
    ablate: Vec<String>,
    /// Decode attention on the tensor cores where it fits (`mma_attention_fits`).
    attn_mma: std::sync::atomic::AtomicBool,
    /// Short decode rows merge their splits inside the attention launch (`rows_cluster`).
    attn_cluster: std::sync::atomic::AtomicBool,
    /// qkv_rows from registers (`MUSER_CUDA_QKV_REGS=0`: through memory; the same bits).
    qkv_regs: std::sync::atomic::AtomicBool,
    /// Decode steps replayed, recorded and issued op by op (`Backend::step_counts`).
    step_counts: [std::sync::atomic::AtomicU64; 3],
    /// (kernels, kernel edges, programmatic edges) of the last graph captured.
    last_graph: Mutex<Option<(u64, usize, usize)>>,
    /// The f32 values (address, count, row width) whose row-major Q8_K quantization the
    /// workspace's activation scratch holds, written there by the op that produced them
    /// (`residual_norm`, the attention combine, one column of gate+up through `silu_finish_q8k`);
    /// only the next op may use it (every other op
    /// clears it, `timed`), and a matmul or gate+up over exactly those values then skips its
    /// quantizer (`quantize_for`).
    fused_act: Mutex<Option<(u64, usize, usize)>>,
    /// residual_norm, the attention combine and one-column gate+up quantize their output
    /// (`MUSER_CUDA_FUSED_QUANT`, default on; H200, llama-glimmer: tg128 129.6 -> 131.0 tokens/s
    /// in one call for the first two).
    fuse_quant: std::sync::atomic::AtomicBool,
    /// Page-locked host memory that reads of `STAGED_READ_MIN` bytes or more land in first
    /// (`read_staged`), grown to the largest such read's window (`STAGED_READ_MAX` at most).
    staging: Mutex<Option<cudarc::driver::PinnedHostSlice<f32>>>,
    /// The host memory this backend page-locked for `host_buf`: reads into it go straight there
    /// by DMA (`read_pinned`).
    pinned: std::sync::Arc<PinnedRanges>,
    /// `host_buf` hands out page-locked memory (on by default since lab run 88: +13.7% at 8
    /// streams on an H100; `MUSER_CUDA_PINNED_LOGITS=0` turns it off).
    pinned_on: std::sync::atomic::AtomicBool,
    /// Reads that went straight into page-locked `host_buf`s (`read_pinned`).
    pinned_reads: std::sync::atomic::AtomicU64,
    /// The LM head in row chunks, its logits read back under it (`lmhead`, lab run 89).
    lm: lmhead::LmChunks,
    /// Reads of a chunked LM head's logits chunk by chunk (`lmhead`).
    lm_reads: std::sync::atomic::AtomicU64,
}

/// The address ranges [start, end) of the page-locked `host_buf`s alive (`PinnedValues`).
#[derive(Default)]
struct PinnedRanges(Mutex<Vec<(usize, usize)>>);

impl PinnedRanges {
    /// Whether `s` lies inside one of the ranges.
    fn covers(&self, s: &[f32]) -> bool {
        let (a, b) = (
            s.as_ptr() as usize,
            s.as_ptr() as usize + std::mem::size_of_val(s),
        );
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|&(x, y)| x <= a && b <= y)
    }
}

/// A page-locked `host_buf` (`CudaBackend::host_buf`): its range is listed in `PinnedRanges` from
/// allocation until it drops, and taken off before the memory is freed.
struct PinnedValues {
    /// Held for its drop, which frees the page-locked memory.
    _mem: cudarc::driver::PinnedHostSlice<f32>,
    ptr: *mut f32,
    len: usize,
    ranges: std::sync::Arc<PinnedRanges>,
}

// SAFETY: `ptr` is `_mem`'s own allocation, which this value owns alone; it is reached only
// through `&self` / `&mut self` (`HostMem`), so the usual borrow rules keep it race-free.
unsafe impl Send for PinnedValues {}
unsafe impl Sync for PinnedValues {}

impl muser_engine::backend::HostMem for PinnedValues {
    fn values(&self) -> &[f32] {
        // SAFETY: `len` initialized f32 values at `ptr` (zeroed at allocation), alive with `_mem`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn values_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `values`, borrowed mutably through `&mut self` alone.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedValues {
    fn drop(&mut self) {
        let a = self.ptr as usize;
        self.ranges.0.lock().unwrap().retain(|&(x, _)| x != a);
        // `_mem` then frees the page-locked memory (its own drop, after this one).
    }
}

impl Drop for CudaBackend {
    /// With the step trace on, its report of the last decode step replayed (stderr).
    fn drop(&mut self) {
        if let Some(t) = &self.gpu.trace {
            if t.read(&self.gpu.stream).is_ok() {
                eprintln!("{}", t.report());
            }
        }
    }
}

/// Reads of at least this many bytes go through the page-locked staging buffer: a decode
/// group's logits (0.8 MB per row of a 202k vocabulary, 26 MB at 32 rows) copy from the device
/// by DMA into it, then from it into the caller's memory on every core (`read_staged`); a read
/// into pageable memory is staged by the driver, one chunk at a time. Reads past
/// `STAGED_READ_MAX` bytes (a prompt's logits at every position, a decode group's past 80 rows)
/// go through it in windows of that size, so the page-locked memory stays at most 64 MB. H200,
/// llama-glimmer (2026-12-02): 128 rows' logits (103 MB) into the sequences' rows took 122.40
/// ms through the driver's staging and a host copy (10.64 ms for the bare read-back), and 96 or
/// 128 streams made 788 / 804 tokens/s against 2525 at 64.
const STAGED_READ_MIN: usize = 1 << 20;
const STAGED_READ_MAX: usize = 64 << 20;

/// Staged reads of at least this many bytes (a decode group's logits from 16 rows of a 202k
/// vocabulary) land in `read_chunks()` pieces, the host copying out each piece while the next
/// one is on its way. H200, llama-glimmer (2026-12-01): 32 rows (25.9 MB) 1.19 ms in one piece,
/// 0.69 in 4; 8 rows (6.5 MB) 0.48-0.49 ms either way, where each piece's event and dispatch
/// cost what the overlap saves.
const READ_PIPELINE_MIN: usize = 12 << 20;

/// The pieces of a pipelined staged read: 4, or `MUSER_CUDA_READ_CHUNKS` (1: one copy, then the
/// host's work, as before the pipeline).
fn read_chunks() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        crate::matvec::env_usize("MUSER_CUDA_READ_CHUNKS").map_or(4, |n| n.clamp(1, 64))
    })
}

/// Copies `src`, values at .. at + src.len() of the concatenation of `outs`, into the parts it
/// covers, in pieces of at most 64K values spread over the host's cores.
fn copy_into_parts(outs: &mut [&mut [f32]], at: usize, src: &[f32]) {
    use rayon::prelude::*;
    let end = at + src.len();
    let mut pieces: Vec<(&mut [f32], &[f32])> = Vec::new();
    let mut start = 0;
    for o in outs.iter_mut() {
        let (s0, s1) = (start, start + o.len());
        start = s1;
        let (a, b) = (s0.max(at), s1.min(end));
        if a < b {
            let d = &mut o[a - s0..b - s0];
            pieces.extend(
                d.chunks_mut(1 << 16)
                    .zip(src[a - at..b - at].chunks(1 << 16)),
            );
        }
    }
    assert!(start >= end, "read: {end} values into parts of {start}");
    pieces
        .into_par_iter()
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// Sets one of the GPU's routing flags while it lives: `decoding_flag` (ops routed as a decode step's,
/// `Gpu::set_decoding`: never on the prefill-only `mmh` kernels, whose bits are not the
/// one-column kernels') or `exact_flag` (every row the bits it gets alone, `Gpu::set_exact`).
struct Flag<'a>(&'a crate::device::Gpu, fn(&crate::device::Gpu, bool));
impl<'a> Flag<'a> {
    fn new(gpu: &'a crate::device::Gpu, set: fn(&crate::device::Gpu, bool)) -> Self {
        set(gpu, true);
        Flag(gpu, set)
    }
}
impl Drop for Flag<'_> {
    fn drop(&mut self) {
        (self.1)(self.0, false);
    }
}
fn decoding_flag(gpu: &crate::device::Gpu) -> Flag<'_> {
    Flag::new(gpu, crate::device::Gpu::set_decoding)
}
fn exact_flag(gpu: &crate::device::Gpu) -> Flag<'_> {
    Flag::new(gpu, crate::device::Gpu::set_exact)
}

/// The most candidates `top_k` computes on the GPU, and the keys one sort holds (argmax.cu:
/// TOPK_MAX, TOPK_SORT).
const TOPK_MAX: usize = 64;
const TOPK_SORT: usize = 4096;
/// Threads of a `topk_slices` / `topk_merge` block (argmax.cu: TOPK_THREADS).
const TOPK_THREADS: u32 = 512;

/// A `topk_merge` key back to (id, logit); None for a NaN or padding key (below every number).
fn topk_pair(key: u64) -> Option<(u32, f32)> {
    let o = (key >> 32) as u32;
    if o == 0 {
        return None;
    }
    let bits = if o & 0x8000_0000 != 0 {
        o & 0x7FFF_FFFF
    } else {
        !o
    };
    Some((u32::MAX - key as u32, f32::from_bits(bits)))
}

/// Whether a read of `n` f32 values goes through `read_staged`.
fn staged(n: usize) -> bool {
    n * 4 >= STAGED_READ_MIN
}

/// One launch of the per-row attention kernels (decode groups, and prefill chunks: every row by
/// its own position): device tables, partials, and the split plan.
struct RowsAttn {
    /// Device addresses of the rows' positions ([n] i32) and cache table ([n] RowKv).
    pos: u64,
    tab: u64,
    /// Device addresses of the partial outputs and (max, sum) pairs.
    parts: (u64, u64),
    n: usize,
    n_head: usize,
    n_kv: usize,
    /// The grid's splits per row (the partials' stride): at least any row's own.
    splits: usize,
    /// `solo_splits`: a row's own split plan is `row_split(count, solo, min_tiles)`.
    solo: usize,
    /// The fewest 32-position tiles in a split (`attn_split_tiles`).
    min_tiles: usize,
    window: usize,
    ring: bool,
    /// Decode rows (each row's only new position its own): the tensor-core kernel asks for its
    /// first K/V steps before waiting for the kernel before (`attn_early`).
    early: bool,
}

/// What a recorded decode step was recorded for: it replays only while all of it is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StepKey {
    rows: usize,
    /// Attention head chunks of each layer (`rows_chunks`).
    chunks: Vec<usize>,
    /// Whether each layer's tensor-core attention runs 8 warps per block (`rows_wide`).
    wide: Vec<bool>,
    /// Whether each layer's attention merges its splits in clusters (`rows_cluster`).
    cluster: Vec<bool>,
    /// Addresses (and sizes) of the workspace buffers the launches read and write.
    buffers: Vec<u64>,
}

/// The decode steps of one group size recorded as CUDA graphs (`Backend::decode_step`): one per
/// shape (`StepKey`) seen, at most `graph_shapes()` of them, the least recently used dropped
/// first. A server's groups of one size change shape as their positions cross the attention's
/// split points and as wider groups grow the workspace; keeping the earlier shapes' graphs
/// spares a step that comes back to one its op-by-op run and its capture.
pub struct CudaRecording {
    shapes: Vec<Shape>,
    /// Step counter for `Shape::used`.
    clock: u64,
}

struct Shape {
    key: StepKey,
    /// None: the shape ran once op by op; it is captured the next time it comes.
    graph: Option<StepGraph>,
    /// Launches per kernel of the graph, added to the dispatch counters on each replay.
    launches: Vec<(String, u64)>,
    /// `CudaRecording::clock` when it last ran.
    used: u64,
    /// The chunked LM head the graph ends with, if it does (`lmhead`).
    lm: Option<lmhead::LmRead>,
}

/// Shapes kept per group size (`MUSER_CUDA_GRAPH_SHAPES`, default 4; 1 keeps only the last).
fn graph_shapes() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        crate::matvec::env_usize("MUSER_CUDA_GRAPH_SHAPES")
            .unwrap_or(4)
            .max(1)
    })
}

// SAFETY: a recording is used only through `&mut` (one thread at a time), which is all CUDA asks
// of graph objects (they are not internally synchronized).
unsafe impl Send for CudaRecording {}

/// Panics (naming `op`) when a row's position is past the plane of a full layer's cache: the
/// store would write outside it. Rings wrap.
fn check_plane_positions(op: &str, kvs: &[&mut CudaKv], layer: usize, pos: &[usize]) {
    for (kv, &p) in kvs.iter().zip(pos) {
        let s = &kv.layers[layer].spec;
        assert!(
            s.is_ring() || p < s.slots,
            "{op}: position {p} past the plane of {}",
            s.slots
        );
    }
}

/// Panics with the driver's message: the trait's ops cannot return errors (see the module doc).
fn ck<T>(r: std::result::Result<T, impl std::fmt::Display>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("CUDA {what}: {e}"))
}

fn grow<T: DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, s: &mut CudaSlice<T>, n: usize) {
    if s.len() < n {
        let capturing = gpu.stream.capture_status().ok()
            != Some(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        assert!(
            !capturing,
            "a buffer grew while a decode step was being captured (its first run should have grown it)"
        );
        *s = ck(gpu.stream.alloc_zeros::<T>(n.next_power_of_two()), "alloc");
    }
}

fn cfg1(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(threads).max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// "attn_q" for "blk.7.attn_q.weight".
fn short_name(name: &str) -> &str {
    let n = name.strip_suffix(".weight").unwrap_or(name);
    match n.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, r)| r),
        None => n,
    }
}

/// Widest row the norm kernels serve (NORM_T * NORM_V in norm.cu).
pub const MAX_NORM_WIDTH: usize = 8192;

/// Positions per attention tile (ATT_T in attention.cu).
const ATT_T: usize = 32;

/// How an attention launch splits the work: `n_splits` blocks per (row, KV head, head chunk),
/// each over `split_len` positions, and the group's query heads in `chunks` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnPlan {
    pub n_splits: usize,
    pub split_len: usize,
    pub chunks: usize,
}

/// About two blocks per SM when the batch allows: splits of at least one tile (32 positions),
/// then the `group` query heads of a KV head over several blocks (at least 2 heads each).
/// `count` is the longest visible range of the batch. A decode row's splits (`n_rows` 1) are its
/// plan in any group; a decode group takes its head chunks from this (`rows_chunks`).
pub fn attention_plan(
    count: usize,
    n_rows: usize,
    n_kv: usize,
    group: usize,
    sms: usize,
) -> AttnPlan {
    let base = (n_rows * n_kv).max(1);
    // About 2 x SMs blocks over the (row, KV head) pairs, at most `attn_max_splits` a row.
    let (n_splits, split_len) = row_split(count, solo_splits(base, sms), attn_split_tiles());
    AttnPlan {
        n_splits,
        split_len,
        chunks: head_chunks(base * n_splits, group, sms),
    }
}

/// Chunks of a KV head's `group` query heads, each a block of its own, for a launch of `blocks`
/// (KV head, row, split) triples: doubled while the launch has fewer than 2 blocks an SM and each
/// chunk keeps 2 heads or more. A head's bits do not depend on its chunk.
pub fn head_chunks(blocks: usize, group: usize, sms: usize) -> usize {
    let mut chunks = 1;
    while blocks * chunks < 2 * sms && group.is_multiple_of(chunks * 2) && group / (chunks * 2) >= 2
    {
        chunks *= 2;
    }
    chunks
}

/// The splits a one-row batch asks for (`solo` of `row_split`): about two blocks per SM, at most
/// `attn_max_splits`.
pub fn solo_splits(n_kv: usize, sms: usize) -> usize {
    (2 * sms).div_ceil(n_kv.max(1)).min(attn_max_splits())
}

/// The most splits of one row's attention: `ATTN_MAX_SPLITS`, or `MUSER_ATTN_MAX_SPLITS` (at least 1).
pub fn attn_max_splits() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("MUSER_ATTN_MAX_SPLITS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n >= 1)
            .unwrap_or(ATTN_MAX_SPLITS)
    })
}

/// The most splits of one row's attention (the `solo` of `row_split`): past 48 x 8 tiles
/// (12,288 positions) a row's splits grow longer instead of more numerous. Before (2026-12-04),
/// 2 KV heads on the H200's 132 SMs gave a row up to 132 splits: 65 at depth 16,384 and 129 at
/// 32,768 (a row there sees 16,385 / 32,769 positions or more), and the partials' merge
/// (`attn_rows_combine`) took 21.9 and 39.3 us a layer against 6.4 at 8,192's 33 splits (step
/// trace, llama-glimmer, one row; with 64 splits at 16,384 it took 9.4). H200, llama-glimmer, tg64
/// tokens/s, one call: depth 16,384 142.17 uncapped, 151.61 / 156.97 / 157.23 / 155.63 at 16 /
/// 32 / 48 / 64 splits; depth 32,768 116.46 uncapped, 135.59 / 147.14 / 149.72 / 147.85; depth
/// 8,192 (33 splits with any cap from 33 on) 163.80 uncapped, 161.02 at 16. At 32 splits and
/// depth 32,768 the attention took 20.0 us a layer and the merge 6.5.
pub const ATTN_MAX_SPLITS: usize = 48;

/// A prefill row's plan on the split kernels (`attn_rows_{d}`; the tensor-core kernel takes
/// one split): `row_split(count, PREFILL_SPLITS, PREFILL_TILES)`, of its own position only,
/// floor(tiles / 16) splits, at least 1 and at most 8 (so none shorter than 512 positions). Rows of a 512-token prompt at depth 0
/// take one each, as the chunk's plan gave them before (2026-12-07); deep rows are spread over
/// 8 blocks a (KV head, row), so a serve chunk of a few rows deep in its context fills the GPU;
/// the partials of 512 rows take 512 x n_head x 8 x d floats (34 MB for 32 heads of 64).
pub const PREFILL_SPLITS: usize = 8;
pub const PREFILL_TILES: usize = 16 | SPLIT_LONG | SPLIT_FLOOR;

/// (n_splits, split_len) of a row that sees `count` positions (`solo_split` in attention.cu,
/// the same integer arithmetic) when at most `solo` splits are asked for: one split per tile of
/// ATT_T positions up to T = `min_tiles` splits, past T splits at least T tiles each; splits of
/// whole tiles, none empty. A decode group splits each row as `attention_plan(count, 1, ..)`
/// does (`solo` = `solo_splits`), so a row's attention has the same bits alone or in any group.
///
/// With `SPLIT_FLOOR` set in `min_tiles`, a row past T splits takes floor(tiles / T) of them
/// instead of ceil(tiles / T): no split shorter than T tiles is added for the last few tiles
/// past a multiple of T (`attn_split_tiles`).
pub fn row_split(count: usize, solo: usize, min_tiles: usize) -> (usize, usize) {
    let t = (min_tiles & (SPLIT_FLOOR - 1)).max(1);
    let tiles = count.div_ceil(ATT_T);
    let past = if min_tiles & SPLIT_FLOOR != 0 {
        tiles / t
    } else {
        tiles.div_ceil(t)
    };
    let n = if min_tiles & SPLIT_LONG != 0 {
        solo.min(past)
    } else {
        solo.min(tiles.min(t.max(past)))
    }
    .max(1);
    let len = count.div_ceil(n).div_ceil(ATT_T) * ATT_T;
    (count.div_ceil(len).max(1), len)
}

/// `min_tiles` of `row_split` for every attention launch: `MUSER_ATTN_SPLIT_TILES` (1 to 64),
/// else 8. A decode row over 8192 positions then runs 32 splits of 256 positions per KV head
/// instead of 128 of 64 (each of attn_rows_mma_128's 4 warps one 16-position step, its partial
/// as large as its K/V, and attn_rows_combine merging 128 partials per output). H200,
/// llama-glimmer, tg64 at depth 8192 (same call, with every row cut to at most one split per
/// `min_tiles` tiles): 1 tile 116.28 tokens/s, 4 127.00, 8 127.69, 16 117.89; with this rule
/// (rows up to 8 tiles keep one split per tile) 127.51 against 115.96 for 1 (another call).
///
/// `MUSER_ATTN_SPLIT_ROUND=floor` sets `SPLIT_FLOOR` (row_split).
pub fn attn_split_tiles() -> usize {
    static TILES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *TILES.get_or_init(|| {
        let t = std::env::var("MUSER_ATTN_SPLIT_TILES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|t| (1..=64).contains(t))
            .unwrap_or(8);
        let floor = std::env::var("MUSER_ATTN_SPLIT_ROUND").as_deref() == Ok("floor");
        t | if floor { SPLIT_FLOOR } else { 0 }
    })
}

/// The rounding flag of `row_split`'s `min_tiles` (attention.cu: `SPLIT_FLOOR`).
pub const SPLIT_FLOOR: usize = 1 << 8;

/// `row_split`'s flag for a prefill row (attention.cu: `SPLIT_LONG`): splits of at least T
/// tiles each, at most `solo` of them (short rows are not cut into one tile a split).
pub const SPLIT_LONG: usize = 1 << 9;

/// Whether decode rows' tensor-core attention asks for its first K/V steps before waiting for
/// the kernel before (`MUSER_ATTN_EARLY=0`: after; the same loads, so the same bits).
fn attn_early() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MUSER_ATTN_EARLY").as_deref() != Ok("0"))
}

/// Dynamic shared memory of attn_rows_{d} for G query heads per KV head of width d.
pub fn attention_smem(g: usize, d: usize) -> usize {
    4 * (g * d + ATT_T * (d + 4) + ATT_T * d + g * ATT_T + 3 * g)
}

/// Shared memory of the tensor-core decode attention with `w` merge slots (its warps, or 8 for
/// `attn_rows_mma48_128`): w x 2 stages x 16 V rows of 136 halves (one warp's stages; reused for
/// the merge of the parts' states: w x 16 rows of 136 f32), then w x 16 (max, sum).
pub const fn attn_mma_smem(w: usize) -> usize {
    w * 2 * 16 * 136 * 2 + w * 16 * 8
}

/// Blocks along z of a decode-rows attention launch without clusters (attention.cu:
/// pdl_wait_attn_rows_mma_loop) for `pairs` (KV head, row) pairs of `solo` splits each: as many as one
/// `wave` of resident blocks holds, at least 1 and at most `solo` (each block then takes splits
/// z, z + Z, ..). Before, the grid had `solo` blocks per pair, most of them empty at short
/// depths: 8 KV heads x 32 rows x 33 splits = 8,448 blocks, 14.8 us a layer at 32 streams in the
/// step trace (2026-12-02), against 4.3 at 8 streams.
pub fn attn_loop_splits(solo: usize, pairs: usize, wave: usize) -> usize {
    (wave / pairs.max(1)).clamp(1, solo.max(1))
}

/// The smallest plan (splits, positions per split) on which the 8-warp tensor-core decode
/// attention (`attn_rows_mma8_128`) runs a row on its 8 warps (each warp at least one
/// 16-position step); a row of a smaller plan runs on 4 of them, with the 4-warp kernel's bits.
pub const ATTN_WIDE_PLAN: (usize, usize) = (16, 16 * 8);

/// Whether a decode group of `rows` rows over `n_kv` KV heads, some of whose rows run on 8
/// warps (`attn_wide`), launches `attn_rows_mma48_128` (4 warps a block, each playing two of the
/// 8-warp kernel's warps in turn: the same bits) instead of `attn_rows_mma8_128`: from 8 (KV head,
/// row) pairs, whose wide rows' 16 splits or more give about one 8-warp block per SM or more
/// (two 4-warp blocks share an SM, so one's merge and partial writes overlap the other's loads).
/// `MUSER_ATTN_WIDE4=0`: never; `=1`: for every group of 2 rows or more. H200, llama-glimmer,
/// tg32 tokens/s, one call (2026-12-04), 8-warp blocks against these: depth 8,192, 4 / 8 streams
/// 458.54 / 783.56 against 504.42 / 816.59; depth 4,096, 8 / 32 streams 891.75 / 2,016.00
/// against 904.50 / 2,166.97; one stream 167.23 against 167.38 (always 8 warps).
pub fn attn_wide4(rows: usize, n_kv: usize) -> bool {
    static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let mode = *MODE.get_or_init(|| match std::env::var("MUSER_ATTN_WIDE4").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    });
    rows >= 2 && mode.unwrap_or(rows * n_kv >= ATTN_WIDE4_PAIRS)
}

/// The fewest (KV head, row) pairs of a decode group that runs its wide rows on
/// `attn_rows_mma48_128` (`attn_wide4`).
pub const ATTN_WIDE4_PAIRS: usize = 8;

/// The most splits of a decode row merged inside its attention launch (the cluster size of
/// `attn_rows_mma_fin8_128`).
pub const ATTN_CLUSTER_SPLITS: usize = 8;

/// The most rows of a decode step whose attention merges its splits in clusters
/// (`MUSER_ATTN_CLUSTER_ROWS`, default 1). H200, llama-glimmer, tg64 tokens/s at 1 / 2 / 8 / 16
/// streams, clusters for every group against attn_rows_combine, alternated in one call
/// (2026-12-01): 170.57 / 240.46 / 921.65 / 1288.44 and 169.97 / 240.57 / 923.52 / 1284.14
/// against 168.06 / 242.34 / 932.47 / 1366.57 and 168.59 / 242.03 / 930.69 / 1278.22: one row
/// gains 1.2%, groups lose 0.6-6% (not from the cluster scheduling: the combine over a grid of 8
/// splits instead of 132 lost as much, 241.04 / 919.84 / 1304.10, with no gain for one row).
pub fn attn_cluster_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("MUSER_ATTN_CLUSTER_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    })
}

/// Whether a decode-group row split into `n_splits` of `split_len` positions runs on 8 warps
/// (`ATTN_WIDE_PLAN`; the kernel's `nw`), unless `MUSER_ATTN_MMA_WARPS=4`.
pub fn attn_wide(n_splits: usize, split_len: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    n_splits >= ATTN_WIDE_PLAN.0
        && split_len >= ATTN_WIDE_PLAN.1
        && *ON.get_or_init(|| std::env::var("MUSER_ATTN_MMA_WARPS").as_deref() != Ok("4"))
}

/// Positions a row at position `p` sees in a layer of geometry `spec` (its window, if any).
fn visible(spec: &KvLayerSpec, p: usize) -> usize {
    p + 1 - spec.window.map_or(0, |w| (p + 1).saturating_sub(w))
}

/// Whether the tensor-core decode attention serves a head width `d` with `g` query heads per
/// KV head (one m16n8k16 row block of heads).
pub fn mma_attention_fits(d: usize, g: usize) -> bool {
    d == 128 && (1..=16).contains(&g)
}

/// The attn_rows_partial instantiation (decode groups) for a head width, if any.
pub fn attention_rows_kernel(head_dim: usize) -> Option<&'static str> {
    match head_dim {
        64 => Some("attn_rows_64"),
        128 => Some("attn_rows_128"),
        256 => Some("attn_rows_256"),
        _ => None,
    }
}

impl CudaBackend {
    /// Opens GPU `ordinal` and compiles the kernels. No driver, no device or no NVRTC is an
    /// error, never a crash.
    pub fn new(ordinal: usize) -> std::result::Result<CudaBackend, CudaError> {
        if let Ok(v) = std::env::var("MUSER_CUDA_ABLATE") {
            eprintln!("warning: MUSER_CUDA_ABLATE={v}: these ops are skipped; outputs are wrong (timing only)");
        }
        let gpu = Gpu::new(ordinal)?;
        let ws = Workspace {
            act: gpu.act_scratch(32)?,
            tokens: gpu.stream.alloc_zeros(1)?,
            tokens_host: Vec::new(),
            o_part: gpu.stream.alloc_zeros(1)?,
            ml_part: gpu.stream.alloc_zeros(1)?,
            argmax: gpu.stream.alloc_zeros(1)?,
            topk_part: gpu.stream.alloc_zeros(1)?,
            topk_out: gpu.stream.alloc_zeros(1)?,
            lm_out: gpu.stream.alloc_zeros(1)?,
        };
        let tables = || -> std::result::Result<RowTables, CudaError> {
            Ok(RowTables {
                pos: Vec::new(),
                pos_dev: gpu.stream.alloc_zeros(1)?,
                n: 0,
                kv: Vec::new(),
                kv_dev: gpu.stream.alloc_zeros(1)?,
            })
        };
        let (rows, prefill_rows) = (tables()?, tables()?);
        Ok(CudaBackend {
            gpu,
            ws: Mutex::new(ws),
            rows: Mutex::new(rows),
            prefill_rows: Mutex::new(prefill_rows),
            upload: Mutex::new(None),
            profile: Mutex::new(None),
            last_graph: Mutex::new(None),
            step_counts: Default::default(),
            fused_act: Mutex::new(None),
            fuse_quant: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_FUSED_QUANT").map_or(true, |v| v != "0"),
            ),
            attn_mma: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_ATTN_MMA").map_or(true, |v| v != "0"),
            ),
            attn_cluster: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_ATTN_CLUSTER").map_or(true, |v| v != "0"),
            ),
            qkv_regs: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_QKV_REGS").map_or(true, |v| v != "0"),
            ),
            graphs: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            ),
            ablate: crate::matvec::ablated_names().to_vec(),
            staging: Mutex::new(None),
            pinned: Default::default(),
            pinned_on: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_PINNED_LOGITS").map_or(true, |v| v != "0"),
            ),
            pinned_reads: Default::default(),
            lm: lmhead::LmChunks::from_env(),
            lm_reads: Default::default(),
        })
    }

    /// The first `n` values of `buf` copied into the page-locked staging buffer (grown to hold
    /// them), then `f(at, values)` on the host for each piece of them (values at .. of `buf`, in
    /// order). Reads of at least `READ_PIPELINE_MIN` bytes copy in `read_chunks()` pieces, each
    /// handed to `f` as soon as its own copy has landed, so the host's work on one piece runs
    /// under the copy of the next.
    fn read_staged(&self, buf: &CudaBuf, n: usize, f: impl FnMut(usize, &[f32])) {
        self.read_staged_at(buf, 0, n, f)
    }

    /// `read_staged` of the `n` values of `buf` from value `first` on (`at` still counts from
    /// `first`): windows of at most `STAGED_READ_MAX` bytes one after another, so the
    /// page-locked buffer stays that size whatever the read (a decode group's logits past 80
    /// rows of a 202k vocabulary, or a prompt's at every position).
    fn read_staged_at(
        &self,
        buf: &CudaBuf,
        first: usize,
        n: usize,
        mut f: impl FnMut(usize, &[f32]),
    ) {
        let window = STAGED_READ_MAX / 4;
        for w in (0..n).step_by(window) {
            let m = window.min(n - w);
            self.read_window(buf, first + w, m, |at, src| f(w + at, src));
        }
    }

    /// One window of `read_staged_at` (`n` at most `STAGED_READ_MAX` bytes).
    fn read_window(&self, buf: &CudaBuf, first: usize, n: usize, mut f: impl FnMut(usize, &[f32])) {
        debug_assert!(n * 4 <= STAGED_READ_MAX);
        assert!(
            first + n <= buf.rows * buf.cols,
            "read: values {first}..{} of a buffer of {}",
            first + n,
            buf.rows * buf.cols
        );
        let mut st = self.staging.lock().unwrap();
        if st.as_ref().is_none_or(|p| p.len() < n) {
            // The old buffer freed first.
            *st = None;
            // SAFETY: page-locked host memory, flags 0 (not write-combined: the host reads it);
            // its values are read only after the copy into it has completed (below).
            let len = n.next_power_of_two().min(STAGED_READ_MAX / 4);
            let p = unsafe { self.gpu.ctx.alloc_pinned_with_flags::<f32>(len, 0) };
            *st = Some(ck(p, "alloc page-locked read buffer"));
        }
        let host = ck(st.as_mut().unwrap().as_mut_slice(), "read buffer");
        let dst = &mut host[..n];
        let pieces = if n * 4 >= READ_PIPELINE_MIN {
            read_chunks()
        } else {
            1
        };
        let step = n.div_ceil(pieces).next_multiple_of(1 << 14).max(1 << 14);
        let mut landed = Vec::with_capacity(pieces);
        for at in (0..n).step_by(step) {
            let end = (at + step).min(n);
            // SAFETY: buf holds at least n values (its rows x cols); dst[at..end] is page-locked
            // memory that nothing else uses while the copy runs (the pieces are disjoint), and
            // it is read only after the event recorded behind its copy has completed.
            ck(
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        &mut dst[at..end],
                        self.p(&buf.data) + ((first + at) * 4) as u64,
                        self.gpu.stream.cu_stream(),
                    )
                },
                "read buffer",
            );
            landed.push((
                at,
                end,
                ck(self.gpu.stream.record_event(None), "read buffer"),
            ));
        }
        for (at, end, ev) in landed {
            ck(ev.synchronize(), "read buffer");
            f(at, &dst[at..end]);
        }
    }

    /// Copies values of `buf` straight into host memory this backend page-locked (`host_buf`):
    /// each part (its first value's index in `buf`, the destination) by its own DMA, then one
    /// wait for them all. Returns false, having copied nothing, unless every destination lies in
    /// such memory.
    fn read_pinned(&self, buf: &CudaBuf, parts: &mut [(usize, &mut [f32])]) -> bool {
        if parts.is_empty() || !parts.iter().all(|(_, d)| self.pinned.covers(d)) {
            return false;
        }
        for (first, dst) in parts.iter() {
            assert!(
                *first + dst.len() <= buf.rows * buf.cols,
                "read: values {first}..{} of a buffer of {}",
                *first + dst.len(),
                buf.rows * buf.cols
            );
        }
        if self.lm_read(self.p(&buf.data), buf.rows * buf.cols, parts) {
            self.pinned_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return true;
        }
        for (first, dst) in parts.iter_mut() {
            // SAFETY: the source values lie in buf (checked above); dst is page-locked memory
            // borrowed mutably for this call, and the stream is synchronized before it returns,
            // so nothing reads dst while the copy writes it.
            ck(
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        dst,
                        self.p(&buf.data) + (*first * 4) as u64,
                        self.gpu.stream.cu_stream(),
                    )
                },
                "read buffer",
            );
        }
        ck(self.gpu.stream.synchronize(), "read buffer");
        self.pinned_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// Whether `host_buf` hands out page-locked memory (`MUSER_CUDA_PINNED_LOGITS=0` turns it off).
    pub fn pinned_logits(&self) -> bool {
        self.pinned_on.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Sets `pinned_logits` for the `host_buf`s allocated from now on (`muser check`).
    pub fn set_pinned_logits(&self, on: bool) {
        self.pinned_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }
    /// Reads so far that went straight into page-locked `host_buf`s.
    pub fn pinned_reads(&self) -> u64 {
        self.pinned_reads.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Of `pinned_reads`, those of a chunked LM head's logits, chunk by chunk (`lmhead`).
    pub fn lm_reads(&self) -> u64 {
        self.lm_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Shows a progress bar (on a terminal) while `total_bytes` of weights upload.
    pub fn with_upload_progress(self, total_bytes: u64) -> CudaBackend {
        let pb = muser_engine::backend::weights_progress("uploading weights", total_bytes);
        *self.upload.lock().unwrap() = Some(pb);
        self
    }

    fn kernel(&self, name: &str) -> &cudarc::driver::CudaFunction {
        ck(self.gpu.kernel(name), "kernel lookup")
    }

    fn p<T>(&self, s: &CudaSlice<T>) -> u64 {
        dptr(&self.gpu, s)
    }

    /// (kernels, kernel-to-kernel edges, programmatic edges) of the last decode step captured.
    pub fn last_graph(&self) -> Option<(u64, usize, usize)> {
        *self.last_graph.lock().unwrap()
    }

    /// Whether decode steps are recorded and replayed as graphs with programmatic edges.
    pub fn pdl(&self) -> bool {
        pdl_enabled(&self.gpu)
    }

    /// Whether decode attention runs on the tensor cores where it fits (`MUSER_ATTN_MMA=0`: no).
    pub fn attn_mma(&self) -> bool {
        self.attn_mma.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn set_attn_mma(&self, on: bool) {
        self.attn_mma
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether short decode rows merge their attention splits inside the attention launch
    /// (`rows_cluster`; `MUSER_ATTN_CLUSTER=0`: no, attn_rows_combine merges every row).
    pub fn attn_cluster(&self) -> bool {
        self.attn_cluster.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn set_attn_cluster(&self, on: bool) {
        self.attn_cluster
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether `qkv_rows` keeps each head in registers between its QK norm, rotation and KV
    /// store (`MUSER_CUDA_QKV_REGS=0`: no, each step reads what the one before wrote; the same
    /// bits either way, which `muser check` compares).
    pub fn qkv_regs(&self) -> bool {
        self.qkv_regs.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn set_qkv_regs(&self, on: bool) {
        self.qkv_regs
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Opens (`on`) or closes the profiler's capture range (`cuProfilerStart` / `cuProfilerStop`)
    /// after the work queued so far, so a profiler started with its capture off (Nsight Compute's
    /// `--profile-from-start off`) sees only what runs in between: `muser bench` brackets its
    /// timed decode steps when `MUSER_PROFILE_DECODE=1`, so a kernel the prefill also launches
    /// can be profiled in decode only. Outside a profiler it does nothing.
    pub fn profiler_range(&self, on: bool) -> Result<(), String> {
        self.gpu
            .stream
            .synchronize()
            .map_err(|e| format!("profiler range: {e}"))?;
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(|e| format!("profiler range: {e}"))?;
        // SAFETY: the context is current on this thread and the stream is idle; both calls take
        // no arguments and only switch the profiler's capture.
        let r = unsafe {
            if on {
                cudarc::driver::sys::cuProfilerStart()
            } else {
                cudarc::driver::sys::cuProfilerStop()
            }
        };
        r.result().map_err(|e| format!("profiler range: {e:?}"))
    }

    /// Whether decode steps are recorded and replayed as graphs.
    pub fn graphs(&self) -> bool {
        self.graphs.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Turns graph recording of decode steps on or off (recordings made so far are kept, and
    /// replayed again once it is back on).
    pub fn set_graphs(&self, on: bool) {
        self.graphs.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts (or stops) timing every op: each op then synchronizes before and after itself, so
    /// the times include one launch latency each but no overlap with neighbours.
    pub fn set_profiling(&self, on: bool) {
        *self.profile.lock().unwrap() = on.then(std::collections::BTreeMap::new);
    }

    /// (op, calls, seconds) since profiling started, slowest first.
    pub fn profile_report(&self) -> Vec<(String, u64, f64)> {
        let mut v: Vec<(String, u64, f64)> = self
            .profile
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .map(|(k, &(n, s))| (k.clone(), n, s))
            .collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    /// Runs op `f` (timed when profiling). Every op but the ones that may read a fused
    /// quantization (`timed_reader`) ends the life of one (`fused_act`).
    /// Whether `op` is left out of the steps (`ablate`).
    fn ablated(&self, op: &str) -> bool {
        self.ablate.iter().any(|a| a == op)
    }

    fn timed<R>(&self, op: impl FnOnce() -> String, f: impl FnOnce() -> R) -> R {
        *self.fused_act.lock().unwrap() = None;
        self.timed_reader(op, f)
    }

    /// `timed` for the matmuls, which may use the fused quantization of their input.
    fn timed_reader<R>(&self, op: impl FnOnce() -> String, f: impl FnOnce() -> R) -> R {
        // Any op may write a buffer a chunked LM head left its logits in (`lmhead`); lm_head
        // itself sets its plan again inside `f`.
        self.lm_forget();
        if self.profile.lock().unwrap().is_none() {
            return f();
        }
        self.synchronize();
        let t = std::time::Instant::now();
        let r = f();
        self.synchronize();
        let secs = t.elapsed().as_secs_f64();
        if let Some(m) = self.profile.lock().unwrap().as_mut() {
            let e = m.entry(op()).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += secs;
        }
        r
    }

    /// Waits for all queued work (for timing).
    pub fn synchronize(&self) {
        ck(self.gpu.stream.synchronize(), "synchronize");
    }

    /// Quantizes the `n` f32 values at `x` (rows of width `k`) for the kernels of `types`.
    /// Skipped when the scratch already holds these values' quantization in the layout the
    /// kernels of `types` read (row-major Q8_K from the op before; `fused_act`).
    fn quantize_for(&self, ws: &mut Workspace, x: u64, n: usize, k: usize, types: &[GgmlType]) {
        let fused = self.fused_act.lock().unwrap().take();
        if self.ablated("quantize") {
            return;
        }
        if fused == Some((x, n, k)) && crate::matvec::reads_row_major_q8_k(n / k, k, types) {
            ws.act.kmajor = false;
            return;
        }
        ck(
            self.gpu.quantize_act(x, n, k, types, &mut ws.act),
            "quantize activation",
        );
    }

    /// Uploads `tokens` to the workspace unless they are the ones it holds.
    fn upload_tokens(&self, ws: &mut Workspace, tokens: &[u32]) {
        if ws.tokens_host != tokens {
            grow(&self.gpu, &mut ws.tokens, tokens.len());
            ck(
                self.gpu.stream.memcpy_htod(tokens, &mut ws.tokens),
                "upload tokens",
            );
            ws.tokens_host = tokens.to_vec();
        }
    }

    /// Attention head chunks of a decode group's layer of geometry `spec` at positions `pos`:
    /// a plan as a one-row batch over the longest visible range would get. Chunks change which
    /// block computes a head, never its arithmetic.
    fn rows_chunks(&self, spec: &KvLayerSpec, pos: &[usize]) -> usize {
        let count = pos.iter().map(|&p| visible(spec, p)).max().unwrap_or(1);
        let g = spec.n_head / spec.n_head_kv.max(1);
        attention_plan(count, pos.len(), spec.n_head_kv, g, self.gpu.sms).chunks
    }

    /// Whether a decode step's attention over a layer of geometry `spec` at positions `pos`
    /// runs as `attn_rows_mma_fin8_128`: the tensor-core
    /// kernel with 16 query heads of 128 per KV head on a GPU with thread-block clusters (sm_90
    /// or newer), at most `attn_cluster_rows` rows, and every row's own plan at most
    /// `ATTN_CLUSTER_SPLITS` splits (with 8 tiles a split from the ninth: up to 2,048
    /// positions), so each (KV head, row) is one cluster that merges its splits itself.
    fn rows_cluster(&self, spec: &KvLayerSpec, pos: &[usize]) -> bool {
        let solo = solo_splits(spec.n_head_kv, self.gpu.sms);
        let cc = self.gpu.cc();
        self.attn_cluster()
            && pos.len() <= attn_cluster_rows()
            && self.attn_mma()
            && cc >= 90
            && spec.head_dim == 128
            && spec.n_head == 16 * spec.n_head_kv
            && pos.iter().all(|&p| {
                row_split(visible(spec, p), solo, attn_split_tiles()).0 <= ATTN_CLUSTER_SPLITS
            })
    }

    /// Whether a decode group's tensor-core attention over a layer of geometry `spec` at
    /// positions `pos` launches 8 warps per block: whether any row's plan (the one it gets
    /// alone) is `attn_wide`.
    fn rows_wide(&self, spec: &KvLayerSpec, pos: &[usize]) -> bool {
        let solo = solo_splits(spec.n_head_kv, self.gpu.sms);
        pos.iter().any(|&p| {
            let (n, len) = row_split(visible(spec, p), solo, attn_split_tiles());
            attn_wide(n, len)
        })
    }

    /// The shape of a decode step at positions `pos` over caches `kvs` (see `StepKey`).
    fn step_key(&self, kvs: &[&mut CudaKv], pos: &[usize]) -> StepKey {
        let (chunks, wide) = kvs.first().map_or((Vec::new(), Vec::new()), |kv| {
            kv.layers
                .iter()
                .map(|l| (self.rows_chunks(&l.spec, pos), self.rows_wide(&l.spec, pos)))
                .unzip()
        });
        let cluster = kvs.first().map_or(Vec::new(), |kv| {
            kv.layers
                .iter()
                .map(|l| self.rows_cluster(&l.spec, pos))
                .collect()
        });
        let ws = self.ws.lock().unwrap();
        let t = self.rows.lock().unwrap();
        let [cv, cnt, blob] = self.gpu.split_key();
        let buffers = vec![
            cv,
            cnt,
            blob,
            self.p(&ws.act.q),
            self.p(&ws.act.ds),
            self.p(&ws.act.bs),
            ws.act.cap as u64,
            self.p(&ws.tokens),
            self.p(&ws.o_part),
            self.p(&ws.ml_part),
            self.p(&t.pos_dev),
            self.p(&t.kv_dev),
            self.p(&ws.lm_out),
            self.lm_chunks_now() as u64,
        ];
        StepKey {
            rows: pos.len(),
            chunks,
            wide,
            cluster,
            buffers,
        }
    }

    /// Device address of the group's positions (`[n]` i32), uploaded when they changed.
    fn positions(&self, pos: &[usize]) -> u64 {
        let mut t = self.rows.lock().unwrap();
        self.upload_positions(&mut t, pos);
        self.p(&t.pos_dev)
    }

    fn upload_positions(&self, t: &mut RowTables, pos: &[usize]) {
        let same =
            t.pos.len() == pos.len() && t.pos.iter().zip(pos).all(|(&a, &b)| a as usize == b);
        if !same {
            t.pos = pos.iter().map(|&p| p as i32).collect();
            grow(&self.gpu, &mut t.pos_dev, pos.len());
            let RowTables { pos, pos_dev, .. } = t;
            ck(
                self.gpu.stream.memcpy_htod(pos, pos_dev),
                "upload positions",
            );
        }
    }

    /// Device addresses of the group's positions (`[n]` i32) and of layer `layer`'s per-row cache
    /// table (`[n]` RowKv), uploading either only when it differs from the last group's.
    fn row_tables(&self, kvs: &[&mut CudaKv], layer: usize, pos: &[usize]) -> (u64, u64) {
        let mut t = self.rows.lock().unwrap();
        let n = pos.len();
        self.upload_positions(&mut t, pos);
        let entry = |kv: &CudaKv, l: usize| {
            let c = &kv.layers[l];
            [self.p(&c.k), self.p(&c.v), c.spec.slots as u64]
        };
        let layers = kvs.first().map_or(0, |kv| kv.layers.len());
        let at = |l: usize, r: usize| (l * n + r) * 3;
        let same_kv = t.n == n
            && t.kv.len() == layers * n * 3
            && kvs
                .iter()
                .enumerate()
                .all(|(r, kv)| t.kv[at(layer, r)..at(layer, r) + 3] == entry(kv, layer));
        if !same_kv {
            let mut tab = vec![0u64; layers * n * 3];
            for l in 0..layers {
                for (r, kv) in kvs.iter().enumerate() {
                    assert_eq!(kv.layers.len(), layers, "a decode group mixes models");
                    tab[at(l, r)..at(l, r) + 3].copy_from_slice(&entry(kv, l));
                }
            }
            grow(&self.gpu, &mut t.kv_dev, tab.len());
            ck(
                self.gpu.stream.memcpy_htod(&tab, &mut t.kv_dev),
                "upload KV table",
            );
            t.kv = tab;
            t.n = n;
        }
        (
            self.p(&t.pos_dev),
            self.p(&t.kv_dev) + (at(layer, 0) * 8) as u64,
        )
    }

    /// Device addresses of the positions pos0 .. pos0 + n - 1 and of layer `layer`'s per-row cache
    /// table, every row on `kv`: a prefill chunk as a group of rows of one sequence (tables of
    /// their own, so a recorded decode step's tables are never overwritten).
    fn prefill_tables(&self, kv: &CudaKv, layer: usize, pos0: usize, n: usize) -> (u64, u64) {
        let mut t = self.prefill_rows.lock().unwrap();
        if t.pos.len() != n || t.pos.first() != Some(&(pos0 as i32)) {
            let pos: Vec<usize> = (pos0..pos0 + n).collect();
            self.upload_positions(&mut t, &pos);
        }
        // One entry per layer (every row the same); the table is rebuilt when they change.
        let entries: Vec<u64> = kv
            .layers
            .iter()
            .flat_map(|c| [self.p(&c.k), self.p(&c.v), c.spec.slots as u64])
            .collect();
        if t.n != n || t.kv != entries {
            let tab: Vec<u64> = entries
                .chunks(3)
                .flat_map(|e| std::iter::repeat_n(e, n).flatten().copied())
                .collect();
            grow(&self.gpu, &mut t.kv_dev, tab.len());
            ck(
                self.gpu.stream.memcpy_htod(&tab, &mut t.kv_dev),
                "upload KV table",
            );
            t.kv = entries;
            t.n = n;
        }
        (
            self.p(&t.pos_dev),
            self.p(&t.kv_dev) + (layer * n * 3 * 8) as u64,
        )
    }

    /// The tensor-core attention over the rows of `a` (query `qp`, [n][n_head * 128] f32): one
    /// block per (KV head, row, split), each row split as it would be alone; 8 warps per block
    /// (`attn_rows_mma8_128`) when `wide`, else 4 (`attn_rows_mma_128`); a wide group of
    /// `attn_wide4` rows 4 warps with the 8-warp kernel's bits (`attn_rows_mma48_128`). With
    /// `fin` (the output, gate and quantization addresses of `attn_rows_mma_fin`),
    /// `attn_rows_mma_fin8_128`: the splits merged in clusters of `ATTN_CLUSTER_SPLITS` blocks.
    fn attn_rows_mma(&self, a: &RowsAttn, qp: u64, scale: f32, wide: bool, fin: Option<[u64; 5]>) {
        // (warps, kernel, splits, merge slots)
        let (w, name, splits, slots) = match (fin, wide) {
            (Some(_), _) => (4, "attn_rows_mma_fin8_128", ATTN_CLUSTER_SPLITS, 4),
            (None, true) if attn_wide4(a.n, a.n_kv) => (4, "attn_rows_mma48_128", a.splits, 8),
            (None, true) => (8, "attn_rows_mma8_128", a.splits, 8),
            (None, false) => (4, "attn_rows_mma_128", a.splits, 4),
        };
        let smem = attn_mma_smem(slots);
        let f = ck(self.gpu.kernel_smem(name, smem), "attention shared memory");
        let splits = if fin.is_some() {
            splits
        } else {
            // One wave of blocks, each taking its (KV head, row)'s splits in turn.
            let per_sm = ck(
                self.gpu.blocks_per_sm(name, 32 * w as u32, smem),
                "attention occupancy",
            );
            attn_loop_splits(splits, a.n_kv * a.n, self.gpu.sms * per_sm as usize)
        };
        let cfg = LaunchConfig {
            grid_dim: (a.n_kv as u32, a.n as u32, splits as u32),
            block_dim: (32 * w as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (nh, nk, window, ring, so, mt) = (
            a.n_head as i32,
            a.n_kv as i32,
            a.window as i32,
            i32::from(a.ring),
            a.solo as i32,
            a.min_tiles as i32,
        );
        let early = i32::from(a.early);
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&qp)
            .arg(&a.tab)
            .arg(&a.pos)
            .arg(&a.parts.0)
            .arg(&a.parts.1)
            .arg(&nh)
            .arg(&nk)
            .arg(&window)
            .arg(&ring)
            .arg(&scale)
            .arg(&so)
            .arg(&mt)
            .arg(&early);
        if let Some(out) = &fin {
            for v in out {
                b.arg(v);
            }
        }
        // SAFETY: the partials hold n * n_head * splits entries; each row reads its own cache
        // within its slots. With fin: every row has at most ATTN_CLUSTER_SPLITS splits
        // (rows_cluster); out (and gate) are [n][n_head * 128]; q, ds, bs (when fused) the
        // quantization of n * n_head * 128 values (act_scratch).
        ck(unsafe { b.launch(cfg) }, "attn_rows_mma");
    }

    /// The split attention (`attn_rows_{d}`, kernel `name`) over the rows of `a` (query `qp`,
    /// [n][n_head * d] f32): one block per (KV head, chunk of `g_block` of its query heads, row,
    /// split), each row split by its own plan (`row_split(count, a.solo, a.min_tiles)`); a row's
    /// bits depend on neither the chunks nor the other rows.
    fn attn_rows_split(
        &self,
        a: &RowsAttn,
        name: &str,
        d: usize,
        g_block: usize,
        qp: u64,
        scale: f32,
    ) {
        let smem = attention_smem(g_block, d);
        let f = ck(self.gpu.kernel_smem(name, smem), "attention shared memory");
        let chunks = a.n_head / a.n_kv / g_block;
        let (nh, nk, gb, window, ring, so, mt) = (
            a.n_head as i32,
            a.n_kv as i32,
            g_block as i32,
            a.window as i32,
            i32::from(a.ring),
            a.solo as i32,
            a.min_tiles as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: ((a.n_kv * chunks) as u32, a.n as u32, a.splits as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&qp)
            .arg(&a.tab)
            .arg(&a.pos)
            .arg(&a.parts.0)
            .arg(&a.parts.1)
            .arg(&nh)
            .arg(&nk)
            .arg(&gb)
            .arg(&window)
            .arg(&ring)
            .arg(&scale)
            .arg(&so)
            .arg(&mt);
        // SAFETY: the partials hold n * n_head * splits entries (splits at least any row's own);
        // each row reads its own cache within its slots.
        ck(unsafe { b.launch(cfg) }, "attn_rows");
    }

    /// attn_rows_combine: each row's own splits of `a`'s partials merged into `outp` ([n][n_head *
    /// d]), times sigmoid(gate) where `gp` is not 0.
    /// With the fused quantization on (`fuse_quant`) and heads that tile Q8_K blocks, blocks of
    /// 256 threads also quantize the output into `ws`'s activation scratch for the attn_output
    /// matmul (`fused_act`, set here: call it last in its op).
    fn attn_rows_combine(&self, ws: &mut Workspace, a: &RowsAttn, d: usize, gp: u64, outp: u64) {
        let width = a.n_head * d;
        let (fuse, (q, ds, bs)) = self.attn_fused_quant(ws, a, d);
        let threads = if fuse { 256 } else { d };
        let cfg = LaunchConfig {
            grid_dim: ((width / threads) as u32, a.n as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (nh, ms, dd, window, so, mt) = (
            a.n_head as i32,
            a.splits as i32,
            d as i32,
            a.window as i32,
            a.solo as i32,
            a.min_tiles as i32,
        );
        let f = self.kernel("attn_rows_combine");
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(&a.parts.0)
            .arg(&a.parts.1)
            .arg(&outp)
            .arg(&gp)
            .arg(&a.pos)
            .arg(&nh)
            .arg(&ms)
            .arg(&dd)
            .arg(&window)
            .arg(&so)
            .arg(&mt)
            .arg(&q)
            .arg(&ds)
            .arg(&bs);
        let (xblob, nt) = self.fused_mmw(ws, fuse, a.n, width);
        b.arg(&xblob).arg(&nt);
        // SAFETY: the partials hold n * n_head * splits entries, of which row t reads its own
        // splits; out (and gate) are [n][n_head * d]; q, ds, bs (when fused) the quantization of
        // n * n_head * d values (act_scratch), xblob (when not 0) its mmw regions (mmw_prepack).
        ck(unsafe { b.launch(cfg) }, "attn_rows_combine");
        if fuse {
            *self.fused_act.lock().unwrap() = Some((outp, a.n * width, width));
        }
    }

    /// With the fused quantization (`fuse`) of an activation of `ncols` columns of width `k`
    /// into `ws`'s scratch, its `mmw_*` layout too where a wide group reads it
    /// (`Gpu::mmw_prepack`, recorded in `ws.act.packed`): the producer kernel's `xblob, nt`
    /// arguments ((0, 0): none).
    fn fused_mmw(&self, ws: &mut Workspace, fuse: bool, ncols: usize, k: usize) -> (u64, i32) {
        if !fuse {
            return (0, 0);
        }
        ws.act.packed = ck(self.gpu.mmw_prepack(ncols, k), "mmw activation");
        crate::matvec::packed_args(ws.act.packed)
    }

    /// Whether the attention's last launch also quantizes its output for the attn_output
    /// matmul (the fused quantization on, heads that tile Q8_K blocks), and where (`ws`'s
    /// activation scratch, grown to fit; zeros when not).
    fn attn_fused_quant(
        &self,
        ws: &mut Workspace,
        a: &RowsAttn,
        d: usize,
    ) -> (bool, (u64, u64, u64)) {
        let width = a.n_head * d;
        let fuse = self.fuse_quant.load(std::sync::atomic::Ordering::Relaxed)
            && 256 % d == 0
            && width.is_multiple_of(256);
        if fuse && a.n * width > ws.act.cap {
            ws.act = ck(self.gpu.act_scratch(a.n * width), "activation scratch");
        }
        if fuse {
            (
                true,
                (self.p(&ws.act.q), self.p(&ws.act.ds), self.p(&ws.act.bs)),
            )
        } else {
            (false, (0, 0, 0))
        }
    }

    /// attn_rows_mma_fin8_128 (`rows_cluster`): the tensor-core attention of every row of `a`
    /// with its splits merged inside each (KV head, row) cluster of 8 blocks, the gate (`gp`,
    /// when not 0) applied, written to `outp` ([n][n_head * 128]) and, with the fused
    /// quantization, to `ws`'s activation scratch (`fused_act`, set here: call it last in its op).
    #[allow(clippy::too_many_arguments)]
    fn attn_rows_mma_fin(
        &self,
        ws: &mut Workspace,
        a: &RowsAttn,
        qp: u64,
        scale: f32,
        gp: u64,
        outp: u64,
    ) {
        const D: usize = 128;
        let width = a.n_head * D;
        let (fuse, (q, ds, bs)) = self.attn_fused_quant(ws, a, D);
        self.attn_rows_mma(a, qp, scale, false, Some([outp, gp, q, ds, bs]));
        if fuse {
            ws.act.packed = None;
            *self.fused_act.lock().unwrap() = Some((outp, a.n * width, width));
        }
    }

    /// RoPE over every row of x: row t at position pos0 + t, or pos[t] when `pos` (a device
    /// address of `[rows]` i32) is not null.
    fn launch_rope(
        &self,
        x: &mut CudaBuf,
        head_dim: usize,
        rope: &RopeParams,
        pos0: usize,
        pos: u64,
    ) {
        let n = x.rows * (rope.n_rot / 2);
        let xp = self.p(&x.data);
        let (rows, cols, hd, nrot, p0) = (
            x.rows as i32,
            x.cols as i32,
            head_dim as i32,
            rope.n_rot as i32,
            pos0 as i32,
        );
        let neox = i32::from(rope.style == RopeStyle::Neox);
        let mut b = self.gpu.stream.launch_builder(self.kernel("rope"));
        b.arg(&xp)
            .arg(&rows)
            .arg(&cols)
            .arg(&hd)
            .arg(&nrot)
            .arg(&p0)
            .arg(&pos)
            .arg(&rope.freq_base)
            .arg(&neox);
        // SAFETY: one thread per (row, pair), each rotating that pair of every head of its row of
        // x ([rows][cols]); pos is null or holds rows positions.
        ck(unsafe { b.launch(cfg1(n, 256)) }, "rope");
    }

    /// Merges the `n_splits` partials of each (row, head) into `out` (`[rows][n_head * d]`).
    fn upload_progress(&self, bytes: usize) {
        if let Some(pb) = self.upload.lock().unwrap().as_ref() {
            pb.inc(bytes as u64);
            if pb.position() >= pb.length().unwrap_or(0) {
                pb.finish_and_clear();
            }
        }
    }
}

impl Backend for CudaBackend {
    type Weight = CudaWeight;
    type Buf = CudaBuf;
    type Kv = CudaKv;
    type Recording = CudaRecording;

    fn decode_step(
        &self,
        rec: &mut Option<CudaRecording>,
        tokens: &[u32],
        kvs: &mut [&mut CudaKv],
        pos: &[usize],
        f: impl FnOnce(&mut [&mut CudaKv]),
    ) {
        // Decode steps never run on the prefill-only kernels (mmh.rs), recorded or not.
        let _decoding = decoding_flag(&self.gpu);
        // A replayed step writes buffers and the activation scratch with no op on the host.
        *self.fused_act.lock().unwrap() = None;
        use std::sync::atomic::Ordering::Relaxed;
        let [replayed, recorded, direct] = &self.step_counts;
        if !self.graphs() || self.profile.lock().unwrap().is_some() {
            direct.fetch_add(1, Relaxed);
            return f(kvs);
        }
        // The step's inputs go to the device tables first; the ops then find them there and
        // upload nothing (a capture must contain launches only).
        self.upload_tokens(&mut self.ws.lock().unwrap(), tokens);
        if !kvs.is_empty() {
            self.row_tables(kvs, 0, pos);
        }
        let key = self.step_key(kvs, pos);
        let rec = rec.get_or_insert_with(|| CudaRecording {
            shapes: Vec::new(),
            clock: 0,
        });
        rec.clock += 1;
        let Some(r) = rec.shapes.iter_mut().find(|r| r.key == key) else {
            // A new shape: run op by op (growing what it needs); capture the next time.
            direct.fetch_add(1, Relaxed);
            f(kvs);
            let key = self.step_key(kvs, pos);
            if let Some(r) = rec.shapes.iter_mut().find(|r| r.key == key) {
                // It grew the buffers into a shape already seen.
                r.used = rec.clock;
                return;
            }
            if rec.shapes.len() >= graph_shapes() {
                let lru = (0..rec.shapes.len())
                    .min_by_key(|&i| rec.shapes[i].used)
                    .expect("a shape is kept");
                rec.shapes.swap_remove(lru);
            }
            rec.shapes.push(Shape {
                key,
                graph: None,
                launches: Vec::new(),
                used: rec.clock,
                lm: None,
            });
            return;
        };
        r.used = rec.clock;
        if let Some(g) = &r.graph {
            if let Some(t) = &self.gpu.trace {
                ck(t.before_launch(&self.gpu.stream), "step trace");
            }
            ck(g.launch(), "decode step graph");
            self.lm_replayed(r.lm.clone());
            self.gpu.add_dispatches(&r.launches);
            replayed.fetch_add(1, Relaxed);
            return;
        }
        // Seen once: capture this step, then launch it.
        let before = self.gpu.dispatch_counts();
        if let Some(t) = &self.gpu.trace {
            t.begin_capture();
        }
        ck(
            self.gpu
                .stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "begin capture",
        );
        f(kvs);
        let graph = ck(
            StepGraph::end_capture(&self.gpu, pdl_enabled(&self.gpu)),
            "end capture",
        );
        assert_eq!(
            self.step_key(kvs, pos),
            key,
            "a captured decode step changed its buffers"
        );
        if let Some(t) = &self.gpu.trace {
            t.end_capture();
            ck(t.before_launch(&self.gpu.stream), "step trace");
        }
        let launches: Vec<(String, u64)> = self
            .gpu
            .dispatch_counts()
            .into_iter()
            .zip(before)
            .filter(|((_, a), (_, b))| a > b)
            .map(|((k, a), (_, b))| (k, a - b))
            .collect();
        ck(graph.launch(), "decode step graph");
        let kernels = launches.iter().map(|(_, n)| n).sum();
        *self.last_graph.lock().unwrap() = Some((kernels, graph.edges, graph.programmatic));
        r.graph = Some(graph);
        r.launches = launches;
        r.lm = self.lm_last();
        recorded.fetch_add(1, Relaxed);
    }

    fn will_read_logits(&self, read: bool) {
        self.set_lm_read(read);
    }

    fn step_counts(&self) -> muser_engine::backend::StepCounts {
        use std::sync::atomic::Ordering::Relaxed;
        let [replayed, recorded, direct] = &self.step_counts;
        muser_engine::backend::StepCounts {
            replayed: replayed.load(Relaxed),
            recorded: recorded.load(Relaxed),
            direct: direct.load(Relaxed),
        }
    }

    /// On the GPU: one block per row, 4 bytes read back per row.
    fn argmax(&self, x: &CudaBuf, cols: usize, out: &mut [u32]) {
        let rows = out.len();
        assert!(
            rows * cols <= x.rows * x.cols,
            "argmax: {rows} rows of {cols} from a buffer of {} x {}",
            x.rows,
            x.cols
        );
        let mut ws = self.ws.lock().unwrap();
        grow(&self.gpu, &mut ws.argmax, rows);
        let (xp, op, c) = (self.p(&x.data), self.p(&ws.argmax), cols as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.gpu.stream.launch_builder(self.kernel("argmax_rows"));
        b.arg(&xp).arg(&c).arg(&op);
        // SAFETY: x holds rows * cols values (checked above); out holds rows indices.
        ck(unsafe { b.launch(cfg) }, "argmax_rows");
        ck(
            self.gpu.stream.memcpy_dtoh(&ws.argmax.slice(..rows), out),
            "read argmax",
        );
    }

    fn top_k(&self, x: &CudaBuf, cols: usize, k: usize, out: &mut [Vec<(u32, f32)>]) {
        let rows = out.len();
        let slices = cols.div_ceil(TOPK_SORT);
        if k > TOPK_MAX || slices * TOPK_MAX > TOPK_SORT || rows == 0 || cols == 0 {
            // Past what one merge holds (vocabularies above 262,144 entries): through the host.
            muser_engine::backend::host_top_k(self, x, cols, k, out);
            return;
        }
        assert!(
            rows * cols <= x.rows * x.cols,
            "top_k: {rows} rows of {cols} from a buffer of {} x {}",
            x.rows,
            x.cols
        );
        let slice = cols.div_ceil(slices);
        let mut ws = self.ws.lock().unwrap();
        grow(&self.gpu, &mut ws.topk_part, rows * slices * TOPK_MAX);
        grow(&self.gpu, &mut ws.topk_out, rows * TOPK_MAX);
        let (xp, pp, op) = (self.p(&x.data), self.p(&ws.topk_part), self.p(&ws.topk_out));
        let (c, sl, np) = (cols as i32, slice as i32, slices as i32);
        let cfg = LaunchConfig {
            grid_dim: (slices as u32, rows as u32, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.gpu.stream.launch_builder(self.kernel("topk_slices"));
        b.arg(&xp).arg(&c).arg(&sl).arg(&pp);
        // SAFETY: x holds rows * cols values (checked above); part holds rows * slices *
        // TOPK_MAX keys, each block writing its own TOPK_MAX.
        ck(unsafe { b.launch(cfg) }, "topk_slices");
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.gpu.stream.launch_builder(self.kernel("topk_merge"));
        b.arg(&pp).arg(&np).arg(&op);
        // SAFETY: part holds rows * slices * TOPK_MAX keys (slices * TOPK_MAX <= TOPK_SORT, checked
        // above); out holds rows * TOPK_MAX.
        ck(unsafe { b.launch(cfg) }, "topk_merge");
        let mut keys = vec![0u64; rows * TOPK_MAX];
        ck(
            self.gpu
                .stream
                .memcpy_dtoh(&ws.topk_out.slice(..rows * TOPK_MAX), &mut keys),
            "read top-k",
        );
        for (o, row) in out.iter_mut().zip(keys.chunks_exact(TOPK_MAX)) {
            *o = row
                .iter()
                .take(k)
                .map_while(|&key| topk_pair(key))
                .collect();
        }
    }
    fn top_k_max(&self) -> usize {
        TOPK_MAX
    }

    fn name(&self) -> &'static str {
        "CUDA"
    }
    fn threads(&self) -> usize {
        1
    }

    fn weight(&self, t: &TensorView) -> Result<CudaWeight> {
        let (cols, rows) = (t.cols(), t.rows());
        let bytes = t.bytes();
        let err = |e: CudaError| EngineError::Invalid(format!("tensor {} on CUDA: {e}", t.name));
        if t.dims.len() == 1 && cols > MAX_NORM_WIDTH {
            return Err(EngineError::Invalid(format!(
                "tensor {}: CUDA norms serve rows up to {MAX_NORM_WIDTH} values, this one has {cols}",
                t.name
            )));
        }
        let w = if t.dims.len() == 1 {
            let mut v = vec![0f32; cols];
            muser_quant::dequantize_row(t.ty, bytes, &mut v)?;
            let vector = self.gpu.stream.clone_htod(&v).map_err(|e| err(e.into()))?;
            CudaWeight {
                name: t.name.clone(),
                matrix: None,
                vector: Some(vector),
                rows,
                cols,
            }
        } else {
            if crate::matvec::format_code(t.ty).is_err() {
                return Err(EngineError::TensorType {
                    name: t.name.clone(),
                    ty: t.ty,
                    supported: "F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K",
                });
            }
            let m = self
                .gpu
                .upload_matrix(t.ty, rows, cols, bytes)
                .map_err(err)?;
            // The tensor-core tile kernels (prefill, wide decode groups) address a K-quant
            // matrix with 32-bit offsets: refused here, at load, rather than at its first
            // prefill.
            if matches!(t.ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
                crate::matvec::mmt_fits(m.data.len()).map_err(err)?;
            }
            CudaWeight {
                name: t.name.clone(),
                matrix: Some(m),
                vector: None,
                rows,
                cols,
            }
        };
        // The GPU holds its own copy: the file's pages may leave the process's memory (the
        // embedding table keeps them, for lookups that read it on the host).
        if t.name != "token_embd.weight" {
            t.release();
        }
        self.upload_progress(bytes.len());
        Ok(w)
    }

    fn weights_loaded(&self) {
        *self.gpu.staging.lock().unwrap() = Vec::new();
        if let Some(pb) = self.upload.lock().unwrap().take() {
            pb.finish_and_clear();
        }
    }

    fn buf(&self, rows: usize, cols: usize) -> CudaBuf {
        // A new buffer may sit where a chunked LM head's logits were (`lmhead`).
        self.lm_forget();
        CudaBuf {
            rows,
            cols,
            data: ck(
                self.gpu.stream.alloc_zeros::<f32>((rows * cols).max(1)),
                "alloc buffer",
            ),
        }
    }
    fn write(&self, buf: &mut CudaBuf, data: &[f32]) {
        assert_eq!(data.len(), buf.rows * buf.cols, "write: size mismatch");
        *self.fused_act.lock().unwrap() = None;
        self.lm_forget();
        ck(
            self.gpu.stream.memcpy_htod(data, &mut buf.data),
            "write buffer",
        );
    }
    fn host_buf(&self, n: usize) -> muser_engine::backend::HostBuf {
        use muser_engine::backend::HostBuf;
        if !self.pinned_logits() || n == 0 {
            return HostBuf::zeros(n);
        }
        // SAFETY: page-locked host memory, flags 0 (not write-combined: the host reads it);
        // every value is zeroed below before anything reads it.
        let mem = unsafe { self.gpu.ctx.alloc_pinned_with_flags::<f32>(n, 0) };
        let Ok(mut mem) = mem else {
            return HostBuf::zeros(n); // no page-locked memory to be had: a Vec serves
        };
        let ptr = ck(mem.as_mut_ptr(), "page-locked host buffer");
        // SAFETY: n values of f32 at ptr, owned by mem; zero bits are 0.0.
        unsafe { std::ptr::write_bytes(ptr, 0, n) };
        let a = ptr as usize;
        self.pinned.0.lock().unwrap().push((a, a + 4 * n));
        HostBuf::from_mem(Box::new(PinnedValues {
            _mem: mem,
            ptr,
            len: n,
            ranges: self.pinned.clone(),
        }))
    }
    fn read(&self, buf: &CudaBuf, out: &mut [f32]) {
        let n = buf.rows * buf.cols;
        assert_eq!(out.len(), n, "read: size mismatch");
        if self.read_pinned(buf, &mut [(0, &mut *out)]) {
            return;
        }
        if !staged(n) {
            ck(
                self.gpu.stream.memcpy_dtoh(&buf.data.slice(..n), out),
                "read buffer",
            );
            return;
        }
        self.read_staged(buf, n, |at, src| copy_into_parts(&mut [&mut *out], at, src));
    }
    fn read_parts(&self, buf: &CudaBuf, outs: &mut [&mut [f32]]) {
        let n = buf.rows * buf.cols;
        assert_eq!(
            outs.iter().map(|o| o.len()).sum::<usize>(),
            n,
            "read_parts: the parts do not cover the buffer"
        );
        if let [one] = outs {
            // One part (a group of one sequence): the whole buffer straight into it.
            self.read(buf, one);
            return;
        }
        let mut at = 0;
        let mut parts: Vec<(usize, &mut [f32])> = outs
            .iter_mut()
            .map(|o| {
                at += o.len();
                (at - o.len(), &mut **o)
            })
            .collect();
        if self.read_pinned(buf, &mut parts) {
            return;
        }
        if !staged(n) {
            let mut all = vec![0.0; n];
            self.read(buf, &mut all);
            muser_engine::backend::copy_parts(&all, outs);
            return;
        }
        self.read_staged(buf, n, |at, src| copy_into_parts(outs, at, src));
    }
    fn kv_copy_prefix(&self, src: &CudaKv, dst: &mut CudaKv, n: usize) {
        assert_eq!(
            src.layers.len(),
            dst.layers.len(),
            "KV copy between other models"
        );
        self.timed(
            || "kv_copy_prefix".to_string(),
            || {
                for (d, s) in dst.layers.iter_mut().zip(&src.layers) {
                    assert_eq!(d.spec, s.spec, "KV copy between layers of other shapes");
                    // [slots][n_kv * head_dim] per layer: positions 0..n are its first rows
                    let spec = s.spec;
                    let len = spec.prefix_slots(n) * spec.n_head_kv * spec.head_dim;
                    if len == 0 {
                        continue;
                    }
                    for (from, to) in [(&s.k, &mut d.k), (&s.v, &mut d.v)] {
                        ck(
                            self.gpu
                                .stream
                                .memcpy_dtod(&from.slice(..len), &mut to.slice_mut(..len)),
                            "KV copy",
                        );
                    }
                }
            },
        )
    }
    fn kv_save(&self, kv: &CudaKv, n: usize) -> KvHost {
        // [slots][n_kv * head_dim] per layer: positions 0..n are its first rows
        let layers = kv
            .layers
            .iter()
            .map(|l| {
                let len = l.spec.prefix_slots(n) * l.spec.n_head_kv * l.spec.head_dim;
                [&l.k, &l.v].map(|plane| {
                    let mut host = vec![0u16; len];
                    if len > 0 {
                        ck(
                            self.gpu.stream.memcpy_dtoh(&plane.slice(..len), &mut host),
                            "KV save",
                        );
                    }
                    host
                })
            })
            .collect();
        KvHost { layers }
    }
    fn kv_load(&self, host: &KvHost, kv: &mut CudaKv) {
        assert_eq!(
            host.layers.len(),
            kv.layers.len(),
            "KV load of another model"
        );
        for (l, h) in kv.layers.iter_mut().zip(&host.layers) {
            let width = l.spec.n_head_kv * l.spec.head_dim;
            assert!(
                h[0].len() == h[1].len()
                    && h[0].len().is_multiple_of(width.max(1))
                    && h[0].len() <= l.spec.slots * width,
                "KV load of another layer's shape"
            );
            for (values, plane) in [(&h[0], &mut l.k), (&h[1], &mut l.v)] {
                if !values.is_empty() {
                    ck(
                        self.gpu
                            .stream
                            .memcpy_htod(values, &mut plane.slice_mut(..values.len())),
                        "KV load",
                    );
                }
            }
        }
    }
    fn copy_rows(
        &self,
        src: &CudaBuf,
        src_row: usize,
        dst: &mut CudaBuf,
        dst_row: usize,
        n: usize,
    ) {
        muser_engine::backend::check_copy_rows(
            (src.rows, src.cols),
            src_row,
            (dst.rows, dst.cols),
            dst_row,
            n,
        );
        let w = src.cols;
        self.timed(
            || "copy_rows".to_string(),
            || {
                ck(
                    self.gpu.stream.memcpy_dtod(
                        &src.data.slice(src_row * w..(src_row + n) * w),
                        &mut dst.data.slice_mut(dst_row * w..(dst_row + n) * w),
                    ),
                    "copy rows",
                )
            },
        )
    }
    fn exact_prefill_rows(&self) -> usize {
        // Chunks of every width on `mmh` (the default) or none: a column's bits never depend on
        // the width. Only with `MUSER_CUDA_MMH_MIN` past 1 do they below and from that width.
        let min = crate::mmh::mmh_min();
        if self.gpu.mmh_prefill() && min > 1 {
            min
        } else {
            usize::MAX
        }
    }
    fn exact_columns<R>(&self, f: impl FnOnce() -> R) -> R {
        // Matmuls on `mmh` only when every width goes there (`Gpu::mmh_route`); attention by a
        // plan of each row's own position (`attention`).
        let _exact = exact_flag(&self.gpu);
        f()
    }
    fn prefill_matches_decode(&self) -> bool {
        // A prefill chunk on `mmh` (f16 tiles) gets other bits than the decode step's integer
        // kernels, and its attention splits a row by the prefill plan (one split on the tensor
        // cores, `PREFILL_TILES` on the split kernels), not by the decode row's.
        false
    }
    fn read_rows(&self, buf: &CudaBuf, n_rows: usize, rows: &[usize], outs: &mut [&mut [f32]]) {
        let cols = buf.cols;
        assert_eq!(
            n_rows, buf.rows,
            "read_rows: {n_rows} rows of a buffer of {}",
            buf.rows
        );
        muser_engine::backend::check_read_rows(n_rows, rows, outs);
        assert!(
            outs.iter().all(|o| o.len() == cols),
            "read_rows: outputs not {cols} wide"
        );
        let mut parts: Vec<(usize, &mut [f32])> = rows
            .iter()
            .zip(outs.iter_mut())
            .map(|(&r, o)| (r * cols, &mut **o))
            .collect();
        if self.read_pinned(buf, &mut parts) {
            return;
        }
        // Each run of consecutive rows in one copy (through the page-locked buffer when large).
        let mut k = 0;
        while k < rows.len() {
            let mut e = k + 1;
            while e < rows.len() && rows[e] == rows[e - 1] + 1 {
                e += 1;
            }
            let (first, n) = (rows[k] * cols, (e - k) * cols);
            let run = &mut outs[k..e];
            if staged(n) {
                self.read_staged_at(buf, first, n, |at, src| copy_into_parts(run, at, src));
            } else {
                for (j, o) in run.iter_mut().enumerate() {
                    let a = first + j * cols;
                    ck(
                        self.gpu
                            .stream
                            .memcpy_dtoh(&buf.data.slice(a..a + cols), &mut **o),
                        "read buffer",
                    );
                }
            }
            k = e;
        }
    }
    fn kv_cache(&self, layers: &[KvLayerSpec]) -> Result<CudaKv> {
        let layers = layers
            .iter()
            .map(|&spec| {
                let n = spec.slots * spec.n_head_kv * spec.head_dim;
                let alloc = || {
                    self.gpu.stream.alloc_zeros::<u16>(n).map_err(|e| {
                        EngineError::Invalid(format!(
                            "KV cache: cannot allocate {} bytes on the GPU for {} positions: {e}",
                            2 * n,
                            spec.slots
                        ))
                    })
                };
                Ok(CudaKvLayer {
                    spec,
                    k: alloc()?,
                    v: alloc()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(CudaKv { layers })
    }

    fn embed(&self, table: &CudaWeight, tokens: &[u32], out: &mut CudaBuf) {
        self.timed(
            || "embed".to_string(),
            || {
                let m = table.mat();
                let mut ws = self.ws.lock().unwrap();
                self.upload_tokens(&mut ws, tokens);
                let ty = crate::matvec::format_code(m.ty).expect("checked at upload");
                let (tp, toks, op) = (self.p(&m.data), self.p(&ws.tokens), self.p(&out.data));
                let (rows, cols) = (m.rows as i64, m.cols as i32);
                let cfg = LaunchConfig {
                    grid_dim: ((m.cols as u32).div_ceil(256), tokens.len() as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self.gpu.stream.launch_builder(self.kernel("embed_rows"));
                b.arg(&tp)
                    .arg(&ty)
                    .arg(&rows)
                    .arg(&cols)
                    .arg(&toks)
                    .arg(&op);
                // SAFETY: tokens < rows (checked by the session); out holds n_tokens * cols.
                ck(unsafe { b.launch(cfg) }, "embed_rows");
            },
        )
    }

    fn rmsnorm(&self, x: &CudaBuf, w: Option<&CudaWeight>, eps: f32, out: &mut CudaBuf) {
        self.timed(
            || "rmsnorm".to_string(),
            || {
                let (xp, wp, op) = (
                    self.p(&x.data),
                    w.map_or(0, |w| w.vec_ptr(&self.gpu)),
                    self.p(&out.data),
                );
                let cols = x.cols as i32;
                let cfg = LaunchConfig {
                    grid_dim: (x.rows as u32, 1, 1),
                    block_dim: (1024, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self.gpu.stream.launch_builder(self.kernel("rmsnorm"));
                b.arg(&xp).arg(&wp).arg(&op).arg(&cols).arg(&eps);
                // SAFETY: x and out are [rows][cols]; w is [cols] or null.
                ck(unsafe { b.launch(cfg) }, "rmsnorm");
            },
        )
    }

    fn rmsnorm_heads(&self, x: &mut CudaBuf, w: &CudaWeight, head_dim: usize, eps: f32) {
        self.timed(
            || "rmsnorm_heads".to_string(),
            || {
                let n_heads = (x.rows * x.cols / head_dim) as i32;
                let (xp, wp, hd) = (self.p(&x.data), w.vec_ptr(&self.gpu), head_dim as i32);
                let mut b = self.gpu.stream.launch_builder(self.kernel("rmsnorm_heads"));
                b.arg(&xp).arg(&wp).arg(&hd).arg(&n_heads).arg(&eps);
                // SAFETY: x holds n_heads * head_dim values; w holds head_dim.
                ck(
                    unsafe { b.launch(cfg1(n_heads as usize * 32, 128)) },
                    "rmsnorm_heads",
                );
            },
        )
    }

    fn matmul(&self, x: &CudaBuf, outs: &mut [(&CudaWeight, &mut CudaBuf)]) {
        self.timed_reader(
            || format!("matmul {}", short_name(&outs[0].0.name)),
            || {
                let mut ws = self.ws.lock().unwrap();
                let xp = self.p(&x.data);
                let types: Vec<GgmlType> = outs.iter().map(|(w, _)| w.mat().ty).collect();
                // Prefill chunks of K-quants: the f16 tiles (mmh.rs), which read x as it is.
                let half = types.iter().all(|&t| self.gpu.mmh_route(t, x.rows, x.cols));
                if half {
                    self.fused_act.lock().unwrap().take();
                } else {
                    self.quantize_for(&mut ws, xp, x.rows * x.cols, x.cols, &types);
                }
                let jobs: Vec<Job> = outs
                    .iter()
                    .map(|(w, y)| {
                        assert_eq!(
                            (y.rows, y.cols),
                            (x.rows, w.rows),
                            "matmul output of {} has the wrong shape",
                            w.name
                        );
                        Job::new(w.mat(), dptr(&self.gpu, &y.data))
                    })
                    .collect();
                if half {
                    ck(self.gpu.mmh_jobs(&jobs, xp, x.cols, x.rows), "mmh");
                    return;
                }
                ck(
                    self.gpu.matvec_jobs(&jobs, xp, x.cols, x.rows, &ws.act),
                    "matvec",
                );
            },
        )
    }

    fn ffn_gate_up_silu(&self, x: &CudaBuf, gate: &CudaWeight, up: &CudaWeight, out: &mut CudaBuf) {
        self.timed_reader(
            || "ffn_gate_up_silu".to_string(),
            || {
                let mut ws = self.ws.lock().unwrap();
                let xp = self.p(&x.data);
                let op = self.p(&out.data);
                if [gate, up]
                    .iter()
                    .all(|w| self.gpu.mmh_route(w.mat().ty, x.rows, x.cols))
                {
                    self.fused_act.lock().unwrap().take();
                    ck(
                        self.gpu.mmh_silu(gate.mat(), up.mat(), xp, x.rows, op),
                        "mmh_silu",
                    );
                    return;
                }
                self.quantize_for(
                    &mut ws,
                    xp,
                    x.rows * x.cols,
                    x.cols,
                    &[gate.mat().ty, up.mat().ty],
                );
                // One column may leave its output's Q8_K in the scratch for the matmul after it.
                let quantized = ck(
                    self.gpu.matvec_silu(
                        gate.mat(),
                        up.mat(),
                        xp,
                        x.rows,
                        &mut ws.act,
                        op,
                        self.fuse_quant.load(std::sync::atomic::Ordering::Relaxed)
                            && !self.ablated("quantize"),
                    ),
                    "matvec_silu",
                );
                if quantized {
                    *self.fused_act.lock().unwrap() = Some((op, out.rows * out.cols, out.cols));
                }
            },
        )
    }

    fn rope(&self, x: &mut CudaBuf, head_dim: usize, rope: &RopeParams, pos0: usize) {
        self.timed(
            || "rope".to_string(),
            || self.launch_rope(x, head_dim, rope, pos0, 0),
        )
    }

    fn kv_store(&self, kv: &mut CudaKv, layer: usize, k: &CudaBuf, v: &CudaBuf, pos0: usize) {
        self.timed(
            || "kv_store".to_string(),
            || {
                let l = &mut kv.layers[layer];
                let width = l.spec.n_head_kv * l.spec.head_dim;
                assert_eq!(k.cols, width, "kv_store: k width");
                if !l.spec.is_ring() {
                    assert!(
                        pos0 + k.rows <= l.spec.slots,
                        "kv_store: position {} past the plane of {}",
                        pos0 + k.rows,
                        l.spec.slots
                    );
                }
                let (kp, vp, kc, vc) =
                    (self.p(&k.data), self.p(&v.data), self.p(&l.k), self.p(&l.v));
                let (n, w, p0, slots, ring) = (
                    k.rows as i32,
                    width as i32,
                    pos0 as i32,
                    l.spec.slots as i32,
                    i32::from(l.spec.is_ring()),
                );
                let mut b = self.gpu.stream.launch_builder(self.kernel("kv_store"));
                b.arg(&kp)
                    .arg(&vp)
                    .arg(&kc)
                    .arg(&vc)
                    .arg(&n)
                    .arg(&w)
                    .arg(&p0)
                    .arg(&slots)
                    .arg(&ring);
                // SAFETY: slots index within the cache (ring: modulo; plane: checked above).
                ck(unsafe { b.launch(cfg1(k.rows * width, 256)) }, "kv_store");
            },
        )
    }

    fn attention(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        pos0: usize,
        scale: f32,
        out: &mut CudaBuf,
    ) {
        self.timed(
            || "attention".to_string(),
            || {
                let l = &kv.layers[layer];
                let (d, n_kv) = (l.spec.head_dim, l.spec.n_head_kv);
                let n_head = q.cols / d;
                let g = n_head / n_kv;
                let name = attention_rows_kernel(d).unwrap_or_else(|| {
                    panic!("CUDA attention: head dim {d} (64, 128, 256 supported)")
                });
                assert!(
                    g * d <= 4096,
                    "CUDA attention: {g} query heads of {d} per KV head (at most 4096 values)"
                );
                // The rows as a decode group of one sequence, each row planned by its own
                // position only, so its bits do not depend on the chunk it came in (a prompt
                // prefilled whole, cut into parts, or sharing a pass with others).
                let (pp, tab) = self.prefill_tables(kv, layer, pos0, q.rows);
                // Every row of a prefill chunk on the per-row tensor-core kernel whatever the
                // count, each row whole in one block. Until 2026-12-01 rows seeing more than
                // 512 positions took the split kernels instead; H200, llama-glimmer, same call:
                // pp512 at depth 2048 2,076.50 -> 5,027.39 tokens/s, at depth 8192 773.53 ->
                // 3,783.52, at depth 0 unchanged (5,684.03). (Split as a lone decode row is, up
                // to 16 splits of 32 positions at pp512, the partials took up to 134 MB per
                // layer; H200 pp512: 3199 tokens/s, 3368 with one split.)
                let mma = self.attn_mma() && mma_attention_fits(d, g);
                // Otherwise the split kernels, each row at most PREFILL_SPLITS splits of its own
                // (`row_split`): until 2026-12-07 the chunk's plan depended on its row count, and
                // a prompt of head width 64 got other bits whole than cut (the exact passes took
                // one row per launch instead).
                let (solo, min_tiles) = if mma {
                    (1, 1)
                } else {
                    (PREFILL_SPLITS, PREFILL_TILES)
                };
                let splits = (pos0..pos0 + q.rows)
                    .map(|p| row_split(visible(&l.spec, p), solo, min_tiles).0)
                    .max()
                    .unwrap_or(1);
                let mut ws = self.ws.lock().unwrap();
                let parts = q.rows * n_head * splits;
                grow(&self.gpu, &mut ws.o_part, parts * d);
                grow(&self.gpu, &mut ws.ml_part, parts * 2);
                let a = RowsAttn {
                    pos: pp,
                    tab,
                    parts: (self.p(&ws.o_part), self.p(&ws.ml_part)),
                    n: q.rows,
                    n_head,
                    n_kv,
                    splits,
                    solo,
                    min_tiles,
                    window: l.spec.window.unwrap_or(0),
                    ring: l.spec.is_ring(),
                    early: false,
                };
                if mma {
                    self.attn_rows_mma(&a, self.p(&q.data), scale, false, None);
                } else {
                    let chunks = head_chunks(n_kv * q.rows * splits, g, self.gpu.sms);
                    self.attn_rows_split(&a, name, d, g / chunks, self.p(&q.data), scale);
                }
                self.attn_rows_combine(&mut ws, &a, d, 0, self.p(&out.data));
            },
        )
    }

    fn sigmoid_gate(&self, a: &mut CudaBuf, g: &CudaBuf) {
        self.timed(
            || "sigmoid_gate".to_string(),
            || {
                let n = a.rows * a.cols;
                let (ap, gp, ni) = (self.p(&a.data), self.p(&g.data), n as i32);
                let mut b = self.gpu.stream.launch_builder(self.kernel("sigmoid_gate"));
                b.arg(&ap).arg(&gp).arg(&ni);
                // SAFETY: a and g hold n values.
                ck(unsafe { b.launch(cfg1(n, 256)) }, "sigmoid_gate");
            },
        )
    }

    fn residual_norm(
        &self,
        h: &mut CudaBuf,
        x: &CudaBuf,
        post: Option<NormArgs<'_, CudaWeight>>,
        next: NormArgs<'_, CudaWeight>,
        out: &mut CudaBuf,
    ) {
        if self.ablated("residual_norm") {
            return;
        }
        self.timed(
            || "residual_norm".to_string(),
            || {
                let (hp, xp, op) = (self.p(&h.data), self.p(&x.data), self.p(&out.data));
                let (pw, peps) = post.map_or((0, 0.0), |p| (p.weight.vec_ptr(&self.gpu), p.eps));
                let (nw, neps) = (next.weight.vec_ptr(&self.gpu), next.eps);
                let cols = h.cols as i32;
                let cfg = LaunchConfig {
                    grid_dim: (h.rows as u32, 1, 1),
                    block_dim: (1024, 1, 1),
                    shared_mem_bytes: 0,
                };
                // out's Q8_K quantization into the activation scratch, for the matmul after.
                let n = h.rows * h.cols;
                let fuse = self.fuse_quant.load(std::sync::atomic::Ordering::Relaxed)
                    && h.cols.is_multiple_of(256);
                let mut ws = self.ws.lock().unwrap();
                if fuse && n > ws.act.cap {
                    ws.act = ck(self.gpu.act_scratch(n), "activation scratch");
                }
                let (q, ds, bs) = if fuse {
                    (self.p(&ws.act.q), self.p(&ws.act.ds), self.p(&ws.act.bs))
                } else {
                    (0, 0, 0)
                };
                let (xblob, nt) = self.fused_mmw(&mut ws, fuse, h.rows, h.cols);
                let mut b = self.gpu.stream.launch_builder(self.kernel("residual_norm"));
                b.arg(&hp)
                    .arg(&xp)
                    .arg(&pw)
                    .arg(&peps)
                    .arg(&nw)
                    .arg(&neps)
                    .arg(&op)
                    .arg(&cols)
                    .arg(&q)
                    .arg(&ds)
                    .arg(&bs)
                    .arg(&xblob)
                    .arg(&nt);
                // SAFETY: h, x, out are [rows][cols]; the weights [cols]; q, ds and bs (when
                // fused) hold the quantization of rows * cols values (act_scratch), xblob (when
                // not 0) its mmw regions (mmw_prepack).
                ck(unsafe { b.launch(cfg) }, "residual_norm");
                if fuse {
                    *self.fused_act.lock().unwrap() = Some((op, n, h.cols));
                }
            },
        )
    }

    fn lm_head(
        &self,
        x: &CudaBuf,
        first_row: usize,
        w: &CudaWeight,
        scale: f32,
        softcap: Option<f32>,
        out: &mut CudaBuf,
    ) {
        self.timed(
            || "lm_head".to_string(),
            || {
                let n = x.rows - first_row;
                let m = w.mat();
                assert_eq!((out.rows, out.cols), (n, m.rows), "lm_head output shape");
                let xp = self.p(&x.data) + (first_row * x.cols * 4) as u64;
                let (op, cap) = (self.p(&out.data), softcap.unwrap_or(0.0));
                let plan = self.lm_plan(n, m);
                {
                    let mut ws = self.ws.lock().unwrap();
                    self.quantize_for(&mut ws, xp, n * x.cols, x.cols, &[m.ty]);
                    if !plan.is_empty() {
                        return self
                            .lm_head_chunks(&plan, m, xp, x.cols, n, &mut ws, op, scale, cap);
                    }
                    ck(
                        self.gpu
                            .matvec_jobs(&[Job::new(m, op)], xp, x.cols, n, &ws.act),
                        "lm_head matvec",
                    );
                }
                let total = n * m.rows;
                let ni = total as i32;
                let mut b = self.gpu.stream.launch_builder(self.kernel("scale_softcap"));
                b.arg(&op).arg(&ni).arg(&scale).arg(&cap);
                // SAFETY: out holds n * n_vocab values.
                ck(unsafe { b.launch(cfg1(total, 256)) }, "scale_softcap");
            },
        )
    }

    fn rope_rows(
        &self,
        x: &mut CudaBuf,
        width: usize,
        head_dim: usize,
        rope: &RopeParams,
        pos: &[usize],
    ) {
        self.timed(
            || "rope_rows".to_string(),
            || {
                assert_eq!((x.rows, x.cols), (pos.len(), width), "rope_rows shape");
                let pp = self.positions(pos);
                self.launch_rope(x, head_dim, rope, 0, pp);
            },
        )
    }

    fn kv_store_rows(
        &self,
        kvs: &mut [&mut CudaKv],
        layer: usize,
        k: &CudaBuf,
        v: &CudaBuf,
        width: usize,
        pos: &[usize],
    ) {
        self.timed(
            || "kv_store_rows".to_string(),
            || {
                let n = pos.len();
                assert!(
                    kvs.len() == n && k.rows == n && v.rows == n,
                    "kv_store_rows: {n} rows"
                );
                let spec = kvs[0].layers[layer].spec;
                assert!(
                    k.cols == width && width == spec.n_head_kv * spec.head_dim,
                    "kv_store_rows: k width {} for a cache of {} x {}",
                    k.cols,
                    spec.n_head_kv,
                    spec.head_dim
                );
                check_plane_positions("kv_store_rows", kvs, layer, pos);
                let (pp, tab) = self.row_tables(kvs, layer, pos);
                let (kp, vp) = (self.p(&k.data), self.p(&v.data));
                let (ni, wi, ring) = (n as i32, width as i32, i32::from(spec.is_ring()));
                let mut b = self.gpu.stream.launch_builder(self.kernel("kv_store_rows"));
                b.arg(&kp)
                    .arg(&vp)
                    .arg(&tab)
                    .arg(&pp)
                    .arg(&ni)
                    .arg(&wi)
                    .arg(&ring);
                // SAFETY: row t writes slot pos[t] (modulo its slots for a ring; checked above for
                // a plane) of its own cache.
                ck(unsafe { b.launch(cfg1(n * width, 256)) }, "kv_store_rows");
            },
        )
    }

    fn qkv_rows(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        norms: Option<(&CudaWeight, &CudaWeight, f32)>,
        heads: Heads,
        rope: Option<&RopeParams>,
        kvs: &mut [&mut CudaKv],
        layer: usize,
        pos: &[usize],
    ) {
        if self.ablated("qkv_rows") {
            return;
        }
        self.timed(
            || "qkv_rows".to_string(),
            || {
                let n = pos.len();
                let hd = heads.head_dim;
                let (qw, kvw) = (heads.n_head * hd, heads.n_head_kv * hd);
                assert!(
                    kvs.len() == n
                        && (q.rows, q.cols) == (n, qw)
                        && (k.rows, k.cols) == (n, kvw)
                        && (v.rows, v.cols) == (n, kvw),
                    "qkv_rows: {n} rows of {qw} / {kvw}"
                );
                let spec = kvs[0].layers[layer].spec;
                assert!(
                    spec.n_head_kv == heads.n_head_kv && spec.head_dim == hd,
                    "qkv_rows: heads {heads:?} for a cache of {} x {}",
                    spec.n_head_kv,
                    spec.head_dim
                );
                check_plane_positions("qkv_rows", kvs, layer, pos);
                let (pp, tab) = self.row_tables(kvs, layer, pos);
                let (qn, kn, eps) = norms.map_or((0, 0, 0.0), |(a, b, e)| {
                    (a.vec_ptr(&self.gpu), b.vec_ptr(&self.gpu), e)
                });
                let (n_rot, base, neox) = rope.map_or((0, 0.0, 0), |r| {
                    (
                        r.n_rot as i32,
                        r.freq_base,
                        i32::from(r.style == RopeStyle::Neox),
                    )
                });
                let (qp, kp, vp) = (self.p(&q.data), self.p(&k.data), self.p(&v.data));
                let (ni, nh, nk, hdi, ring) = (
                    n as i32,
                    heads.n_head as i32,
                    heads.n_head_kv as i32,
                    hd as i32,
                    i32::from(spec.is_ring()),
                );
                let warps = n * (heads.n_head + heads.n_head_kv);
                let regs = i32::from(self.qkv_regs());
                let mut b = self.gpu.stream.launch_builder(self.kernel("qkv_rows"));
                b.arg(&qp)
                    .arg(&kp)
                    .arg(&vp)
                    .arg(&qn)
                    .arg(&kn)
                    .arg(&eps)
                    .arg(&ni)
                    .arg(&nh)
                    .arg(&nk)
                    .arg(&hdi)
                    .arg(&n_rot)
                    .arg(&base)
                    .arg(&neox)
                    .arg(&tab)
                    .arg(&pp)
                    .arg(&ring)
                    .arg(&regs);
                // SAFETY: one warp per head of q ([n][qw]) and k ([n][kvw]); row t writes slot
                // pos[t] (modulo its slots for a ring; checked above for a plane) of its own cache.
                ck(unsafe { b.launch(cfg1(warps * 32, 128)) }, "qkv_rows");
            },
        )
    }

    fn attention_rows(
        &self,
        q: &CudaBuf,
        width: usize,
        kvs: &[&mut CudaKv],
        layer: usize,
        pos: &[usize],
        scale: f32,
        gate: Option<&CudaBuf>,
        out: &mut CudaBuf,
    ) {
        if self.ablated("attention_rows") {
            return;
        }
        self.timed(
            || "attention_rows".to_string(),
            || {
                let n = pos.len();
                assert!(
                    kvs.len() == n && q.rows == n && q.cols == width,
                    "attention_rows: {n} rows"
                );
                let spec = kvs[0].layers[layer].spec;
                let (d, n_kv) = (spec.head_dim, spec.n_head_kv);
                let n_head = width / d;
                let g = n_head / n_kv;
                let name = attention_rows_kernel(d).unwrap_or_else(|| {
                    panic!("CUDA attention: head dim {d} (64, 128, 256 supported)")
                });
                assert!(
                    g * d <= 4096,
                    "CUDA attention: {g} query heads of {d} per KV head (at most 4096 values)"
                );
                assert_eq!(
                    spec.n_head, n_head,
                    "attention_rows: query heads of the cache"
                );
                // Each row's splits are those it gets alone; the grid covers the most any row can
                // get (`solo`), so it does not change with the positions (a recorded step replays
                // at any position) and a row's extra splits write empty partials.
                let solo = solo_splits(n_kv, self.gpu.sms);
                let max_splits = solo;
                let wide = self.rows_wide(&spec, pos);
                let (pp, tab) = self.row_tables(kvs, layer, pos);
                let mut ws = self.ws.lock().unwrap();
                let parts = n * n_head * max_splits;
                grow(&self.gpu, &mut ws.o_part, parts * d);
                grow(&self.gpu, &mut ws.ml_part, parts * 2);
                let a = RowsAttn {
                    pos: pp,
                    tab,
                    parts: (self.p(&ws.o_part), self.p(&ws.ml_part)),
                    n,
                    n_head,
                    n_kv,
                    splits: max_splits,
                    solo,
                    min_tiles: attn_split_tiles(),
                    window: spec.window.unwrap_or(0),
                    ring: spec.is_ring(),
                    early: attn_early(),
                };
                let qp = self.p(&q.data);
                if let Some(g) = gate {
                    assert_eq!((g.rows, g.cols), (n, width), "attention_rows: gate shape");
                }
                let gp = gate.map_or(0, |g| self.p(&g.data));
                if self.rows_cluster(&spec, pos) {
                    // Short rows: the splits merged in each row's clusters, no combine launch.
                    self.attn_rows_mma_fin(&mut ws, &a, qp, scale, gp, self.p(&out.data));
                    return;
                }
                if self.attn_mma() && mma_attention_fits(d, g) {
                    // Tensor cores: all the group's heads per block (no head chunks).
                    self.attn_rows_mma(&a, qp, scale, wide, None);
                } else {
                    let chunks = self.rows_chunks(&spec, pos);
                    self.attn_rows_split(&a, name, d, g / chunks, qp, scale);
                }
                self.attn_rows_combine(&mut ws, &a, d, gp, self.p(&out.data));
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// argmax.cu's topk_key, on the host.
    fn topk_key(v: f32, id: u32) -> u64 {
        let b = v.to_bits();
        let o = if v.is_nan() {
            0
        } else if b & 0x8000_0000 != 0 {
            !b
        } else {
            b | 0x8000_0000
        };
        ((o as u64) << 32) | (u32::MAX - id) as u64
    }

    #[test]
    fn topk_keys_rank_as_the_sampler_and_decode_back() {
        // Sorting keys in descending order is muser_sample's top-k order (logit by total_cmp,
        // highest first, then the lower id), NaN last; every key decodes to its (id, logit).
        let mut vals: Vec<f32> = (0..500u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) as f32 / 1e6).sin() * 7.0)
            .collect();
        vals[3] = 0.0;
        vals[4] = -0.0;
        vals[5] = f32::INFINITY;
        vals[6] = f32::NEG_INFINITY;
        vals[7] = f32::NAN;
        vals[8] = vals[9]; // a tie
        vals[10] = f32::MIN_POSITIVE / 4.0; // subnormal
        vals[11] = -vals[10];
        let mut keys: Vec<u64> = vals
            .iter()
            .enumerate()
            .map(|(i, &v)| topk_key(v, i as u32))
            .collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        let got: Vec<(u32, u32)> = keys
            .iter()
            .map_while(|&k| topk_pair(k))
            .map(|(id, l)| (id, l.to_bits()))
            .collect();
        let want: Vec<(u32, u32)> = muser_sample::top_k_logits(&vals, 1000)
            .iter()
            .map(|c| (c.id, c.logit.to_bits()))
            .collect();
        assert_eq!(got.len(), 499);
        assert_eq!(got, want);
        assert_eq!(topk_pair(0), None);
    }

    /// A pipelined read hands the host its pieces one by one: whatever the parts' and the
    /// pieces' boundaries, every value lands once, in its place.
    #[test]
    fn pieces_of_a_read_fill_every_part_in_place() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..200 {
            let lens: Vec<usize> = (0..1 + next(6)).map(|_| 1 + next(200_000)).collect();
            let n: usize = lens.iter().sum();
            let src: Vec<f32> = (0..n).map(|i| (i as f32).mul_add(0.5, -3.0)).collect();
            let mut bufs: Vec<Vec<f32>> = lens.iter().map(|&l| vec![f32::NAN; l]).collect();
            let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            let step = 1 + next(n);
            for at in (0..n).step_by(step) {
                copy_into_parts(&mut outs, at, &src[at..(at + step).min(n)]);
            }
            let got: Vec<f32> = bufs.concat();
            assert!(got == src, "parts {lens:?}, pieces of {step}");
        }
    }

    #[test]
    fn glimmer_decode_attention_fits_the_tensor_core_kernel() {
        // Muse Glimmer and llama-glimmer: 32 query heads over 2 KV heads of 128.
        assert!(mma_attention_fits(128, 16));
        assert!(mma_attention_fits(128, 4));
        assert!(!mma_attention_fits(128, 17) && !mma_attention_fits(64, 8));
        // The merge area (a slot of 16 rows of 136 f32 and 16 (max, sum) per warp) fits.
        for w in [4, 8] {
            assert!(w * 16 * 136 * 4 + w * 16 * 8 <= attn_mma_smem(w));
            // Two blocks per SM fit the H200's 227 KB of shared memory per block.
            assert!(2 * attn_mma_smem(w) <= 227 * 1024);
        }
        assert_eq!(attn_mma_smem(4), 34_816 + 512);
        // attn_rows_mma48_128: 4 warps' V stages (slots 0-3) below the first pass's 4 parts.
        assert_eq!(
            attn_mma_smem(8) - 8 * 16 * 8,
            2 * (attn_mma_smem(4) - 4 * 16 * 8)
        );
    }

    #[test]
    fn wide_groups_take_the_4_warp_blocks_from_8_pairs() {
        // 2 KV heads: one row and groups of 2-3 keep 8 warps, 4 rows and more take 4-warp
        // blocks; 8 KV heads from 1 row would, but one row always keeps its 8-warp blocks.
        for rows in 1..=3 {
            assert!(!attn_wide4(rows, 2), "{rows} rows");
        }
        for rows in [4, 5, 8, 32, 64] {
            assert!(attn_wide4(rows, 2), "{rows} rows");
        }
        assert!(!attn_wide4(1, 8) && attn_wide4(2, 8));
    }

    #[test]
    fn long_glimmer_rows_run_the_8_warp_attention_and_short_ones_never_do() {
        // 2 KV heads on the H200's 132 SMs, 8-tile splits: rows up to 256 positions split per
        // 32-position tile, deeper ones into splits of at least 256, 16 of them from ~3,900.
        let solo = solo_splits(2, 132);
        for count in [1, 33, 256, 1100, 2049] {
            let (n, len) = row_split(count, solo, 8);
            assert!(!attn_wide(n, len), "{count} positions: {n} x {len}");
        }
        for count in [4097, 8192, 65536] {
            let (n, len) = row_split(count, solo, 8);
            assert!(attn_wide(n, len), "{count} positions: {n} x {len}");
        }
        let (n, len) = ATTN_WIDE_PLAN;
        assert!(attn_wide(n, len) && !attn_wide(n - 1, len) && !attn_wide(n, len - 1));
    }

    #[test]
    fn glimmer_attention_routes_to_the_128_kernel_within_48k_of_shared_memory() {
        // 32 query heads over 2 KV heads of 128: G = 16.
        assert_eq!(attention_rows_kernel(128), Some("attn_rows_128"));
        assert!(attention_smem(16, 128) <= 48 * 1024);
        assert_eq!(attention_rows_kernel(64), Some("attn_rows_64"));
        assert_eq!(attention_rows_kernel(96), None);
    }

    /// One step of the tests' xorshift generator.
    fn xorshift(s: &mut u64) {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
    }

    #[test]
    fn prefill_row_splits_are_long_and_cover_every_position_once() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let t = PREFILL_TILES & (SPLIT_FLOOR - 1);
        for _ in 0..2000 {
            xorshift(&mut rng);
            let count = 1 + (rng % 70_000) as usize;
            let (n, len) = row_split(count, PREFILL_SPLITS, PREFILL_TILES);
            assert!((1..=PREFILL_SPLITS).contains(&n) && len.is_multiple_of(ATT_T));
            assert!(
                n * len >= count && (n - 1) * len < count,
                "{count}: {n} x {len}"
            );
            // No split shorter than T tiles but where the row is shorter; fewer than the most
            // splits only while the row has fewer than that many runs of T tiles.
            assert!(
                len >= (t * ATT_T).min(count.div_ceil(ATT_T) * ATT_T),
                "{count}: {len}"
            );
            let runs = (count.div_ceil(ATT_T) / t).clamp(1, PREFILL_SPLITS);
            assert!(
                n <= runs && (n == runs || (n + 1) * len > count),
                "{count}: {n} x {len}"
            );
        }
        // A 512-token prompt at depth 0: one split a row.
        assert!((1..=512).all(|c| row_split(c, PREFILL_SPLITS, PREFILL_TILES).0 == 1));
        assert_eq!(row_split(4096 + 512, PREFILL_SPLITS, PREFILL_TILES).0, 8);
    }

    #[test]
    fn decode_row_splits_cover_every_position_once_and_grow_past_min_tiles_by_whole_runs() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            xorshift(&mut rng);
            let count = 1 + (rng % 70_000) as usize;
            let min_tiles = 1 + (rng >> 20) as usize % 16;
            let floor = (rng >> 40) & 1 == 1;
            let solo = solo_splits(2, 132);
            let (n, len) = row_split(count, solo, min_tiles | if floor { SPLIT_FLOOR } else { 0 });
            assert!(
                n >= 1 && n <= solo && len.is_multiple_of(ATT_T),
                "{count}: {n} x {len}"
            );
            assert!(
                n * len >= count && (n - 1) * len < count,
                "{count}: {n} x {len}"
            );
            // One split per tile up to min_tiles splits, then at least min_tiles tiles each.
            let tiles = count.div_ceil(ATT_T);
            assert!(n <= tiles, "{count}: {n} splits");
            if tiles <= min_tiles {
                assert_eq!(n, tiles.min(solo), "{count}/{min_tiles}: {n} x {len}");
            } else {
                assert!(
                    n <= min_tiles.max(tiles.div_ceil(min_tiles)),
                    "{count}/{min_tiles}: {n}"
                );
            }
            // Floor: past min_tiles splits, none shorter than min_tiles tiles but the last, and
            // never more splits than the ceiling rule gives.
            if floor && n > min_tiles {
                assert!(
                    len >= min_tiles * ATT_T && n * min_tiles <= tiles,
                    "{count}/{min_tiles}: {n} x {len}"
                );
                assert!(
                    n <= row_split(count, solo, min_tiles).0,
                    "{count}/{min_tiles}"
                );
            }
            // One tile: a split per tile up to `solo` (the plan before min_tiles).
            if min_tiles == 1 {
                let n1 = solo.min(count.div_ceil(ATT_T));
                let l1 = count.div_ceil(n1).div_ceil(ATT_T) * ATT_T;
                assert_eq!((n, len), (count.div_ceil(l1), l1));
            }
        }
    }

    #[test]
    fn deep_rows_take_longer_splits_past_the_split_cap() {
        // 2 KV heads on 132 SMs: at most ATTN_MAX_SPLITS splits whatever the depth, and up to
        // 8,192 positions the plan it had without the cap (one split per 8 tiles).
        let solo = solo_splits(2, 132);
        assert_eq!(solo, ATTN_MAX_SPLITS.min(132));
        for count in [2049, 4097, 8192] {
            let (n, len) = row_split(count, solo, 8);
            assert_eq!((n, len), row_split(count, 132, 8), "{count} positions");
        }
        for count in [16384, 32768, 65536] {
            let (n, len) = row_split(count, solo, 8);
            assert!(
                n <= ATTN_MAX_SPLITS && n * len >= count,
                "{count}: {n} x {len}"
            );
            assert!(
                n > ATTN_MAX_SPLITS / 2 && len > 8 * ATT_T,
                "{count}: {n} x {len}"
            );
        }
    }

    #[test]
    fn looped_attention_splits_fill_one_wave_and_take_every_split_once() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            xorshift(&mut rng);
            let n_kv = 1 + (rng % 16) as usize;
            let rows = 1 + (rng >> 8) as usize % 600;
            let wave = 132 * (1 + (rng >> 20) as usize % 8);
            let solo = solo_splits(n_kv, 132);
            let z = attn_loop_splits(solo, n_kv * rows, wave);
            assert!((1..=solo).contains(&z), "{n_kv} x {rows}: {z} of {solo}");
            // One wave at most, unless one block per pair is already more.
            assert!(z == 1 || z * n_kv * rows <= wave, "{n_kv} x {rows}: {z}");
            // As many as fit: one more block per pair would pass the wave (or solo).
            assert!(
                z == solo || (z + 1) * n_kv * rows > wave,
                "{n_kv} x {rows}: {z}"
            );
            // pdl_wait_attn_rows_mma_loop: block z takes splits z, z + Z, .. < solo.
            let mut seen = vec![0u8; solo];
            for b in 0..z {
                for s in (b..solo).step_by(z) {
                    seen[s] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{solo} splits over {z}");
        }
    }

    #[test]
    fn attention_plan_covers_every_position_once() {
        for &(count, rows, n_kv) in &[
            (1usize, 1usize, 2usize),
            (129, 1, 2),
            (4096, 1, 2),
            (8192, 1, 2),
            (65536, 1, 2),
            (512, 512, 2),
            (33, 9, 8),
            (4607, 64, 2),
        ] {
            let p = attention_plan(count, rows, n_kv, 16, 132);
            assert!(p.n_splits >= 1 && p.split_len.is_multiple_of(ATT_T) && p.split_len > 0);
            assert!(
                p.chunks >= 1 && 16 % p.chunks == 0 && 16 / p.chunks >= 2,
                "{p:?}"
            );
            assert!(p.n_splits * p.split_len >= count, "{count}: {p:?}");
            assert!(
                (p.n_splits - 1) * p.split_len < count,
                "{count}: an empty split in {p:?}"
            );
        }
        // Decode over a long context fills the machine; 512 rows at once need no split.
        assert!(attention_plan(8192, 1, 2, 16, 132).n_splits >= 32);
        assert_eq!(
            attention_plan(512, 512, 2, 16, 132),
            AttnPlan {
                n_splits: 1,
                split_len: 512,
                chunks: 1
            }
        );
        // Short decode contexts spread the 16 heads of a KV head over several blocks.
        let p = attention_plan(129, 1, 2, 16, 132);
        assert_eq!((p.n_splits, p.chunks), (5, 8));
    }
}
