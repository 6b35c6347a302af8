//! Host side of `kernels/matvec.cu`, `kernels/mmk.cu` and `kernels/mmt.cu`: weight upload (Q6_K
//! and Q8_0 repacked into 16-byte aligned planes), activation quantization, and launches of
//! several matrices sharing one input for any number of columns. One column of a K-quant runs
//! on `mvk_1` / `mvk_silu_1` (the work split into tasks of 4 rows x 4 super-blocks over one full
//! wave of warps), of the other formats on `matvec_1`; two or more columns of a K-quant (decode
//! groups, and prefill chunks that mmh.rs does not take) on the integer tensor cores (`mmk_*` up
//! to 16 columns, as `mmv_*` from 2: the same tiles over one full wave; `mmt_4` up to 63, `mmt_8`
//! from 64), all in the canonical order of common.cuh,
//! so a sequence's decode results never depend on its group; the other formats on
//! `matvec_cols` (groups of 8 columns, the same per-column arithmetic as one column; 64 columns
//! per launch). Prefill chunks on sm_90: mmh.rs (f16 warpgroup MMAs).

use crate::device::{CudaError, Gpu};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use muser_gguf::GgmlType;
use rayon::prelude::*;

/// A weight matrix on the GPU: `rows` rows of `cols` values, in its GGUF layout (F32, F16, BF16)
/// or repacked (the K-quants' blocks interleaved by row quads, Q6_K and Q8_0 in planes: see
/// `repack`).
pub struct DeviceMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: CudaSlice<u8>,
}

/// Scratch for one quantized activation of up to `cap` values (columns x K).
pub struct ActScratch {
    pub q: CudaSlice<i8>,
    pub ds: CudaSlice<f32>, // (cap / 32, 2)
    pub bs: CudaSlice<i8>,  // (cap / 256, 16): Q8_K sub-block sums split as lo + 64 hi
    pub cap: usize,
    /// The int8 activation in `q` is in the k-major layout (`xq16` in matvec.cu).
    pub kmajor: bool,
    /// The same activation in `mmw_*`'s layout, written with it by its producer
    /// (`Gpu::mmw_prepack`); `None` when `q` was written without it. Every writer of `q` sets it.
    pub packed: Option<MmwPacked>,
}

/// A Q8_K producer kernel's `xblob, nt` arguments for `packed` ((0, 0): no mmw layout).
pub fn packed_args(packed: Option<MmwPacked>) -> (u64, i32) {
    packed.map_or((0, 0), |p| (p.blob, p.nt as i32))
}

/// An activation of `ncols` columns of width `k` in `mmw_*`'s layout of `nt` column tiles at
/// `blob` (common.cuh: mmw_xb), valid while the blob's write count is still `gen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmwPacked {
    pub blob: u64,
    pub nt: usize,
    pub k: usize,
    pub ncols: usize,
    gen: u64,
}

/// The `mvk_*` kernels' scratch (`Gpu::split_scratch`).
#[derive(Default)]
pub struct SplitScratch {
    cv: Option<CudaSlice<f32>>,
    cnt: Option<CudaSlice<u32>>,
    /// `mmw_pack`'s activation regions (`Gpu::mmw_blob`).
    blob: Option<CudaSlice<u8>>,
    /// How many writes of the blob have been asked for (`Gpu::mmw_blob_write`).
    blob_gen: u64,
}

/// Columns one warp of `matvec_cols` handles.
pub const GROUP_COLS: usize = 8;
/// Columns one `matvec_cols` launch handles at most (8 groups of 8); more are looped over. (The
/// K-quants run every width from 2 columns on the tensor-core tiles of mmk.cu.)
pub const MAX_COLS: usize = 64;
/// Matrices one launch handles at most (`MatvecJobs` in matvec.cu).
pub const MAX_JOBS: usize = 4;
/// Rows per warp of the matvec kernels (MATVEC_R in matvec.cu).
pub const MATVEC_R: usize = 4;

/// Rows one block of the `mmk_*` kernels takes (MMK_ROWS in mmk.cu): one MMA tile, K split over 4 warps.
pub const MMK_ROWS: usize = 16;

/// Whether `ncols` columns of a `ty` matrix of width `k` run on the tensor-core tiles of mmk.cu:
/// the K-quants from 2 columns on (decode groups and prefill). `MUSER_CUDA_MMK=0` keeps them on
/// `matvec_cols` (groups of 64 at most per launch; same bits, for A/B runs).
pub fn uses_mmk(ty: GgmlType, ncols: usize, k: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    ncols >= 2
        && k.is_multiple_of(256)
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
        && *ON.get_or_init(|| std::env::var("MUSER_CUDA_MMK").map_or(true, |v| v != "0"))
}

/// Whether `ncols` columns of a `ty` matrix of width `k` run on `mvk_1` (one column of a
/// K-quant, the work split by chunks over a grid that fills the GPU once; matvec.cu).
/// `MUSER_CUDA_MVK=0` keeps them on `matvec_1` (same bits, for A/B runs).
pub fn uses_mvk(ty: GgmlType, ncols: usize, k: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    ncols == 1
        && k.is_multiple_of(256)
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
        && *ON.get_or_init(|| std::env::var("MUSER_CUDA_MVK").map_or(true, |v| v != "0"))
}

/// Chunks of KQ_CHUNK (4) super-blocks in a row of `k` values (the `mvk_*` tasks' unit).
pub fn mvk_chunks(k: usize) -> usize {
    (k / 256).div_ceil(4)
}

/// mvk_silu_1's flag (matvec.cu): the shared row quads left to `silu_finish_q8k`.
const MVK_DEFER_SHARED: i32 = 2;

/// Whether one-column gate+up launches whose output is quantized next leave their shared row
/// quads to `silu_finish_q8k` (on unless `MUSER_CUDA_SILU_FINISH=0`).
fn silu_finish() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MUSER_CUDA_SILU_FINISH").map_or(true, |v| v != "0"))
}

/// The names in `MUSER_CUDA_ABLATE` (comma-separated): ops the backend leaves out of every step,
/// and `shared_quads` (`mvk_flags`); a measuring switch whose output is wrong by design.
pub fn ablated_names() -> &'static [String] {
    static A: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    A.get_or_init(|| {
        std::env::var("MUSER_CUDA_ABLATE")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    })
}

/// The `mvk_*` kernels' flags: MVK_SKIP_SHARED (1) when `MUSER_CUDA_ABLATE` names
/// `shared_quads` (matvec.cu).
pub fn mvk_flags() -> i32 {
    i32::from(ablated_names().iter().any(|s| s == "shared_quads"))
}

/// The warps [wa, wb) and tasks [ta, tb) of each job of a one-column launch over `ww` warps, jobs
/// starting at row `starts[j]` (multiples of `unit`), as `mvk_share` in common.cuh divides them:
/// each job a share of the warps in proportion to its tasks, and at least one.
pub fn mvk_shares(starts: &[usize], nch: usize, unit: usize, ww: usize) -> Vec<[usize; 4]> {
    let nj = starts.len() - 1;
    let t_all = starts[nj] / unit * nch;
    let ts = |u: usize| starts[u] / unit * nch;
    let ws = |u: usize| {
        if u < nj {
            u + (ww - nj) * ts(u) / t_all
        } else {
            ww
        }
    };
    (0..nj)
        .map(|j| [ws(j), ws(j + 1), ts(j), ts(j + 1)])
        .collect()
}

/// Whether `mvk_1_spread` takes a launch (of `quads` row quads in `njobs` jobs): one job, and
/// `mvk_blocks` would give it one warp per row quad (3 / 4 of the grid's warps or more), which
/// `mvk_1_spread` spreads over the full grid instead.
pub fn mvk_spread_fits(njobs: usize, quads: usize, sms: usize) -> bool {
    let warps = sms.max(1) * 16;
    njobs == 1 && quads <= warps && 4 * quads >= 3 * warps
}

/// Whether `mvk_1_whole` takes a launch: every job has Q row quads on W warps with W < Q < 2 W
/// (`mvk_span_whole` in common.cuh gives each warp one whole quad after its share of the Q - W
/// left over).
pub fn mvk_whole_fits(starts: &[usize], nch: usize, ww: usize) -> bool {
    mvk_shares(starts, nch, 4, ww)
        .iter()
        .all(|&[wa, wb, ta, tb]| {
            let (nw, nq) = (wb - wa, (tb - ta) / nch);
            nq > nw && nq < 2 * nw
        })
}

/// Blocks (of 4 warps) of an `mvk_*` launch over `quads` row quads of `per` tasks each (a round
/// takes 2 tasks per warp): the GPU filled once (4 blocks per SM, the kernels' launch bounds).
/// When one warp per row quad fills at least 3/4 of that (attn_output at the Glimmer shapes),
/// one warp per row quad instead: no row quad is shared between warps, so no chunk values go
/// through memory. (H200, llama-glimmer, ncu: attn_output 12.6 us against 15.1 split; the
/// q+k+v launch, 55% full that way, 23.8 against 17.8.) One-job launches of that kind run on
/// `mvk_1_spread` over the full grid instead (`mvk_spread_fits`), their warps 3 or 4 a block.
pub fn mvk_blocks(quads: usize, per: usize, sms: usize) -> u32 {
    let (most, warps) = (sms.max(1) * 4, sms.max(1) * 16);
    if quads <= warps && 4 * quads >= 3 * warps {
        quads.div_ceil(4) as u32
    } else {
        (quads * per).div_ceil(2).div_ceil(4).clamp(1, most) as u32
    }
}

/// Blocks of an `mmv_*` launch of `tasks` tasks (16 rows x one chunk): one full wave of
/// `per_sm` blocks of 4 warps per SM, fewer when there are fewer tasks than warps.
/// H200, llama-glimmer, same call (2026-11-30): at least one task per warp against at least two
/// (half the warps): 8 streams 878.8 / 878.5 against 864.5 / 863.4 tokens/s.
/// Lab run 87 (H100, 2026-12-05: no gain at 1, 8 or 32 streams, so off): with
/// `MUSER_CUDA_MMV_SPREAD=1`, from 3/4 of the full wave's warps on, the full wave, its warps
/// taking 0 or 1 task spread evenly by `mvk_span` (as `mvk_1_spread` does for one column), where
/// the packed grid leaves some SMs a block more than others. One task is one chunk of 16 rows
/// either way, so the bits are the same.
pub fn mmv_blocks(tasks: usize, sms: usize, per_sm: usize) -> u32 {
    static SPREAD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let spread =
        *SPREAD.get_or_init(|| std::env::var("MUSER_CUDA_MMV_SPREAD").is_ok_and(|v| v == "1"));
    mmv_grid(tasks, sms, per_sm, spread)
}

/// `mmv_blocks` with the spread given (`spread`: run 87's full wave from 3/4 of its warps on).
pub fn mmv_grid(tasks: usize, sms: usize, per_sm: usize, spread: bool) -> u32 {
    let full = sms.max(1) * per_sm;
    if spread && 4 * tasks >= 3 * 4 * full {
        return full as u32;
    }
    tasks.div_ceil(4).clamp(1, full) as u32
}

/// The `mmv_*` kernel for a decode group of `ncols` columns when they are `on` (`Gpu::mmv`):
/// (name, blocks per SM). `mmv_1` / `mmv_silu_1` (up to 8 columns, 128 registers: 4 blocks per
/// SM) from `mmv_min` columns, `mmv_2` / `mmv_silu_2` (9 to 16, 168 registers: 3 blocks per SM).
/// Otherwise (and past 16) the `mmk_*` / `mmt_*` tiles. Groups that `group_launch` gives to
/// `mmw_*` (from `mmw_narrow_min` columns) do not run here. H200, llama-glimmer, aggregate tg128
/// tokens/s, mmk_2 / mmv_2, same call (2026-11-30): 12 streams 1007.8 / 1077.9 and 1016.4 /
/// 1070.4, 16 streams 1226.9 / 1337.7 and 1228.7 / 1334.8.
pub fn mmv_kernel(ncols: usize, silu: bool, on: bool) -> Option<(String, usize)> {
    let (nt, per_sm) = match ncols {
        n if n < mmv_min() || !on => return None,
        0..=8 => (1, 4),
        9..=16 => (2, 3),
        _ => return None,
    };
    Some((
        format!("mmv_{}{nt}", if silu { "silu_" } else { "" }),
        per_sm,
    ))
}

/// Shared-memory slots of one `mmv_*` warp's ring (mmk.cu: MmvStage): the super-blocks each warp
/// copies ahead of its arithmetic with cp.async, `stages - 1` of them. 2 for `mmv_1` /
/// `mmv_silu_1` (`nt` = 1 column tile), 3 for `mmv_2` / `mmv_silu_2`, or `MUSER_CUDA_MMV_STAGES`
/// (2 to 4) for both. H200, llama-glimmer, aggregate tg128 tokens/s, weights read from global
/// memory (before) / 2 / 3 stages, same call (2026-11-30): 8 streams 890.7 / 920.3 / 894.3 and
/// 887.7 / 919.8 / 894.4, 16 streams 1349.7 / 1201.5 / 1347.5 and 1345.0 / 1202.8 / 1351.2.
pub fn mmv_stages(nt: usize) -> usize {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    N.get_or_init(|| env_usize("MUSER_CUDA_MMV_STAGES"))
        .unwrap_or(if nt == 1 { 2 } else { 3 })
        .clamp(2, 4)
}

/// An `mmv_*` launch's last arguments: the split scratch (chunk values, counts) and the stages.
type MmvTail = (u64, u64, i32);

/// Pushes an `mmv_*` kernel's arguments after its weights: the activation (KACT_ARGS in mmk.cu:
/// `mmk_act`'s addresses and integers), then `tail`.
fn mmv_args<'a>(
    b: &mut cudarc::driver::LaunchArgs<'a>,
    p: &'a [u64; 3],
    i: &'a [i32; 3],
    tail: &'a MmvTail,
) {
    b.arg(&p[0]).arg(&p[1]).arg(&p[2]);
    b.arg(&i[0]).arg(&i[1]).arg(&i[2]);
    b.arg(&tail.0).arg(&tail.1).arg(&tail.2);
}

/// Bytes of one slot (mmk.cu: MMV_SLOT_ONE, MMV_SLOT_PAIR): 16 rows of one super-block, the
/// largest format's (Q6_K, rows padded to 208 bytes, then scales and d) or gate's and up's
/// (Q4_K).
pub const MMV_SLOT_ONE: usize = 16 * 208 + 16 * 16 + 16 * 2;
pub const MMV_SLOT_PAIR: usize = 2 * 16 * 144;

/// Dynamic shared memory of an `mmv_*` block of 4 warps.
pub fn mmv_smem(silu: bool, stages: usize) -> usize {
    4 * stages * if silu { MMV_SLOT_PAIR } else { MMV_SLOT_ONE }
}

/// The fewest columns that run on `mmv_*` (fewer: `mmk_*`): 2 (every decode group up to 8
/// columns), or `MUSER_CUDA_MMV_MIN`. On 2026-11-30 `mmk_1` still won below 6 columns (3 streams
/// 357.2 / 351.9, 4 streams 471.3 / 463.0). Since `mmv_*` issues fewer instructions (4ca8e2e),
/// it wins at every width from 2. H200, llama-glimmer, aggregate tg128 tokens/s,
/// `MUSER_CUDA_MMV_MIN` 6 / 4 / 2, same call (2026-12-03 14:30): 2 streams 262.67 / 262.46 /
/// **287.96**, 3 streams 385.73 / 388.39 / **428.66**, 4 streams 501.74 / 573.82 / **571.78**, 8
/// streams 1,068.44 / 1,069.13 / 1,064.67 (the same kernels). The full parity command passed with
/// this default (1,235 of 1,235, groups of 1 to 32 bit-identical to solo on three models), and
/// `muser serve` with 4 clients made 531-537 completion tokens/s against 474-479 with 6.
pub fn mmv_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| env_usize("MUSER_CUDA_MMV_MIN").unwrap_or(2))
}

/// The `mvk_*` kernels split the work in 32-bit arithmetic: tasks x warps must stay below 2^32
/// (Glimmer's LM head: 353,584 x 2,112 = 7.5e8).
pub fn mvk_fits(tasks: usize, blocks: u32) -> Result<(), CudaError> {
    if (tasks as u64) * (blocks as u64) * 4 < 1 << 32 {
        Ok(())
    } else {
        Err(CudaError::Unsupported(format!(
            "a one-column matvec of {tasks} chunk tasks over {blocks} blocks is too large to split"
        )))
    }
}

/// Rows one block of the `mmt_*` kernels takes (MMT_ROWS in mmt.cu): 16 per warp, each warp the
/// whole of K.
pub const MMT_ROWS: usize = 64;

/// Launch and kernel of `ncols` (2 or more) tensor-core columns over `rows` rows, and the row
/// block each job's rows are padded to: up to 16 columns `mmk_1` / `mmk_2` (mmk.cu: blocks of 16
/// rows x 8 or 16 columns, 4 warps splitting K), more `mmt_4` (mmt.cu: blocks of 64 rows x 32
/// columns staged in shared memory, each warp 16 rows and the whole of K), from `mmt8_min`
/// (64) columns `mmt_8` (64 rows x 64 columns, dynamic shared memory: MMT8_SMEM); the
/// `*_silu_*` twins when `silu`. H200, llama-glimmer, same call: pp512 3080 tokens/s on mmt_4
/// against 1891 on v10's mmk_4, 32 streams 880 against 826; at 8 streams mmt with 8-column tiles
/// was slower (365 against 443), so groups up to 16 stay on mmk.cu; pp512 3495 -> 3794 on mmt_8
/// (2026-11-30).
pub fn mmk_launch(ncols: usize, rows: usize, silu: bool) -> (LaunchConfig, String, usize) {
    mmk_launch_upto(ncols, rows, silu, mmk_cols(), mmt8_min())
}

/// `mmk_launch` for matrices of `types`, except that groups of `mmt8_min` or more columns which
/// `mmw_*` takes (`mmw_route`, `mmw` on, a row-major activation) run on its 24- or 32-column
/// tiles side by side rather than on `mmt_8`. H200, llama-glimmer, same call (2026-12-02): 64
/// streams 1791.50 tokens/s on mmt_8 against 2493.62 on two mmw_4 tiles (32 streams 2221.89 /
/// 2210.89 and pp512 5740 / 5735 unchanged: neither runs mmt_8). Groups of `mmw_narrow_min`
/// to 16 columns that `mmw_*` takes run on one 16-column tile: the name `mmt_2` /
/// `mmt_silu_2` (which has no `mmt_*` kernel: the launch renames it `mmw_*`, as `mmw_route`
/// says), 64-row blocks.
pub fn group_launch(
    ncols: usize,
    rows: usize,
    silu: bool,
    types: &[GgmlType],
    kmajor: bool,
    mmw: bool,
) -> (LaunchConfig, String, usize) {
    if mmw_narrow(ncols) {
        let name = format!("mmt_{}2", if silu { "silu_" } else { "" });
        if mmw_route(mmw, &name, types, kmajor).is_some() {
            let cfg = LaunchConfig {
                grid_dim: (1, rows.div_ceil(MMT_ROWS) as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            return (cfg, name, MMT_ROWS);
        }
    }
    let tile = if silu { "mmt_silu_4" } else { "mmt_4" };
    let wide = match mmw_route(mmw, tile, types, kmajor) {
        Some(_) => usize::MAX,
        None => mmt8_min(),
    };
    mmk_launch_upto(ncols, rows, silu, mmk_cols(), wide)
}

/// The fewest columns of a decode group of up to 16 that runs on one 16-column `mmw_2` tile
/// (and its twins; `group_launch`) where `mmw_route` takes the launch, instead of `mmv_*`: 9,
/// or `MUSER_CUDA_MMW_NARROW` (9 to 16; 17 keeps every such group on `mmv_*`). H200,
/// llama-glimmer, aggregate tg128 tokens/s, `mmv_*` / the 8- and 16-column tiles from 2 columns
/// (an `mmw_1` since removed) / from 9, one call alternated (2026-12-03): 4 streams 486.33 /
/// 447.89 and 486.06 / 447.60 / 485.29, 8 streams 961.85 / 882.64 and 971.32 / 882.94 / 965.24,
/// 12 streams 1090.96 / 1225.31 and 1093.44 / 1229.84 / 1229.59, 16 streams 1377.83 / 1615.30
/// and 1385.50 / 1635.11 / 1639.84.
pub fn mmw_narrow_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        env_usize("MUSER_CUDA_MMW_NARROW")
            .filter(|&n| n >= 9)
            .unwrap_or(9)
    })
}

/// Whether a decode group of `ncols` columns is one `mmw_2` takes (where `mmw_route` takes its
/// matrices): `mmw_narrow_min` to 16 columns.
pub fn mmw_narrow(ncols: usize) -> bool {
    (mmw_narrow_min()..=16).contains(&ncols)
}

/// The column tiles (8 columns each) of a decode group of `ncols` columns on `mmw_*`: two up
/// to 16 columns (`mmw_narrow_min`), else `mmt_tile_nt`.
pub fn mmw_group_nt(ncols: usize) -> usize {
    if ncols <= 16 {
        2
    } else {
        mmt_tile_nt(ncols)
    }
}

/// The widest group that runs on `mmk_*` (more columns run on `mmt_*`): 16, or what
/// `MUSER_CUDA_MMK_COLS` asks for (16, 32, 48 or 64; wider groups then run as several 16-column
/// `mmk_2` tiles side by side, each reading the row block's weights, which L2 shares). An A/B
/// switch; 16 stays: H200, llama-glimmer, same call (2026-11-30), tg64 aggregate at 32 / 24
/// streams: 16 -> 1422.14 / 1156.20 and 1393.66 / 1180.38, 32 -> 1136.02 / 990.83 and
/// 1162.18 / 1018.85, 64 -> 1134.62 / 977.16.
pub fn mmk_cols() -> usize {
    static COLS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COLS.get_or_init(|| {
        env_usize("MUSER_CUDA_MMK_COLS")
            .filter(|c| [16, 32, 48, 64].contains(c))
            .unwrap_or(16)
    })
}

/// `mmk_launch` with groups of up to `mmk_cols` (a multiple of 16) columns on `mmk_*`, and from
/// `wide_min` columns on `mmt_8`.
pub fn mmk_launch_upto(
    ncols: usize,
    rows: usize,
    silu: bool,
    mmk_cols: usize,
    wide_min: usize,
) -> (LaunchConfig, String, usize) {
    let (family, nt, block_rows) = match ncols {
        0..=8 => ("mmk", 1, MMK_ROWS),
        n if n <= mmk_cols.max(16) => ("mmk", 2, MMK_ROWS),
        n if n < wide_min => ("mmt", mmt_tile_nt(n), MMT_ROWS),
        _ => ("mmt", 8, MMT_ROWS),
    };
    let name = format!("{family}_{}{nt}", if silu { "silu_" } else { "" });
    let cfg = LaunchConfig {
        grid_dim: (
            ncols.div_ceil(8 * nt) as u32,
            rows.div_ceil(block_rows) as u32,
            1,
        ),
        block_dim: (128, 1, 1),
        shared_mem_bytes: if nt == 8 { MMT8_SMEM as u32 } else { 0 },
    };
    (cfg, name, block_rows)
}

/// The 8-column MMA tiles per warp of a decode group of `n` (17..63) columns on `mmt_*`: 3
/// (24-column blocks, `mmt_3`) where that runs fewer tiles than 4 (32-column blocks, `mmt_4`):
/// 17-24 and 33-48 columns, whose last 32-column tile would be a quarter or more empty (its
/// MMAs and scale multiply-adds run whether or not its columns exist). `MUSER_CUDA_MMT_NT=4`
/// keeps 4 everywhere (an A/B knob).
pub fn mmt_tile_nt(n: usize) -> usize {
    static ONLY4: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let only4 = *ONLY4.get_or_init(|| env_usize("MUSER_CUDA_MMT_NT") == Some(4));
    if !only4 && n.div_ceil(24) * 3 < n.div_ceil(32) * 4 {
        3
    } else {
        4
    }
}

/// The tile kernels (mmt.cu's `MmtPlan`) address a matrix's bytes with 32-bit offsets: an error
/// naming the matrix's size for one of 4 GiB or more (no Muse Glimmer matrix comes near: the
/// largest, the LM head, is about 1.1 GB). Checked when a K-quant matrix is loaded
/// (`CudaBackend::weight`) and again at each tile launch.
pub fn mmt_fits(bytes: usize) -> Result<(), CudaError> {
    if (bytes as u64) < 1 << 32 {
        Ok(())
    } else {
        Err(CudaError::Unsupported(format!(
            "a K-quant matrix of {bytes} bytes is too large for the tensor-core tile kernels (4 GiB at most)"
        )))
    }
}

/// Dynamic shared memory of `mmt_8` / `mmt_silu_8` (mmt.cu): two stages of 64 rows' weights and
/// 64 columns' activations (Q5_K, the largest: 64 x 224 + 64 x (288 + 24) bytes each), then the
/// gate's outputs parked while the up matrix runs (128 threads x 32 floats).
pub const MMT8_SMEM: usize = 2 * (64 * 224 + 64 * (288 + 24)) + 128 * 32 * 4;

/// The bytes of one super-block's activation region of an 8 `nt`-column tile of `mmw_*`
/// (mmt.cu `mmw_xb`): the int8 values, the Q8_K scales and the split sums (as halves) of each
/// column.
pub const fn mmw_xb(nt: usize) -> usize {
    8 * nt * (256 + 4 + 32)
}

/// Dynamic shared memory of `mmw_*` with `nt` column tiles (mmt.cu `mmw_smem`): three stages of
/// 64 rows' weights (Q6_K's, the largest: 16 quads of quants 784 bytes apart and their scales)
/// and the tile's activation region, or Q4_K's two stages of two super-blocks' weights and
/// regions (mmt.cu `MmwGeo`), whichever is larger, then the stages' six mbarriers.
pub const fn mmw_smem(nt: usize) -> usize {
    let three = 3 * (16 * 784 + 64 * 16 + mmw_xb(nt));
    let pairs = 2 * 2 * (64 * 144 + mmw_xb(nt));
    (if three > pairs { three } else { pairs }) + 16 * 3
}

/// The column tiles (3 or 4) of the `mmw_*` launch that replaces the tile launch `name`
/// (`mmt_3`, `mmt_4`, `mmt_silu_3`, `mmt_silu_4`: decode groups of 17-63 columns) over
/// matrices of `types` (Q4_K, Q5_K, Q6_K), when `on` (`Gpu::mmw`) and the int8 activation is
/// row-major. A fused gate+up stays on `mmt_silu_*` when either matrix is Q6_K (mmw_q6 lays a
/// warp's rows out differently from the others, which the SiLU's pairs of gate and up outputs
/// cannot mix, and two Q6_K ones ran slower: H200, lab run 25, 2 x 4096 x 6656 at 32 columns,
/// 118.6 us against 83.3).
pub fn mmw_route(on: bool, name: &str, types: &[GgmlType], kmajor: bool) -> Option<usize> {
    let nt = match name {
        "mmt_2" | "mmt_silu_2" => 2,
        "mmt_3" | "mmt_silu_3" => 3,
        "mmt_4" | "mmt_silu_4" => 4,
        _ => return None,
    };
    let formats = !types.is_empty()
        && types
            .iter()
            .all(|t| matches!(t, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K));
    let silu_q6 = name.contains("silu") && types.contains(&GgmlType::Q6_K);
    (on && !kmajor && formats && !silu_q6).then_some(nt)
}

/// The fewest columns that run on 64-column tiles (`mmt_8`) where `mmw_*` does not take the
/// launch (`group_launch`): 64, or `MUSER_CUDA_MMT8_MIN` (an A/B knob; a value past every
/// launch keeps `mmt_4`).
pub fn mmt8_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| env_usize("MUSER_CUDA_MMT8_MIN").unwrap_or(64))
}

/// The (width, rows) that a gate and an up matrix share, or an error naming both shapes.
pub fn gate_up_shape(gate: &DeviceMatrix, up: &DeviceMatrix) -> Result<(usize, usize), CudaError> {
    if up.cols != gate.cols || up.rows != gate.rows {
        return Err(CudaError::Unsupported(format!(
            "gate {}x{} and up {}x{} differ in shape",
            gate.rows, gate.cols, up.rows, up.cols
        )));
    }
    Ok((gate.cols, gate.rows))
}

/// The value of the environment variable `name` as a count, if it is set and one.
pub fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// K splits of an `mmt_4` launch of `blocks` blocks over rows of `chunks` chunks of 4
/// super-blocks (`mmt_split_4`, each split a range of chunks, the tile's sum completed in chunk
/// order by the last split): when `on` (`Gpu::mmt_split`), launches of fewer blocks than
/// `split_upto` per SM are split to finish in whole waves soonest (`split_count`); else 1, no
/// split.
pub fn mmt_splits(on: bool, blocks: usize, chunks: usize, sms: usize) -> usize {
    if on {
        split_count(blocks, chunks, sms)
    } else {
        1
    }
}

/// `mmt_splits` when on: 1 from `split_upto` blocks per SM on, else `split_waves` (the default,
/// `MUSER_CUDA_MMT_FILL=waves[:F]`). `MUSER_CUDA_MMT_FILL=floor`: the most splits (at least 2)
/// whose blocks all fit in one wave of 3 per SM (`mmt_*` run 3 blocks per SM), at most one per
/// chunk; `ceil`: the fewest splits that reach 3 blocks per SM, whose last blocks then run in a
/// second, nearly empty wave (ffn_down and attn_output at 32 columns: 416 blocks for 396
/// places). H200, llama-glimmer, 32 streams, two calls: 1370.4 / 1422.3 tokens/s with `ceil`,
/// 1386.0 / 1456.1 with `floor` (2026-11-30). `waves` against `floor`, alternated three times
/// in one call (2026-12-01): 20 streams 1261.93 / 1266.34 / 1269.89 against 1226.04 / 1241.66 /
/// 1247.00, 32 streams 1881.09 / 1842.40 / 1900.55 against 1809.59 / 1856.75 / 1859.39; per op at
/// 32 streams ffn_down 5.51 / 5.41 ms a step against 5.64 / 5.73 (7 splits of 20 chunks instead
/// of 3), q+k+v+gate unchanged (5 splits instead of 2).
fn split_count(blocks: usize, chunks: usize, sms: usize) -> usize {
    match mmt_fill() {
        MmtFill::Waves(f) => split_waves(blocks, chunks, sms, f, split_upto()),
        MmtFill::Splits(n) if blocks < split_upto() * sms => n.clamp(1, chunks.max(1)),
        MmtFill::Splits(_) => 1,
        fill => split_count_as(blocks, chunks, sms, fill == MmtFill::Floor),
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum MmtFill {
    Floor,
    Ceil,
    /// `MUSER_CUDA_MMT_FILL=waves[:F]` (`split_waves`), F the fixed cost of a block.
    Waves(f64),
    /// `MUSER_CUDA_MMT_FILL=splits:N` (an A/B knob): N splits (at most one a chunk) for every
    /// launch that `split_waves` would consider.
    Splits(usize),
}

fn mmt_fill() -> MmtFill {
    static FILL: std::sync::OnceLock<MmtFill> = std::sync::OnceLock::new();
    *FILL.get_or_init(|| match std::env::var("MUSER_CUDA_MMT_FILL").as_deref() {
        Ok("ceil") => MmtFill::Ceil,
        Ok("floor") => MmtFill::Floor,
        Ok(v) if v.starts_with("splits:") => {
            MmtFill::Splits(v["splits:".len()..].parse().unwrap_or(1))
        }
        Ok(v) => MmtFill::Waves(
            v.strip_prefix("waves:")
                .and_then(|f| f.parse().ok())
                .unwrap_or(0.01),
        ),
        Err(_) => MmtFill::Waves(0.01),
    })
}

/// The blocks per SM from which `split_waves` leaves a launch unsplit: 4, or
/// `MUSER_CUDA_MMT_SPLIT_UPTO` (an A/B knob). From 4 on, the launches of wide decode groups
/// that run in a little over one wave split too: ffn_down and attn_output at 97-128 columns
/// (416 blocks for 396 places: two waves, the second of 20 blocks). H200, llama-glimmer, one
/// call alternating 2 / 4 / 8 / 4 / 2 (2026-12-02): 128 streams 2337.42 / 2723.00 / 2682.89 /
/// 2700.44 / 2352.78 tokens/s, 96 streams 2662.68 / 2713.80 / 2701.13 / 2720.10 / 2695.97, 64
/// streams unchanged (~2500); ffn_down at 128 streams 19.3 -> 13.3 ms a step.
fn split_upto() -> usize {
    static UPTO: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *UPTO.get_or_init(|| env_usize("MUSER_CUDA_MMT_SPLIT_UPTO").unwrap_or(4))
}

/// The splits that finish a launch of `blocks` full-K blocks soonest when the GPU runs 3 blocks
/// per SM and a split of 1/S of K costs 1/S + f of a full block (f: its fixed cost: the wait,
/// the first stage, the merge), in whole waves: ceil(blocks S / 3 SMs) (1 / S + f); the fewest
/// splits within 1% of the best. Launches of `upto` blocks per SM or more stay unsplit.
///
/// Launches whose blocks of one chunk each fill at most two waves take one chunk a split: the
/// waves above were counted for splits of 1/S of K, but a split is a range of whole chunks, so
/// q+k+v's 7 chunks in 5 splits were 1 or 2 chunks a block and attn_output's 4 in 3 were 1 or 2:
/// the block of 2 chunks held the launch. H200, llama-glimmer, step trace at 32 streams
/// (2026-12-04): q+k+v 21.29 -> 19.48 us a layer (7 splits of 504 blocks), attn_output 17.91 ->
/// 15.54 (4 splits of 416), ffn_down (20 chunks: 7 splits either way) unchanged; aggregate tg128
/// tokens/s at 16 / 24 / 32 streams, one call, alternated: 1,663.21 / 2,227.84 / 2,630.26 and
/// 1,667.20 / 2,239.39 / 2,653.91 before, 1,703.36 / 2,274.18 / 2,673.42 after (+1.2-2.3%; the
/// same in an earlier call: 32 streams 2,591.22 / 2,585.65 -> 2,643.69). Splits in pairs of
/// super-blocks instead (5 and 3 splits of 2-3 pairs, one wave; lab README run 61) lost: 16.59 us
/// for attn_output, 23.14 for q+k+v.
fn split_waves(blocks: usize, chunks: usize, sms: usize, f: f64, upto: usize) -> usize {
    if blocks == 0 || blocks >= upto * sms {
        return 1;
    }
    let slots = 3 * sms.max(1);
    if blocks * chunks <= 2 * slots {
        return chunks.max(1);
    }
    let cost = |s: usize| (blocks * s).div_ceil(slots) as f64 * (1.0 / s as f64 + f);
    let best = (1..=chunks.max(1)).map(cost).fold(f64::INFINITY, f64::min);
    (1..=chunks.max(1))
        .find(|&s| cost(s) <= best * 1.01)
        .unwrap_or(1)
}

fn split_count_as(blocks: usize, chunks: usize, sms: usize, floor: bool) -> usize {
    if blocks == 0 || blocks >= 2 * sms {
        return 1;
    }
    let s = if floor {
        (3 * sms / blocks).max(2)
    } else {
        (3 * sms).div_ceil(blocks)
    };
    s.clamp(1, chunks.max(1))
}

/// The kernels' format code (FMT_* in matvec.cu), or an error for a type with no CUDA matvec.
pub fn format_code(ty: GgmlType) -> Result<i32, CudaError> {
    Ok(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::BF16 => 2,
        GgmlType::Q8_0 => 3,
        GgmlType::Q4_K => 4,
        GgmlType::Q5_K => 5,
        GgmlType::Q6_K => 6,
        other => {
            return Err(CudaError::Unsupported(format!(
                "no CUDA matvec for {other}"
            )))
        }
    })
}

/// Whether the kernel of `ty` reads an int8-quantized activation.
pub fn uses_q8_activation(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_0
    )
}

/// Launch geometry of `matvec_cols` (and `matvec_silu_cols`) for `ncols` (2..=64) columns over
/// `rows` rows: (blocks, threads). A block holds every column group (one warp each) of
/// `rows_per_block / MATVEC_R` groups of MATVEC_R rows: at least 4 warps.
pub fn cols_launch(ncols: usize, rows: usize) -> (u32, u32) {
    let ncg = ncols.div_ceil(GROUP_COLS);
    let row_warps = (4 / ncg).max(1);
    let blocks = rows.div_ceil(row_warps * MATVEC_R);
    (blocks as u32, (32 * ncg * row_warps) as u32)
}

/// Whether an activation of `ncols` columns of width `k` quantized for `types` goes to the
/// k-major layout: decode groups (2..=MAX_COLS columns) of a Q8_0 matrix read by `matvec_cols`
/// through the Q8_K quantizer (a K-quant shares the input). Everything else keeps the row-major
/// layout (mmk.cu and mmt.cu read either).
pub fn kmajor_layout(ncols: usize, k: usize, types: &[GgmlType]) -> bool {
    (2..=MAX_COLS).contains(&ncols) && uses_q8_k(k, types) && types.contains(&GgmlType::Q8_0)
}

/// Whether the kernels of `types` over `ncols` columns of width `k` read the activation as
/// row-major Q8_K (what `residual_norm` writes beside its output): some type reads int8, the
/// format is Q8_K and the layout is not k-major.
pub fn reads_row_major_q8_k(ncols: usize, k: usize, types: &[GgmlType]) -> bool {
    types.iter().any(|&t| uses_q8_activation(t))
        && uses_q8_k(k, types)
        && !kmajor_layout(ncols, k, types)
}

/// Whether the activation for `types` at width `k` is quantized to Q8_K (one scale per 256):
/// any K-quant among them; else Q8_0 (one per 32).
fn uses_q8_k(k: usize, types: &[GgmlType]) -> bool {
    k.is_multiple_of(256)
        && types
            .iter()
            .any(|t| matches!(t, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K))
}

/// The resident layout of a `rows` x `cols` matrix of type `ty` (raw GGUF bytes in).
///
/// K-quants (Q4_K, Q5_K, Q6_K): the rows in quads, and in each quad the 4 rows' super-block b side
/// by side: block b of row r goes to block number `((r / 4) * nb + b) * 4 + r % 4` (`kq_blk` in
/// common.cuh), so a chunk of super-blocks of a row quad, the one-column kernels' task, is one
/// contiguous run of bytes. The rows are padded with zero blocks to a multiple of 4. Q6_K's
/// blocks (210 bytes, fields only 2-byte aligned) are further split into planes the kernels read
/// with 16-byte loads, each in that block order: ql+qh [192], then the scales [16], then d (f16).
/// Q8_0 (34 bytes): [rows][cols] int8, then [rows][cols/32] d (f16). Other types are returned as
/// they are.
pub fn repack(ty: GgmlType, rows: usize, bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match repacked_len(ty, rows, bytes.len()) {
        None => std::borrow::Cow::Borrowed(bytes),
        Some(n) => {
            let mut out = vec![0u8; n];
            repack_to(ty, rows, bytes, &mut out);
            std::borrow::Cow::Owned(out)
        }
    }
}

/// The block size of a type `repack` reorders (Q8_0: its 34-byte blocks), or None.
fn repack_block(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(144),
        GgmlType::Q5_K => Some(176),
        GgmlType::Q6_K => Some(210),
        GgmlType::Q8_0 => Some(34),
        _ => None,
    }
}

/// The length of `repack`'s output for a `rows`-row matrix of `len` bytes, or None when the
/// matrix is used as it is.
pub fn repacked_len(ty: GgmlType, rows: usize, len: usize) -> Option<usize> {
    let bs = repack_block(ty)?;
    if ty == GgmlType::Q8_0 {
        return Some(len);
    }
    if rows == 0 {
        return None;
    }
    let nb = len / rows / bs;
    Some(rows.div_ceil(4) * 4 * nb * bs)
}

/// `repack` into `out` (`repacked_len` bytes; every byte written, the padding rows' zeros
/// included, so `out` may be a reused buffer holding anything).
pub fn repack_to(ty: GgmlType, rows: usize, bytes: &[u8], out: &mut [u8]) {
    let Some(n) = repacked_len(ty, rows, bytes.len()) else {
        return out.copy_from_slice(bytes);
    };
    assert_eq!(
        out.len(),
        n,
        "repack_to: output of {} bytes, {n} needed",
        out.len()
    );
    let bs = repack_block(ty).expect("repacked types have a block size");
    if ty == GgmlType::Q8_0 {
        let nblk = bytes.len() / 34;
        let (qa, dc) = out.split_at_mut(nblk * 32);
        bytes
            .par_chunks_exact(34)
            .zip(qa.par_chunks_exact_mut(32))
            .zip(dc.par_chunks_exact_mut(2))
            .for_each(|((b, q), d)| {
                q.copy_from_slice(&b[2..34]);
                d.copy_from_slice(&b[..2]);
            });
        return;
    }
    let nb = bytes.len() / rows / bs;
    // The source block of slot (row i of the quad, super-block b) of quad g, if that row exists.
    let src = |g: usize, b: usize, i: usize| {
        let r = 4 * g + i;
        (r < rows).then(|| &bytes[(r * nb + b) * bs..(r * nb + b + 1) * bs])
    };
    if ty != GgmlType::Q6_K {
        out.par_chunks_exact_mut(4 * nb * bs)
            .enumerate()
            .for_each(|(g, quad)| {
                for (k, dst) in quad.chunks_exact_mut(bs).enumerate() {
                    match src(g, k / 4, k % 4) {
                        Some(b) => dst.copy_from_slice(b),
                        None => dst.fill(0),
                    }
                }
            });
        return;
    }
    let nblk = n / 210;
    let (qa, rest) = out.split_at_mut(nblk * 192);
    let (sc, dc) = rest.split_at_mut(nblk * 16);
    qa.par_chunks_exact_mut(4 * nb * 192)
        .zip(sc.par_chunks_exact_mut(4 * nb * 16))
        .zip(dc.par_chunks_exact_mut(4 * nb * 2))
        .enumerate()
        .for_each(|(g, ((q, s), d))| {
            for k in 0..4 * nb {
                let (qk, sk, dk) = (
                    &mut q[k * 192..(k + 1) * 192],
                    &mut s[k * 16..(k + 1) * 16],
                    &mut d[k * 2..(k + 1) * 2],
                );
                match src(g, k / 4, k % 4) {
                    Some(b) => {
                        qk.copy_from_slice(&b[..192]);
                        sk.copy_from_slice(&b[192..208]);
                        dk.copy_from_slice(&b[208..210]);
                    }
                    None => {
                        qk.fill(0);
                        sk.fill(0);
                        dk.fill(0);
                    }
                }
            }
        });
}

/// The device address of a buffer (kernels take raw pointers so one launch can name several).
pub fn dptr<T>(gpu: &Gpu, s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(&gpu.stream);
    p
}

/// Up to four matrices sharing one input; mirrors `MatvecJobs` of matvec.cu.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct MatvecJobs {
    pub(crate) w: [u64; MAX_JOBS],
    pub(crate) y: [u64; MAX_JOBS],
    pub(crate) rows: [i32; MAX_JOBS],
    pub(crate) ty: [i32; MAX_JOBS],
    pub(crate) start: [i32; MAX_JOBS + 1],
    pub(crate) njobs: i32,
}
// SAFETY: a plain #[repr(C)] struct of integers with the layout of the CUDA struct.
unsafe impl DeviceRepr for MatvecJobs {}

/// One matrix of a matvec launch: the weight and the address of its output `[ncols][rows]`,
/// over all of the weight's rows or over a window of them (`Job::window`).
pub struct Job<'a> {
    pub m: &'a DeviceMatrix,
    pub y: u64,
    /// Rows r0..r1 of `m` only (outputs `[ncols][r1 - r0]` at `y`); None: every row.
    win: Option<(usize, usize)>,
}

impl<'a> Job<'a> {
    /// All of `m`'s rows into `y`.
    pub fn new(m: &'a DeviceMatrix, y: u64) -> Job<'a> {
        Job { m, y, win: None }
    }
    /// Rows `r0..r1` of `m` into `y` (`[ncols][r1 - r0]`), read in place: only for a window
    /// `window_offset` accepts (a contiguous run of `m`'s resident bytes).
    pub fn window(m: &'a DeviceMatrix, y: u64, r0: usize, r1: usize) -> Result<Job<'a>, CudaError> {
        if r0 >= r1 || r1 > m.rows || window_offset(m.ty, m.rows, m.cols, r0).is_none() {
            return Err(CudaError::Unsupported(format!(
                "rows {r0}..{r1} of a {:?} matrix of {} rows are not a window of its layout",
                m.ty, m.rows
            )));
        }
        Ok(Job {
            m,
            y,
            win: Some((r0, r1)),
        })
    }
    /// The rows this job computes.
    pub fn rows(&self) -> usize {
        self.win.map_or(self.m.rows, |(a, b)| b - a)
    }
    /// Byte offset of the job's first row in `m.data`.
    fn offset(&self) -> usize {
        self.win.map_or(0, |(r0, _)| {
            window_offset(self.m.ty, self.m.rows, self.m.cols, r0).expect("checked by Job::window")
        })
    }
}

/// Where rows `r0..` of a resident `rows` x `cols` matrix of type `ty` begin, in bytes, when
/// they are a contiguous tail of its bytes that reads as a matrix of their own: Q4_K / Q5_K at
/// a row quad (`repack`: quads are contiguous runs), F32 / F16 / BF16 anywhere; None for the
/// types kept in planes (Q6_K, Q8_0) and for rows past the matrix.
pub fn window_offset(ty: GgmlType, rows: usize, cols: usize, r0: usize) -> Option<usize> {
    if r0 > rows {
        return None;
    }
    let row_bytes = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K if r0.is_multiple_of(4) => cols / 256 * repack_block(ty)?,
        GgmlType::F32 => cols * 4,
        GgmlType::F16 | GgmlType::BF16 => cols * 2,
        _ => return None,
    };
    Some(r0 * row_bytes)
}

/// Row ranges of an `n_rows`-row matrix in `k` chunks of a multiple of `unit` rows each (the
/// last takes the rest); fewer when the rows do not fill `k` units.
pub fn row_chunks(n_rows: usize, k: usize, unit: usize) -> Vec<(usize, usize)> {
    let per = n_rows.div_ceil(k.max(1)).div_ceil(unit) * unit;
    (0..n_rows)
        .step_by(per.max(1))
        .map(|r0| (r0, (r0 + per).min(n_rows)))
        .collect()
}

/// The kernel (matvec or, with `silu`, fused gate+up+SiLU) and launch of `n` (1..=MAX_COLS)
/// columns over `rows` rows: the 1-column kernel (4 warps of MATVEC_R rows per block) or the
/// column-group kernel.
fn matvec_config(n: usize, rows: usize, silu: bool) -> (LaunchConfig, &'static str) {
    let (blocks, threads) = if n == 1 {
        (rows.div_ceil(4 * MATVEC_R) as u32, 128)
    } else {
        cols_launch(n, rows)
    };
    let name = match (n == 1, silu) {
        (true, false) => "matvec_1",
        (false, false) => "matvec_cols",
        (true, true) => "matvec_silu_1",
        (false, true) => "matvec_silu_cols",
    };
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    (cfg, name)
}

impl Gpu {
    /// Uploads `rows` x `cols` weights of type `ty` (raw GGUF bytes), repacking where needed.
    pub fn upload_matrix(
        &self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix, CudaError> {
        format_code(ty)?;
        let row_bytes = ty.row_bytes(cols as u64).ok_or_else(|| {
            CudaError::Unsupported(format!(
                "{ty}: a row of {cols} values is not a whole number of blocks"
            ))
        })? as usize;
        if !row_bytes.is_multiple_of(16) && !matches!(ty, GgmlType::Q6_K | GgmlType::Q8_0) {
            return Err(CudaError::Unsupported(format!(
                "{ty} rows of {cols} values ({row_bytes} bytes) are not 16-byte aligned"
            )));
        }
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
            && !cols.is_multiple_of(256)
            || ty == GgmlType::Q8_0 && !cols.is_multiple_of(32)
        {
            return Err(CudaError::Unsupported(format!("{ty} row of {cols} values")));
        }
        if bytes.len() != rows * row_bytes {
            return Err(CudaError::Unsupported(format!(
                "{ty} matrix {rows}x{cols} needs {} bytes, got {}",
                rows * row_bytes,
                bytes.len()
            )));
        }
        // Reordered through one host buffer kept across uploads (`staging`, released by
        // `CudaBackend::weights_loaded`): a fresh one per matrix paid a page fault per 4 KB.
        let data = match repacked_len(ty, rows, bytes.len()) {
            None => self.stream.clone_htod(bytes)?,
            Some(n) => {
                let mut st = self.staging.lock().unwrap();
                if st.len() < n {
                    st.resize(n, 0);
                }
                repack_to(ty, rows, bytes, &mut st[..n]);
                // A copy from pageable memory returns once the source is staged, so the buffer
                // may be refilled right after.
                self.stream.clone_htod(&st[..n])?
            }
        };
        Ok(DeviceMatrix {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// The chunk values and row-quad counters of the `mvk_*` kernels, at least `cv` floats and
    /// `cnt` counters (grown on demand; new counters are zero, and every launch leaves them so).
    pub fn split_scratch(&self, cv: usize, cnt: usize) -> Result<(u64, u64), CudaError> {
        let mut s = self.split.lock().unwrap();
        if s.cv.as_ref().is_none_or(|b| b.len() < cv) {
            s.cv = Some(
                self.stream
                    .alloc_zeros::<f32>(cv.max(1).next_power_of_two())?,
            );
        }
        if s.cnt.as_ref().is_none_or(|b| b.len() < cnt) {
            s.cnt = Some(
                self.stream
                    .alloc_zeros::<u32>(cnt.max(1).next_power_of_two())?,
            );
        }
        Ok(self.split_ptrs(&s))
    }

    /// The activation regions of `mmw_*`, at least `bytes` (grown on demand).
    fn mmw_blob(&self, bytes: usize) -> Result<u64, CudaError> {
        let mut s = self.split.lock().unwrap();
        if s.blob.as_ref().is_none_or(|b| b.len() < bytes) {
            s.blob = Some(
                self.stream
                    .alloc_zeros::<u8>(bytes.max(1).next_power_of_two())?,
            );
        }
        Ok(s.blob.as_ref().map_or(0, |b| dptr(self, b)))
    }

    /// `mmw_blob` for a new activation about to be written there: its address and the write's
    /// count, which ends the life of every earlier `MmwPacked`.
    fn mmw_blob_write(&self, bytes: usize) -> Result<(u64, u64), CudaError> {
        let blob = self.mmw_blob(bytes)?;
        let mut s = self.split.lock().unwrap();
        s.blob_gen += 1;
        Ok((blob, s.blob_gen))
    }

    /// Where a Q8_K producer (quantize_q8_k, residual_norm, attn_rows_combine: q8k_warp's
    /// `xblob`) also writes its activation of `ncols` columns of width `k`, in the layout the
    /// `mmw_*` launch of that group would read (`mmt_tile_nt` column tiles), so that launch runs
    /// without `mmw_pack` before it: groups wider than `mmk_*`'s on sm_90 with `mmw_*` on, and
    /// `MUSER_CUDA_MMW_PREPACK` not 0, except prefill chunks bound for `mmh` (`prefill_on_mmh`).
    /// The launch still packs when its matrices leave `mmw_*` (`mmw_route`) or the blob was
    /// written since (`MmwPacked::gen`).
    pub fn mmw_prepack(&self, ncols: usize, k: usize) -> Result<Option<MmwPacked>, CudaError> {
        if !(self.mmw_prepack_on()
            && self.mmw()
            && !self.prefill_on_mmh()
            && k.is_multiple_of(256)
            && (ncols > mmk_cols().max(16) || mmw_narrow(ncols)))
        {
            return Ok(None);
        }
        let nt = mmw_group_nt(ncols);
        let (blob, gen) = self.mmw_blob_write(ncols.div_ceil(8 * nt) * (k / 256) * mmw_xb(nt))?;
        Ok(Some(MmwPacked {
            blob,
            nt,
            k,
            ncols,
            gen,
        }))
    }

    /// The address of `scratch`'s activation in `mmw_*`'s layout of `nt` column tiles: where
    /// its producer wrote it (`packed`, if the blob has not been written since), else laid out
    /// by `mmw_pack`.
    fn mmw_act(
        &self,
        scratch: &ActScratch,
        k: usize,
        ncols: usize,
        nt: usize,
    ) -> Result<u64, CudaError> {
        if let Some(p) = scratch.packed {
            if (p.nt, p.k, p.ncols) == (nt, k, ncols)
                && !scratch.kmajor
                && self.split.lock().unwrap().blob_gen == p.gen
            {
                return Ok(p.blob);
            }
        }
        self.mmw_pack(scratch, k, ncols, nt)
    }

    /// The addresses of the split scratch and of `mmw_*`'s activation regions (0 before their
    /// first use): part of a recorded decode step's key.
    pub fn split_key(&self) -> [u64; 3] {
        let s = self.split.lock().unwrap();
        let (cv, cnt) = self.split_ptrs(&s);
        [cv, cnt, s.blob.as_ref().map_or(0, |b| dptr(self, b))]
    }

    fn split_ptrs(&self, s: &SplitScratch) -> (u64, u64) {
        (
            s.cv.as_ref().map_or(0, |b| dptr(self, b)),
            s.cnt.as_ref().map_or(0, |b| dptr(self, b)),
        )
    }

    /// Scratch for activations of up to `cap` values.
    pub fn act_scratch(&self, cap: usize) -> Result<ActScratch, CudaError> {
        let cap = cap.max(32);
        Ok(ActScratch {
            q: self.stream.alloc_zeros::<i8>(cap)?,
            ds: self.stream.alloc_zeros::<f32>(cap / 32 * 2)?,
            bs: self.stream.alloc_zeros::<i8>((cap / 256).max(1) * 16)?,
            cap,
            kmajor: false,
            packed: None,
        })
    }

    /// Quantizes `n` f32 values at address `x` (rows of width `k`) into `scratch` in the
    /// activation format the CPU reference pairs with `types`: Q8_K (one scale per 256) when any
    /// is a K-quant, else Q8_0 (one per 32). A no-op when no type reads int8 activations.
    /// Decode groups get the k-major layout (`kmajor_layout`).
    pub fn quantize_act(
        &self,
        x: u64,
        n: usize,
        k: usize,
        types: &[GgmlType],
        scratch: &mut ActScratch,
    ) -> Result<(), CudaError> {
        if !types.iter().any(|&t| uses_q8_activation(t)) {
            scratch.kmajor = false;
            return Ok(());
        }
        if n > scratch.cap {
            *scratch = self.act_scratch(n)?;
        }
        let kquant = uses_q8_k(k, types);
        scratch.kmajor = kmajor_layout(n / k, k, types);
        let (name, per) = if kquant {
            ("quantize_q8_k", 256)
        } else {
            ("quantize_q8_0", 32)
        };
        let n_blocks = (n / per) as i32;
        let cfg = LaunchConfig {
            grid_dim: ((n_blocks as u32).div_ceil(4), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (q, ds, bs) = (
            dptr(self, &scratch.q),
            dptr(self, &scratch.ds),
            dptr(self, &scratch.bs),
        );
        let (k_i, km) = (k as i32, i32::from(scratch.kmajor));
        scratch.packed = if kquant && !scratch.kmajor {
            self.mmw_prepack(n / k, k)?
        } else {
            None
        };
        let (xblob, nt) = packed_args(scratch.packed);
        let f = self.kernel(name)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&x).arg(&q).arg(&ds);
        if kquant {
            b.arg(&bs);
        }
        b.arg(&n_blocks);
        if kquant {
            b.arg(&k_i).arg(&km).arg(&xblob).arg(&nt);
        }
        // SAFETY: x holds n f32; q, ds and bs hold at least n values, n / 32 scales and n / 16
        // split sums; xblob (when not 0) the n / k columns' regions (mmw_prepack).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// y_j[c][r] = W_j x[c] for every job, `ncols` columns of width `k` at address `x` (f32).
    /// The int8 activation must already be in `scratch` when any job is quantized
    /// (`quantize_act`): matmuls sharing one input quantize it once.
    pub fn matvec_jobs(
        &self,
        jobs: &[Job],
        x: u64,
        k: usize,
        ncols: usize,
        scratch: &ActScratch,
    ) -> Result<(), CudaError> {
        let (mv, jobs): (Vec<&Job>, Vec<&Job>) =
            jobs.iter().partition(|j| uses_mvk(j.m.ty, ncols, k));
        for group in mv.chunks(MAX_JOBS) {
            self.mvk(group, k, scratch)?;
        }
        let (tc, rest): (Vec<&Job>, Vec<&Job>) =
            jobs.into_iter().partition(|j| uses_mmk(j.m.ty, ncols, k));
        for group in tc.chunks(MAX_JOBS) {
            self.mmk(group, k, ncols, scratch)?;
        }
        for group in rest.chunks(MAX_JOBS) {
            // Starts are multiples of 4: a warp's rows stay in one matrix.
            let (mut mj, total) = self.jobs_struct(group, k, MATVEC_R)?;
            let mut c0 = 0;
            while c0 < ncols {
                let n = (ncols - c0).min(MAX_COLS);
                for (i, j) in group.iter().enumerate() {
                    mj.y[i] = j.y + (c0 * j.rows() * 4) as u64;
                }
                let (xq, xds, xf) = self.act_ptrs(scratch, x, k, c0);
                let (k_i, n_i, km) = (k as i32, n as i32, i32::from(scratch.kmajor));
                let (cfg, name) = matvec_config(n, total, false);
                let mut b = self.stream.launch_builder(self.kernel(name)?);
                b.arg(&mj)
                    .arg(&xq)
                    .arg(&xds)
                    .arg(&xf)
                    .arg(&k_i)
                    .arg(&n_i)
                    .arg(&km);
                // SAFETY: each job reads rows*row_bytes weight bytes and writes n*rows outputs at
                // y + c0*rows; the activation holds ncols*k values.
                unsafe { b.launch(cfg) }?;
                c0 += n;
            }
        }
        Ok(())
    }

    /// The `MatvecJobs` of up to MAX_JOBS matrices of width `k`, each job's rows starting at a
    /// multiple of `pad` (so a kernel's row group stays in one matrix), and the padded total.
    pub(crate) fn jobs_struct(
        &self,
        group: &[&Job],
        k: usize,
        pad: usize,
    ) -> Result<(MatvecJobs, usize), CudaError> {
        let mut mj = MatvecJobs::default();
        let mut total = 0usize;
        for (i, j) in group.iter().enumerate() {
            if j.m.cols != k {
                return Err(CudaError::Unsupported(format!(
                    "matvec input width {k} != matrix cols {}",
                    j.m.cols
                )));
            }
            mj.w[i] = dptr(self, &j.m.data) + j.offset() as u64;
            mj.y[i] = j.y;
            mj.rows[i] = j.rows() as i32;
            mj.ty[i] = format_code(j.m.ty)?;
            mj.start[i] = total as i32;
            total += j.rows().div_ceil(pad) * pad;
        }
        mj.njobs = group.len() as i32;
        mj.start[group.len()] = total as i32;
        Ok((mj, total))
    }

    /// Whether one-column launches that fit `mvk_1_whole`'s split (`mvk_whole_fits`) run on it
    /// (on unless `MUSER_CUDA_MVK_WHOLE=0`). The same bits either way: a row's chunks are added in
    /// one order however a launch splits them (`muser check` compares the two).
    pub fn mvk_whole(&self) -> bool {
        self.mvk_whole_on.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn set_mvk_whole(&self, on: bool) {
        self.mvk_whole_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }
    /// Whether one-job launches that fit `mvk_1_spread` (`mvk_spread_fits`) run on it (on unless
    /// `MUSER_CUDA_MVK_SPREAD=0`): the same bits either way.
    pub fn mvk_spread(&self) -> bool {
        self.mvk_spread_on
            .load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn set_mvk_spread(&self, on: bool) {
        self.mvk_spread_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Up to MAX_JOBS K-quant matrices times one column in one `mvk_1` launch (the Q8_K
    /// activation already in `scratch`).
    fn mvk(&self, group: &[&Job], k: usize, scratch: &ActScratch) -> Result<(), CudaError> {
        // Starts are multiples of 4: a task's row quad stays in one matrix.
        let (mj, total) = self.jobs_struct(group, k, MATVEC_R)?;
        if total == 0 {
            return Ok(()); // matrices without rows: nothing to compute (the split divides by the tasks)
        }
        let nch = mvk_chunks(k);
        let (cv, cnt) = self.split_scratch(total * nch, total / 4)?;
        let spread = self.mvk_spread() && mvk_spread_fits(group.len(), total / 4, self.sms);
        let blocks = if spread {
            4 * self.sms as u32
        } else {
            mvk_blocks(total / 4, nch, self.sms)
        };
        mvk_fits(total / 4 * nch, blocks)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xq, xds) = (dptr(self, &scratch.q), dptr(self, &scratch.ds));
        let k_i = k as i32;
        let whole = || {
            let starts: Vec<usize> = mj.start[..=group.len()]
                .iter()
                .map(|&s| s as usize)
                .collect();
            mvk_whole_fits(&starts, nch, 4 * blocks as usize)
        };
        let name = if spread {
            "mvk_1_spread"
        } else if self.mvk_whole() && whole() {
            "mvk_1_whole"
        } else {
            "mvk_1"
        };
        let mut b = self.stream.launch_builder(self.kernel(name)?);
        self.trace_formats(group.iter().map(|j| j.m.ty));
        let flags = mvk_flags();
        b.arg(&mj)
            .arg(&xq)
            .arg(&xds)
            .arg(&k_i)
            .arg(&cv)
            .arg(&cnt)
            .arg(&flags);
        // SAFETY: each job reads rows*row_bytes weight bytes and writes rows outputs; the
        // activation holds k values and k / 32 scales; cv holds total * nch floats and cnt
        // total / 4 counters, zero between launches (each launch leaves them so).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Up to MAX_JOBS K-quant matrices times `ncols` (2 or more) columns in one `mmk_*` launch
    /// (the Q8_K activation already in `scratch`).
    fn mmk(
        &self,
        group: &[&Job],
        k: usize,
        ncols: usize,
        scratch: &ActScratch,
    ) -> Result<(), CudaError> {
        let types: Vec<GgmlType> = group.iter().map(|j| j.m.ty).collect();
        let launch = |rows| group_launch(ncols, rows, false, &types, scratch.kmajor, self.mmw());
        let (_, _, pad) = launch(0);
        // Starts are multiples of the row block: a block's rows stay in one matrix.
        let (mj, total) = self.jobs_struct(group, k, pad)?;
        let (mut cfg, mut name, _) = launch(total);
        let (p, i) = self.mmk_act(scratch, k, ncols);
        let mmv = mmv_kernel(ncols, false, self.mmv()).filter(|_| !name.starts_with("mmt"));
        if let Some((mmv, per_sm)) = mmv {
            if total == 0 {
                return Ok(());
            }
            let (cfg, tail) = self.mmv_launch(total / MMK_ROWS, k, 1, ncols, per_sm)?;
            let f = self.kernel_smem(&mmv, cfg.shared_mem_bytes as usize)?;
            self.trace_formats(types.iter().copied());
            let mut b = self.stream.launch_builder(f);
            b.arg(&mj);
            mmv_args(&mut b, &p, &i, &tail);
            // SAFETY: each job reads rows*row_bytes weight bytes and writes ncols*rows outputs
            // (ncols <= 16); cv holds row blocks * chunks * 128 floats per 8 columns and cnt a
            // count per row block, zero between launches (each launch leaves them so).
            unsafe { b.launch(cfg) }?;
            return Ok(());
        }
        let tiles = (cfg.grid_dim.0 * cfg.grid_dim.1) as usize;
        let mmw = mmw_route(self.mmw(), &name, &types, scratch.kmajor);
        let splits = if ["mmt_4", "mmt_3", "mmt_2"].contains(&name.as_str()) {
            mmt_splits(self.mmt_split(), tiles, mvk_chunks(k), self.sms)
        } else {
            1
        };
        // The split kernel's chunk values ([tiles][chunks][4 NT <= 16][128] floats) and tile
        // counts.
        let split = if splits > 1 {
            name = name.replace("mmt_", "mmt_split_");
            cfg.grid_dim.2 = splits as u32;
            Some(self.split_scratch(tiles * mvk_chunks(k) * 16 * 128, tiles)?)
        } else {
            None
        };
        if name.starts_with("mmt") {
            for j in group {
                mmt_fits(j.m.data.len())?;
            }
        }
        let blob = match mmw {
            Some(nt) => {
                name = name.replace("mmt_", "mmw_");
                cfg.shared_mem_bytes = mmw_smem(nt) as u32;
                Some(self.mmw_act(scratch, k, ncols, nt)?)
            }
            None => None,
        };
        let f = self.kernel_smem(&name, cfg.shared_mem_bytes as usize)?;
        self.trace_formats(types.iter().copied());
        let mut b = self.stream.launch_builder(f);
        b.arg(&mj);
        if let Some(blob) = &blob {
            b.arg(blob).arg(&i[0]).arg(&i[1]);
        } else {
            b.arg(&p[0]).arg(&p[1]).arg(&p[2]);
            b.arg(&i[0]).arg(&i[1]).arg(&i[2]);
        }
        if let Some((cv, cnt)) = &split {
            b.arg(cv).arg(cnt);
        }
        // SAFETY: each job reads rows*row_bytes weight bytes and writes ncols*rows outputs; the
        // activation holds ncols*k values, their scales and split sums (mmw_*: the blob holds
        // the tiles' regions, `mmw_pack`); the split scratch holds tiles * chunks * 2048 values
        // and tiles counts, zero between launches (each launch leaves them so).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Lays the row-major Q8_K activation of `ncols` columns of width `k` in `scratch` out as
    /// the stages of `mmw_*` with `nt` column tiles want it (`mmw_pack`: per tile and
    /// super-block, one contiguous region of `mmw_xb(nt)` bytes); returns its address.
    fn mmw_pack(
        &self,
        scratch: &ActScratch,
        k: usize,
        ncols: usize,
        nt: usize,
    ) -> Result<u64, CudaError> {
        let (tiles, nb) = (ncols.div_ceil(8 * nt), k / 256);
        let (blob, _) = self.mmw_blob_write(tiles * nb * mmw_xb(nt))?;
        let cfg = LaunchConfig {
            grid_dim: (nb as u32, tiles as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (p, i) = self.mmk_act(scratch, k, ncols);
        let nt_i = nt as i32;
        let mut b = self.stream.launch_builder(self.kernel("mmw_pack")?);
        b.arg(&p[0]).arg(&p[1]).arg(&p[2]).arg(&i[0]).arg(&i[1]);
        b.arg(&nt_i).arg(&blob);
        // SAFETY: reads ncols*k int8 values, their scales and split sums (row-major, the route's
        // condition); writes tiles * nb regions of mmw_xb(nt) bytes, which the blob holds.
        unsafe { b.launch(cfg) }?;
        Ok(blob)
    }

    /// The grid of an `mmv_*` launch over `nrb` 16-row blocks of width `k` of `m` matrices (2:
    /// gate and up) for `ncols` columns (its dynamic shared memory: the warps' rings), its split
    /// scratch (chunk values, counts per row block) and its stage count (the kernel's argument).
    fn mmv_launch(
        &self,
        nrb: usize,
        k: usize,
        m: usize,
        ncols: usize,
        per_sm: usize,
    ) -> Result<(LaunchConfig, MmvTail), CudaError> {
        let nch = mvk_chunks(k);
        let stages = mmv_stages(ncols.div_ceil(8));
        let (cv, cnt) = self.split_scratch(nrb * nch * m * 128 * ncols.div_ceil(8), nrb)?;
        let blocks = mmv_blocks(nrb * nch, self.sms, per_sm);
        mvk_fits(nrb * nch, blocks)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: mmv_smem(m == 2, stages) as u32,
        };
        Ok((cfg, (cv, cnt, stages as i32)))
    }

    /// The activation arguments of an `mmk_*` kernel (KACT_ARGS in mmk.cu): the addresses of the
    /// int8 values, their scales and split sums; K, the columns and the layout flag.
    fn mmk_act(&self, scratch: &ActScratch, k: usize, ncols: usize) -> ([u64; 3], [i32; 3]) {
        (
            [
                dptr(self, &scratch.q),
                dptr(self, &scratch.ds),
                dptr(self, &scratch.bs),
            ],
            [k as i32, ncols as i32, i32::from(scratch.kmajor)],
        )
    }

    /// y[c][r] = silu(G[r] . x[c]) * (U[r] . x[c]) (the int8 activation already in `scratch`
    /// when either matrix is quantized). K-quants from 2 columns on run fused on `mmk_silu_*`,
    /// the other formats on `matvec_silu_1` / `matvec_silu_cols` (64 columns per launch).
    /// With `quantize_out`, one column on `mvk_silu_1` may also leave y's row-major Q8_K in
    /// `scratch` (`silu_finish_q8k`, which completes the row quads the gate+up warps shared);
    /// the result says whether it did.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_silu(
        &self,
        gate: &DeviceMatrix,
        up: &DeviceMatrix,
        x: u64,
        ncols: usize,
        scratch: &mut ActScratch,
        y: u64,
        quantize_out: bool,
    ) -> Result<bool, CudaError> {
        let (k, rows) = gate_up_shape(gate, up)?;
        let (wg, wu) = (dptr(self, &gate.data), dptr(self, &up.data));
        let (tg, tu) = (format_code(gate.ty)?, format_code(up.ty)?);
        let rows_i = rows as i32;
        if uses_mmk(gate.ty, ncols, k) && uses_mmk(up.ty, ncols, k) {
            let (cfg, name, _) = group_launch(
                ncols,
                rows,
                true,
                &[gate.ty, up.ty],
                scratch.kmajor,
                self.mmw(),
            );
            let mmv = mmv_kernel(ncols, true, self.mmv()).filter(|_| !name.starts_with("mmt"));
            if let Some((mmv, per_sm)) = mmv {
                if rows == 0 {
                    return Ok(false);
                }
                let (cfg, tail) = self.mmv_launch(rows.div_ceil(MMK_ROWS), k, 2, ncols, per_sm)?;
                let (p, i) = self.mmk_act(scratch, k, ncols);
                let f = self.kernel_smem(&mmv, cfg.shared_mem_bytes as usize)?;
                self.trace_formats([gate.ty, up.ty]);
                let mut b = self.stream.launch_builder(f);
                b.arg(&wg).arg(&tg).arg(&wu).arg(&tu).arg(&y).arg(&rows_i);
                mmv_args(&mut b, &p, &i, &tail);
                // SAFETY: reads rows*row_bytes bytes of each matrix and the activation of
                // ncols*k values (ncols <= 16); writes ncols*rows outputs; cv and cnt as in `mmk`.
                unsafe { b.launch(cfg) }?;
                return Ok(false);
            }
            if name.starts_with("mmt") {
                mmt_fits(gate.data.len())?;
                mmt_fits(up.data.len())?;
            }
            let (p, i) = self.mmk_act(scratch, k, ncols);
            let (mut cfg, mut name) = (cfg, name);
            let blob = match mmw_route(self.mmw(), &name, &[gate.ty, up.ty], scratch.kmajor) {
                Some(nt) => {
                    name = name.replace("mmt_", "mmw_");
                    cfg.shared_mem_bytes = mmw_smem(nt) as u32;
                    Some(self.mmw_act(scratch, k, ncols, nt)?)
                }
                None => None,
            };
            // Gate and up in blocks of their own (`mmw_silu_pair_*`): each pair's slots of
            // 2 x 4 NT x 128 values and its count.
            let pairs = match (&blob, self.mmw_pairs()) {
                (Some(_), true) => {
                    let n = (cfg.grid_dim.0 * cfg.grid_dim.1) as usize;
                    name = name.replace("mmw_silu_", "mmw_silu_pair_");
                    cfg.grid_dim.1 *= 2;
                    Some(self.split_scratch(n * 2 * 16 * 128, n)?)
                }
                _ => None,
            };
            let f = self.kernel_smem(&name, cfg.shared_mem_bytes as usize)?;
            self.trace_formats([gate.ty, up.ty]);
            let mut b = self.stream.launch_builder(f);
            b.arg(&wg).arg(&tg).arg(&wu).arg(&tu).arg(&y).arg(&rows_i);
            if let Some(blob) = &blob {
                b.arg(blob).arg(&i[0]).arg(&i[1]);
            } else {
                b.arg(&p[0]).arg(&p[1]).arg(&p[2]);
                b.arg(&i[0]).arg(&i[1]).arg(&i[2]);
            }
            if let Some((cv, cnt)) = &pairs {
                b.arg(cv).arg(cnt);
            }
            // SAFETY: reads rows*row_bytes bytes of each matrix and the activation of ncols*k
            // values; writes ncols*rows outputs; with pairs, cv holds 2 x 2048 values and cnt
            // one count (zero between launches: each launch leaves them so) per pair of blocks.
            unsafe { b.launch(cfg) }?;
            return Ok(false);
        }
        if rows == 0 || ncols == 0 {
            return Ok(false);
        }
        if uses_mvk(gate.ty, ncols, k) && gate.ty == up.ty {
            let nch = mvk_chunks(k);
            let quads = rows.div_ceil(4);
            let (cv, cnt) = self.split_scratch(quads * 4 * 2 * nch, quads)?;
            let blocks = mvk_blocks(quads, 2 * nch, self.sms);
            mvk_fits(quads * 2 * nch, blocks)?;
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let (xq, xds, k_i) = (dptr(self, &scratch.q), dptr(self, &scratch.ds), k as i32);
            let tasks = quads * 2 * nch;
            let finish = quantize_out
                && silu_finish()
                && rows.is_multiple_of(256)
                && (tasks as u64) * (blocks as u64 * 4 + 1) < 1 << 32;
            let mut b = self.stream.launch_builder(self.kernel("mvk_silu_1")?);
            self.trace_formats([gate.ty, up.ty]);
            b.arg(&wg).arg(&tg).arg(&wu).arg(&tu).arg(&y).arg(&rows_i);
            let flags = mvk_flags() | if finish { MVK_DEFER_SHARED } else { 0 };
            b.arg(&xq)
                .arg(&xds)
                .arg(&k_i)
                .arg(&cv)
                .arg(&cnt)
                .arg(&flags);
            // SAFETY: reads rows*row_bytes bytes of each matrix and the activation of k values;
            // writes rows outputs; cv and cnt as in `mvk`.
            unsafe { b.launch(cfg) }?;
            if !finish {
                return Ok(false);
            }
            if rows > scratch.cap {
                *scratch = self.act_scratch(rows)?;
            }
            scratch.kmajor = false;
            scratch.packed = None;
            let (nch_i, t_u, w_u) = (nch as i32, tasks as u32, blocks * 4);
            let (q, ds, bs) = (
                dptr(self, &scratch.q),
                dptr(self, &scratch.ds),
                dptr(self, &scratch.bs),
            );
            let fin = LaunchConfig {
                grid_dim: ((rows / 256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(self.kernel("silu_finish_q8k")?);
            b.arg(&cv)
                .arg(&y)
                .arg(&rows_i)
                .arg(&nch_i)
                .arg(&t_u)
                .arg(&w_u);
            b.arg(&q).arg(&ds).arg(&bs);
            // SAFETY: reads the chunk values mvk_silu_1 left in cv (rows * 2 * nch floats) and
            // its rows outputs at y, completes them there; writes rows int8 values, rows / 32
            // scales and rows / 16 split sums into the scratch, which holds at least rows values.
            unsafe { b.launch(fin) }?;
            return Ok(true);
        }
        let mut c0 = 0;
        while c0 < ncols {
            let n = (ncols - c0).min(MAX_COLS);
            let (xq, xds, xf) = self.act_ptrs(scratch, x, k, c0);
            let yc = y + (c0 * rows * 4) as u64;
            let (k_i, n_i, km) = (k as i32, n as i32, i32::from(scratch.kmajor));
            let (cfg, name) = matvec_config(n, rows, true);
            let mut b = self.stream.launch_builder(self.kernel(name)?);
            b.arg(&wg).arg(&tg).arg(&wu).arg(&tu).arg(&yc).arg(&rows_i);
            b.arg(&xq).arg(&xds).arg(&xf).arg(&k_i).arg(&n_i).arg(&km);
            // SAFETY: as in matvec_jobs.
            unsafe { b.launch(cfg) }?;
            c0 += n;
        }
        Ok(false)
    }

    /// Addresses of column c0 of the int8 activation, its scales and the f32 activation.
    fn act_ptrs(&self, scratch: &ActScratch, x: u64, k: usize, c0: usize) -> (u64, u64, u64) {
        (
            dptr(self, &scratch.q) + (c0 * k) as u64,
            dptr(self, &scratch.ds) + (c0 * k / 32 * 8) as u64,
            x + (c0 * k * 4) as u64,
        )
    }

    /// y[c][r] = W x[c] for `ncols` columns: x is [ncols][cols], y is [ncols][rows].
    pub fn matvec(
        &self,
        m: &DeviceMatrix,
        x: &CudaSlice<f32>,
        ncols: usize,
        scratch: &mut ActScratch,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        assert!(
            x.len() >= ncols * m.cols && y.len() >= ncols * m.rows,
            "matvec buffers too small"
        );
        let xp = dptr(self, x);
        self.quantize_act(xp, ncols * m.cols, m.cols, &[m.ty], scratch)?;
        self.matvec_jobs(&[Job::new(m, dptr(self, y))], xp, m.cols, ncols, scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_struct_matches_the_kernel_layout() {
        // w[4], y[4] pointers, rows[4], ty[4], start[5], njobs: 120 bytes, 8-aligned.
        assert_eq!(std::mem::size_of::<MatvecJobs>(), 120);
        assert_eq!(std::mem::align_of::<MatvecJobs>(), 8);
    }

    #[test]
    fn every_decode_group_size_gets_one_warp_per_column_group_and_covers_every_row() {
        for n in 2..=MAX_COLS {
            for rows in [1usize, 3, 4, 5, 16, 17, 256, 4096, 6656, 19968, 202048] {
                let (blocks, threads) = cols_launch(n, rows);
                let ncg = n.div_ceil(GROUP_COLS);
                let warps = threads as usize / 32;
                assert!(threads % 32 == 0 && (128..=256).contains(&threads) || warps == ncg);
                assert_eq!(warps % ncg, 0, "{n} columns: {warps} warps");
                let rows_per_block = warps / ncg * MATVEC_R;
                assert!(blocks as usize * rows_per_block >= rows);
                assert!(
                    (blocks as usize - 1) * rows_per_block < rows,
                    "an empty block"
                );
            }
        }
    }

    #[test]
    fn mmt8_smem_holds_two_stages_of_every_format_and_the_parked_gate() {
        // The stage strides as mmt.cu declares them (MmtFmt<FMT>: BS, CH, WS, XS).
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(f, _)| *f == "mmt.cu")
            .unwrap()
            .1;
        let fmts: Vec<[usize; 4]> = src
            .lines()
            .filter_map(|l| l.trim().strip_prefix("static constexpr int BS = "))
            .filter_map(|rest| {
                let v: Vec<usize> = rest
                    .trim_end_matches(';')
                    .split(',')
                    .map(|kv| kv.rsplit('=').next().unwrap().trim().parse().ok())
                    .collect::<Option<_>>()?;
                (v.len() == 4).then(|| [v[0], v[1], v[2], v[3]])
            })
            .collect();
        assert_eq!(fmts.len(), 3, "Q4_K, Q5_K and Q6_K strides");
        // mmt_stage_bytes<FMT, 8>: 64 rows of weights, then 64 activation rows, (d, sum) and
        // split sums per column.
        let stage = fmts
            .iter()
            .map(|[bs, ch, ws, xs]| {
                assert!(
                    ws >= bs && 16 * ch >= *bs,
                    "a row's stage slot holds its block"
                );
                MMT_ROWS * ws + 64 * (xs + 8 + 16)
            })
            .max()
            .unwrap();
        assert_eq!(MMT8_SMEM, 2 * stage + 128 * 32 * 4);
        // Two blocks per SM fit the H200's 227 KB of shared memory per SM.
        const { assert!(2 * MMT8_SMEM <= 227 * 1024) };
    }

    #[test]
    fn mmt_fits_matrices_below_4_gib_and_names_the_size_of_larger_ones() {
        assert!(mmt_fits(1_090_000_000).is_ok());
        assert!(mmt_fits((1 << 32) - 1).is_ok());
        let e = mmt_fits(1 << 32).unwrap_err().to_string();
        assert!(e.contains("4294967296 bytes"), "{e}");
    }

    #[test]
    fn mmk_launch_covers_every_row_and_column_with_1_2_3_4_or_8_column_tiles() {
        let compiled: Vec<String> = ["mmk.cu", "mmt.cu"]
            .iter()
            .flat_map(|file| {
                let src = crate::KERNEL_SOURCES.iter().find(|(f, _)| f == file);
                crate::device::kernel_names(src.unwrap().1)
            })
            .collect();
        for (silu, upto) in [false, true]
            .into_iter()
            .flat_map(|s| [(s, 16), (s, 32), (s, 64)])
        {
            for n in (2..=80).chain([128, 511, 512, 513, 2048]) {
                for rows in [1usize, 16, 17, 64, 65, 256, 6656, 19968, 202048] {
                    let (cfg, name, block_rows) = mmk_launch_upto(n, rows, silu, upto, mmt8_min());
                    assert!(compiled.contains(&name), "{name} is not compiled");
                    assert_eq!(name.contains("_silu_"), silu);
                    // Up to `upto` columns mmk.cu's 16-row blocks, more mmt.cu's 64-row blocks.
                    assert_eq!(name.starts_with("mmt_"), n > upto, "{name} for {n} columns");
                    assert_eq!(block_rows, if n > upto { MMT_ROWS } else { MMK_ROWS });
                    let nt: usize = name.rsplit('_').next().unwrap().parse().unwrap();
                    assert!([1, 2, 3, 4, 8].contains(&nt));
                    assert_eq!(nt == 8, n > upto && n >= mmt8_min());
                    // 24-column tiles where 32-column ones would run more MMA tiles.
                    let fewer = n.div_ceil(24) * 3 < n.div_ceil(32) * 4;
                    assert_eq!(nt == 3, n > upto && n < mmt8_min() && fewer, "{n}: {name}");
                    // 64-column tiles: two stages of the largest format and the parked gate.
                    let smem = if nt == 8 { MMT8_SMEM } else { 0 };
                    assert_eq!(cfg.shared_mem_bytes as usize, smem);
                    let bn = 8 * nt;
                    assert_eq!(cfg.block_dim.0, 128);
                    assert!(cfg.grid_dim.1 as usize * block_rows >= rows);
                    assert!(
                        (cfg.grid_dim.1 as usize - 1) * block_rows < rows,
                        "an empty row block"
                    );
                    assert!(cfg.grid_dim.0 as usize * bn >= n);
                    assert!(
                        (cfg.grid_dim.0 as usize - 1) * bn < n,
                        "an empty column tile"
                    );
                    // The narrowest tile that holds the group when it fits in one.
                    if n <= 32 && (n <= 16 || n > upto) {
                        assert_eq!(cfg.grid_dim.0, 1);
                        assert!(bn < 2 * n || bn == 8, "{n} columns on tiles of {bn}");
                    }
                }
            }
        }
    }

    #[test]
    fn narrow_mmt_launches_split_k_into_at_most_one_split_per_chunk() {
        let sms = 132;
        // Glimmer at 32 columns: ffn_down and attn_output 104 blocks, q+k+v+gate 136.
        for (blocks, chunks) in [(104usize, 20usize), (104, 7), (136, 7), (1, 2), (263, 5)] {
            let s = split_count_as(blocks, chunks, sms, false);
            assert!((1..=chunks).contains(&s), "{blocks} blocks: {s} splits");
            assert!(s > 1, "{blocks} blocks of {chunks} chunks are not split");
            // About three blocks per SM, unless the chunks run out.
            assert!(blocks * s >= (3 * sms).min(blocks * chunks));
            assert!(blocks * (s - 1) < 3 * sms);
            // The floor policy: one wave of at most 3 blocks per SM, unless 2 splits overflow it.
            let f = split_count_as(blocks, chunks, sms, true);
            assert!(
                (2..=chunks.max(2)).contains(&f) || chunks == 1,
                "{blocks}: {f}"
            );
            assert!(
                blocks * f <= 3 * sms || f == 2,
                "{blocks} blocks x {f} splits"
            );
            assert!(f <= s);
        }
        // Wide launches (prefill: 16 column tiles), empty ones and single chunks are not split.
        for blocks in [0usize, 264, 312 * 16] {
            assert_eq!(split_count_as(blocks, 26, sms, false), 1);
            assert_eq!(split_count_as(blocks, 26, sms, true), 1);
        }
        assert_eq!(split_count_as(1, 1, sms, false), 1);
        assert_eq!(split_count_as(1, 1, sms, true), 1);
    }

    #[test]
    fn wave_split_plans_finish_glimmer_launches_in_whole_waves() {
        let sms = 132;
        // 32 columns: ffn_down 104 blocks of 20 chunks, q+k+v+gate 136 of 7 (muse-glimmer).
        assert_eq!(split_waves(104, 20, sms, 0.01, 2), 7);
        assert_eq!(split_waves(136, 7, sms, 0.01, 2), 5);
        // attn_output 104 blocks of 4 chunks and llama-glimmer's q+k+v 72 of 7: a chunk a block
        // within two waves (416 and 504 blocks for 396 places).
        assert_eq!(split_waves(104, 4, sms, 0.01, 2), 4);
        assert_eq!(split_waves(72, 7, sms, 0.01, 2), 7);
        // Past two waves of one-chunk blocks, the wave count decides again.
        assert_eq!(split_waves(113, 7, sms, 0.01, 4), 7);
        assert_eq!(split_waves(114, 7, sms, 0.01, 4), 3);
        // Wide and empty launches are not split; a split never exceeds the chunks.
        assert_eq!(split_waves(264, 20, sms, 0.01, 2), 1);
        assert_eq!(split_waves(0, 20, sms, 0.01, 2), 1);
        // Below 4 blocks per SM (the default split_upto): ffn_down at 128 columns, 416 blocks
        // (two waves, the second 20 blocks), in about 1.2 waves' time instead of 2.02.
        assert_eq!(split_waves(416, 20, sms, 0.01, 2), 1);
        let s = split_waves(416, 20, sms, 0.01, 4);
        let cost = |s: usize| (416 * s).div_ceil(396) as f64 * (1.0 / s as f64 + 0.01);
        assert!(s > 1 && cost(s) < 0.65 * cost(1), "{s}");
        for (b, c) in [(1usize, 2usize), (50, 9), (200, 3), (7, 100)] {
            let s = split_waves(b, c, sms, 0.02, 2);
            assert!((1..=c).contains(&s), "{b} blocks, {c} chunks: {s}");
        }
    }

    #[test]
    fn mmw_takes_the_24_and_32_column_tiles_of_k_quant_groups_only() {
        use GgmlType::*;
        for n in 17..64 {
            let (_, name, _) = mmk_launch(n, 4096, false);
            let (_, silu, _) = mmk_launch(n, 4096, true);
            let nt = mmt_tile_nt(n);
            for types in [&[Q4_K][..], &[Q5_K], &[Q6_K], &[Q4_K, Q5_K, Q6_K, Q4_K]] {
                assert_eq!(
                    mmw_route(true, &name, types, false),
                    Some(nt),
                    "{n} columns"
                );
                // Off, or a k-major activation: the cp.async tiles.
                assert_eq!(mmw_route(false, &name, types, false), None);
                assert_eq!(mmw_route(true, &name, types, true), None);
            }
            for pair in [[Q4_K, Q4_K], [Q5_K, Q4_K]] {
                assert_eq!(mmw_route(true, &silu, &pair, false), Some(nt), "{pair:?}");
            }
            // A Q6_K gate or up, or another format: mmt_*.
            for types in [&[Q4_K, Q6_K][..], &[Q6_K, Q5_K], &[Q6_K, Q6_K]] {
                assert_eq!(mmw_route(true, &silu, types, false), None, "{types:?}");
            }
            for types in [&[Q8_0][..], &[Q4_K, Q8_0], &[]] {
                assert_eq!(mmw_route(true, &name, types, false), None, "{types:?}");
            }
        }
        // Narrower groups (mmv_*, mmk_*) and 64-column prefill tiles stay where they were.
        for n in [2, 8, 16, 64, 512] {
            let (_, name, _) = mmk_launch(n, 4096, false);
            assert_eq!(mmw_route(true, &name, &[Q4_K], false), None, "{n} columns");
        }
        // The split kernels' names follow the tile kernels' (mmt_split_4 -> mmw_split_4).
        assert_eq!("mmt_split_4".replace("mmt_", "mmw_"), "mmw_split_4");
        // Decode groups from 64 columns on: mmw_*'s tiles side by side where it takes the
        // launch, mmt_8 where it does not; below 64 the same launch as mmk_launch.
        for n in (17..=200).chain([256, 511, 512]) {
            for silu in [false, true] {
                for (types, kmajor, on) in [
                    (&[Q4_K, Q5_K][..], false, true),
                    (&[Q4_K, Q5_K], true, true),
                    (&[Q4_K, Q5_K], false, false),
                    (&[Q6_K, Q4_K], false, true),
                    (&[Q8_0], false, true),
                ] {
                    let (cfg, name, rows) = group_launch(n, 6656, silu, types, kmajor, on);
                    let tile = if silu { "mmt_silu_4" } else { "mmt_4" };
                    let mmw = mmw_route(on, tile, types, kmajor).is_some();
                    let plain = mmk_launch(n, 6656, silu);
                    if n < mmt8_min() || !mmw {
                        assert_eq!((&name, rows), (&plain.1, plain.2), "{n} columns");
                        assert_eq!(cfg.grid_dim, plain.0.grid_dim);
                        continue;
                    }
                    let nt = mmt_tile_nt(n);
                    assert_eq!(mmw_route(on, &name, types, kmajor), Some(nt), "{n}: {name}");
                    assert_eq!(cfg.grid_dim.0 as usize, n.div_ceil(8 * nt), "{n} columns");
                    assert_eq!((cfg.grid_dim.1 as usize, rows), (6656 / MMT_ROWS, MMT_ROWS));
                }
            }
        }
    }

    #[test]
    fn narrow_groups_take_mmw_where_it_takes_their_matrices() {
        use GgmlType::*;
        for n in 2..=16 {
            for silu in [false, true] {
                for (types, kmajor, on) in [
                    (&[Q4_K, Q5_K][..], false, true),
                    (&[Q6_K], false, true),
                    (&[Q6_K, Q4_K], false, true),
                    (&[Q4_K], true, true),
                    (&[Q4_K], false, false),
                    (&[Q8_0], false, true),
                ] {
                    let (cfg, name, rows) = group_launch(n, 6656, silu, types, kmajor, on);
                    let mmw = mmw_route(on, &name, types, kmajor);
                    let narrow = n >= mmw_narrow_min()
                        && on
                        && !kmajor
                        && !types.contains(&Q8_0)
                        && !(silu && types.contains(&Q6_K));
                    if narrow {
                        // One tile of 16 columns over 64-row blocks, on mmw_2.
                        assert_eq!(mmw, Some(2), "{n} {types:?} {name}");
                        assert_eq!(mmw_group_nt(n), 2);
                        assert_eq!(cfg.grid_dim, (1, 6656 / MMT_ROWS as u32, 1));
                        assert_eq!(rows, MMT_ROWS);
                    } else {
                        // Otherwise mmk_launch's tiles (and mmv_* in the engine).
                        assert_eq!(mmw, None, "{n} {types:?} {name}");
                        let plain = mmk_launch(n, 6656, silu);
                        assert_eq!((&name, rows), (&plain.1, plain.2));
                        assert!(name.starts_with("mmk"), "{n}: {name}");
                    }
                }
            }
        }
    }

    #[test]
    fn mmw_smem_holds_three_stages_and_three_blocks_fit_an_sm() {
        // common.cuh: mmw_xb(nt) = 8 nt (256 + 4 + 32); a stage the largest weights and one region.
        assert!(crate::compile::COMMON_HEADER
            .contains("constexpr int mmw_xb(int nt) { return 8 * nt * (256 + 4 + 32); }"));
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(f, _)| *f == "mmt.cu")
            .unwrap()
            .1;
        assert!(src.contains("#define MMW_STAGES 3"));
        assert!(src.contains("#define MMW_Q6_QUAD 784"));
        // The largest weights of a stage: Q6_K's 16 quads of 4 x 192 bytes (784 apart) and
        // their scales, against Q5_K's 64 rows of 176.
        let q6 = 16 * 784 + 64 * 16;
        assert!(q6 > 64 * 176 && 784 >= 4 * 192);
        assert!(src.contains("#define MMW_Q4_PAIR_STAGES 2"));
        for nt in 2..=4 {
            // Three Q6_K stages, or two Q4_K stages of two super-blocks (the larger at 4 tiles).
            let q4_pairs = 2 * 2 * (64 * 144 + 8 * nt * 292);
            assert_eq!(mmw_smem(nt), (3 * (q6 + 8 * nt * 292)).max(q4_pairs) + 48);
            assert_eq!(mmw_smem(4), 2 * 2 * (64 * 144 + 32 * 292) + 48);
            // Three blocks per SM (launch bounds 128, 3) in the H200's 227 KB (plus the 1 KB
            // each block reserves and the split kernel's flag).
            assert!(3 * (mmw_smem(nt) + 1024 + 128) <= 227 * 1024, "{nt} tiles");
            // Every region and stage starts on 16 bytes (bulk copies).
            assert_eq!(mmw_xb(nt) % 16, 0);
        }
    }

    /// Host mirror of mmt.cu's `mmw_swz`: column c's 16-byte piece p sits at p ^ mmw_swz(c).
    fn mmw_swz(c: usize) -> usize {
        2 * (c & 3) + ((c >> 2) & 1)
    }

    /// The most distinct 4-byte words that the shared-memory accesses `addr` (byte addresses,
    /// `width` bytes each) of one wavefront ask of one bank: 1 when conflict-free.
    fn conflict_degree(addr: &[usize], width: usize) -> usize {
        let mut words: Vec<std::collections::BTreeSet<usize>> = vec![Default::default(); 32];
        for &a in addr {
            for w in 0..width / 4 {
                words[(a / 4 + w) % 32].insert(a / 4 + w);
            }
        }
        words.iter().map(|s| s.len()).max().unwrap_or(0)
    }

    fn conflict_free(addr: &[usize], width: usize) -> bool {
        conflict_degree(addr, width) <= 1
    }

    #[test]
    fn mmw_fragment_loads_and_their_bank_conflicts() {
        // Lane l of a warp: g = l / 4 (the MMA row / column), t = l % 4.
        let lanes = |r: std::ops::Range<usize>| r.map(|l| (l / 4, l % 4)).collect::<Vec<_>>();
        for nt in 0..4 {
            for s in 0..8 {
                // Q4_K/Q5_K B fragments: 8 bytes per lane (values 8t.. of sub-block s of column
                // 8 nt + g), 16 lanes (128 bytes) per wavefront.
                for half in [lanes(0..16), lanes(16..32)] {
                    let a: Vec<usize> = half
                        .iter()
                        .map(|&(g, t)| {
                            let c = 8 * nt + g;
                            c * 256 + (((2 * s + (t >> 1)) ^ mmw_swz(c)) << 4) + 8 * (t & 1)
                        })
                        .collect();
                    assert!(conflict_free(&a, 8), "Q4_K/Q5_K x tile {nt} sub-block {s}");
                }
            }
            for s in 0..16 {
                // Q6_K B fragments: 4 bytes per lane (values 4t.. of sub-block s), the warp at once.
                let a: Vec<usize> = lanes(0..32)
                    .iter()
                    .map(|&(g, t)| {
                        let c = 8 * nt + g;
                        c * 256 + ((s ^ mmw_swz(c)) << 4) + 4 * t
                    })
                    .collect();
                assert!(conflict_free(&a, 4), "Q6_K x tile {nt} sub-block {s}");
            }
        }
        // Q4_K/Q5_K A fragments: row g of warp w is block g % 4 of quad 4 w + g / 4 (4 blocks of
        // 144 or 176 bytes, as copied), 8 bytes per lane at the same offset of every row: two
        // rows of a half-warp share banks, a 2-way conflict (at most), which the cp.async
        // stages of mmt_* avoid with padded rows. A row order like mmw_q6's would remove it
        // (rows 0 and 2 of quads 4 w and 4 w + 1 in the first half-warp, rows 1 and 3 in the
        // second): not adopted yet, as it was not measured.
        for (bs, what) in [(144, "Q4_K"), (176, "Q5_K")] {
            for w in 0..4 {
                for o in (16..bs).step_by(32) {
                    for half in [lanes(0..16), lanes(16..32)] {
                        let a: Vec<usize> = half
                            .iter()
                            .map(|&(g, t)| (4 * w + g / 4) * 4 * bs + (g % 4) * bs + o + 8 * t)
                            .collect();
                        assert_eq!(
                            conflict_degree(&a, 8),
                            2,
                            "{what} rows, warp {w}, offset {o}"
                        );
                        let better: Vec<usize> = half
                            .iter()
                            .map(|&(g, t)| {
                                let (q, i) = (4 * w + (g & 1), 2 * ((g >> 1) & 1) + (g >> 2));
                                q * 4 * bs + i * bs + o + 8 * t
                            })
                            .collect();
                        assert!(conflict_free(&better, 8), "{what} reordered rows");
                    }
                    // Q4_K's stages of two super-blocks (mmt.cu MmwGeo: a quad's two blocks runs
                    // side by side, quads 2 x 4 blocks apart): a half-warp still reads one quad,
                    // so the same 2-way conflict, no more.
                    if bs == 144 {
                        for p in 0..2 {
                            for half in [lanes(0..16), lanes(16..32)] {
                                let a: Vec<usize> = half
                                    .iter()
                                    .map(|&(g, t)| {
                                        (4 * w + g / 4) * 2 * 4 * bs
                                            + p * 4 * bs
                                            + (g % 4) * bs
                                            + o
                                            + 8 * t
                                    })
                                    .collect();
                                assert_eq!(
                                    conflict_degree(&a, 8),
                                    2,
                                    "paired stage, warp {w}, {o}"
                                );
                            }
                        }
                    }
                }
            }
        }
        // Q6_K A fragments: rows g and g + 8 of warp w are rows g % 2 and 2 + g % 2 of quad
        // 4 w + g / 2 (mmw_q6), quads 784 bytes apart; 4 bytes per lane at the same offset o in
        // every row's 192-byte block.
        for w in 0..4 {
            for o in (0..192).step_by(16) {
                for second in [0, 2] {
                    let a: Vec<usize> = lanes(0..32)
                        .iter()
                        .map(|&(g, t)| (4 * w + g / 2) * 784 + (second + g % 2) * 192 + o + 4 * t)
                        .collect();
                    assert!(conflict_free(&a, 4), "Q6_K rows, warp {w}, offset {o}");
                }
            }
        }
        // Without the 16 bytes of padding (quads 768 apart) the same loads would conflict.
        let dense: Vec<usize> = lanes(0..32)
            .iter()
            .map(|&(g, t)| (g / 2) * 768 + (g % 2) * 192 + 4 * t)
            .collect();
        assert!(!conflict_free(&dense, 4));
    }

    #[test]
    fn decode_groups_and_prefill_of_k_quants_route_to_the_tensor_cores() {
        // Muse Glimmer's K-quant matrices (type, input width) at every routing boundary.
        for (k, ty) in [
            (6656usize, GgmlType::Q4_K),
            (6656, GgmlType::Q6_K),
            (4096, GgmlType::Q4_K),
            (19968, GgmlType::Q4_K),
            (19968, GgmlType::Q6_K),
            (6656, GgmlType::Q5_K),
        ] {
            assert!(!uses_mmk(ty, 1, k), "one column runs on mvk_1");
            assert!(uses_mvk(ty, 1, k), "{ty} at K = {k}, one column");
            for n in [2, 4, 8, 9, 16, 17, 32, 64, 65, 512] {
                assert!(uses_mmk(ty, n, k), "{ty} at K = {k}, {n} columns");
                assert!(!uses_mvk(ty, n, k));
            }
            // Row-major activation for them: k-major only serves Q8_0 groups.
            assert!(!kmajor_layout(8, k, &[ty]));
        }
        for ty in [GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
            assert!(!uses_mmk(ty, 8, 6656) && !uses_mmk(ty, 512, 6656));
            assert!(!uses_mvk(ty, 1, 6656));
        }
    }

    /// Host mirror of `mvk_span` in common.cuh: (job, first task, end) of warp w of W, for
    /// tasks of `unit` rows (4: mvk_1, 16: mmv_1).
    fn mvk_span(
        starts: &[usize],
        nch: usize,
        unit: usize,
        ww: usize,
        w: usize,
    ) -> (usize, usize, usize) {
        let nj = starts.len() - 1;
        let t_all = starts[nj] / unit * nch;
        let f = ww - nj;
        let ts = |u: usize| starts[u] / unit * nch;
        let ws = |u: usize| if u < nj { u + f * ts(u) / t_all } else { ww };
        let j = (1..nj).rfind(|&u| w >= ws(u)).unwrap_or(0);
        let (wa, wb, ta, tb) = (ws(j), ws(j + 1), ts(j), ts(j + 1));
        (
            j,
            ta + (tb - ta) * (w - wa) / (wb - wa),
            ta + (tb - ta) * (w + 1 - wa) / (wb - wa),
        )
    }

    /// Host mirror of `mvk_span_whole` in common.cuh: ([a0, a1), [b0, b1)) of warp w of job j.
    fn mvk_span_whole(share: [usize; 4], nch: usize, w: usize) -> ((usize, usize), (usize, usize)) {
        let [wa, wb, ta, tb] = share;
        let (nw, i, nq) = (wb - wa, w - wa, (tb - ta) / nch);
        let lt = (nq - nw) * nch;
        let b0 = ta + lt + i * nch;
        ((ta + lt * i / nw, ta + lt * (i + 1) / nw), (b0, b0 + nch))
    }

    /// `mvk_1_whole`'s split (`mvk_span_whole`), where `mvk_whole_fits` gives it a launch: every
    /// task once, in the warp's job (the shares of `mvk_span`, whose host mirror the test checks
    /// `mvk_shares` against), each warp one whole row quad after at most one quad of the leftover
    /// ones, which alone are shared; and which launches take it.
    #[test]
    fn mvk_whole_split_takes_every_task_once_and_shares_only_the_leftover_quads() {
        let sms = 132;
        // (rows of each job, K, whether mvk_1_whole takes the launch on 132 SMs).
        let launches: [(&[usize], usize, bool); 9] = [
            (&[4096, 256, 256, 4096], 6656, true), // Muse Glimmer's q+k+v+gate: 2,176 quads
            (&[8704], 6656, true),
            (&[4096, 512, 512], 6656, false), // 1,280 quads: fewer than the 2,112 warps
            (&[6656], 19968, false),          // ffn_down: one warp per quad already
            (&[202048], 6656, false),         // the LM head: 24 quads a warp
            (&[4096, 256, 256, 4096], 256, false),
            (&[16896], 6656, false), // 2 W quads
            (&[6, 4096, 2, 33], 6656, false),
            (&[5, 3, 1, 7], 512, false),
        ];
        for (rows, k, fits) in launches {
            let nch = mvk_chunks(k);
            let mut starts = vec![0];
            for r in rows {
                starts.push(starts.last().unwrap() + r.div_ceil(4) * 4);
            }
            let quads = starts[rows.len()] / 4;
            let tasks = quads * nch;
            let ww = 4 * mvk_blocks(quads, nch, sms) as usize;
            let shares = mvk_shares(&starts, nch, 4, ww);
            for (w, share) in (0..ww).map(|w| (w, mvk_span(&starts, nch, 4, ww, w))) {
                let [wa, wb, ta, tb] = shares[share.0];
                assert!(
                    w >= wa && w < wb && share.1 >= ta && share.2 <= tb,
                    "{rows:?} warp {w}"
                );
            }
            assert_eq!(mvk_whole_fits(&starts, nch, ww), fits, "{rows:?} K {k}");
            if !fits {
                continue;
            }
            let (mut seen, mut shared) = (vec![0u8; tasks], vec![0u8; quads]);
            for (j, &share) in shares.iter().enumerate() {
                for w in share[0]..share[1] {
                    let ((a0, a1), (b0, b1)) = mvk_span_whole(share, nch, w);
                    assert!(a1 - a0 <= nch && b1 == b0 + nch && b0 % nch == 0 && a1 <= b0);
                    for t in (a0..a1).chain(b0..b1) {
                        assert!(4 * (t / nch) >= starts[j] && 4 * (t / nch) < starts[j + 1]);
                        seen[t] += 1;
                    }
                    for t in (a0..a1).filter(|&t| t / nch * nch < a0 || t / nch * nch + nch > a1) {
                        shared[t / nch] = 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&s| s == 1),
                "{rows:?}: a task missed or repeated"
            );
            let n = shared.iter().filter(|&&s| s == 1).count();
            let left: usize = shares
                .iter()
                .map(|s| (s[3] - s[2]) / nch - (s[1] - s[0]))
                .sum();
            assert!(
                n > 0 && n <= left,
                "{rows:?}: {n} shared quads, {left} left over"
            );
        }
    }

    /// `mvk_1_spread`'s span (`mvk_span_spread` in common.cuh): on a full grid, every row quad to
    /// exactly one warp, and every 4-warp block (so every SM) 3 or 4 of them, where the packed
    /// grid of one warp per quad has 4 or none; `mvk_spread_fits` takes attn_output and ffn_down
    /// (1,664 quads on 132 SMs) and not q+k+v or the LM head.
    #[test]
    fn mvk_spread_gives_each_quad_one_warp_and_each_block_three_or_four() {
        for sms in [132usize, 114, 78, 1] {
            let ww = 16 * sms;
            for quads in [(3 * ww).div_ceil(4), 1664.min(ww), 13 * sms, ww] {
                if !mvk_spread_fits(1, quads, sms) {
                    assert!(4 * quads < 3 * ww, "{quads} quads on {sms} SMs");
                    continue;
                }
                let mut seen = vec![0u8; quads];
                for b in 0..ww / 4 {
                    let mut active = 0;
                    for w in 4 * b..4 * b + 4 {
                        let q = w * quads / ww;
                        if (w + 1) * quads / ww != q {
                            seen[q] += 1;
                            active += 1;
                        }
                    }
                    assert!((3..=4).contains(&active), "block {b}: {active} quads");
                }
                assert!(seen.iter().all(|&n| n == 1), "{quads} quads on {sms} SMs");
            }
        }
        assert!(mvk_spread_fits(1, 1664, 132));
        assert!(!mvk_spread_fits(4, 1664, 132) && !mvk_spread_fits(1, 1152, 132));
        assert!(!mvk_spread_fits(1, 50512, 132) && !mvk_spread_fits(1, 2176, 132));
    }

    /// `silu_finish_q8k` (matvec.cu) finds the warp that ran task t of a gate+up launch as
    /// ceil((t + 1) W / T) - 1, the inverse of `mvk_range` (warp w takes tasks T w / W ..
    /// T (w + 1) / W): checked against the ranges themselves at the Glimmer shapes and random
    /// ones, including launches with fewer tasks than warps.
    #[test]
    fn silu_finish_finds_each_task_warp_as_mvk_range_splits_them() {
        // The kernel's `((t + 1) * W + T - 1) / T - 1`.
        let owner = |t: u64, tt: u64, w: u64| ((t + 1) * w).div_ceil(tt) - 1;
        let mut rng = 0x9e37_79b9u64;
        let mut shapes = vec![(4992 * 14, 2112), (192 * 2, 2112), (1152 * 7, 2112), (7, 3)];
        for _ in 0..200 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            shapes.push(((rng >> 33) % 6000 + 1, (rng >> 13) % 900 + 1));
        }
        for (tt, ww) in shapes {
            for w in 0..ww {
                let (t0, t1) = (tt * w / ww, tt * (w + 1) / ww);
                for t in t0..t1 {
                    assert_eq!(owner(t, tt, ww), w, "task {t} of {tt} over {ww} warps");
                }
            }
        }
    }

    /// The one-column kernels (`mvk_1`: tasks of a row quad) and the 8-column groups (`mmv_1`:
    /// tasks of 16 rows) divide a launch's tasks among their warps: each task once, each warp's
    /// tasks in one job, no warp far above the mean.
    #[test]
    fn mvk_warps_take_every_task_once_within_one_job_and_in_balance() {
        let sms = 132;
        // Glimmer's one-column launches: q+k+v+gate, attn_output, ffn_down, the LM head, and
        // small or odd ones (a job smaller than a warp's share, rows not a multiple of 4).
        let launches: [&[usize]; 8] = [
            &[4096, 256, 256, 4096],
            &[6656],
            &[8192],
            &[202048],
            &[256],
            &[6656, 4096],
            &[6, 4096, 2, 33],
            &[5, 3, 1, 7],
        ];
        for (unit, spread) in [(4usize, false), (MMK_ROWS, false), (MMK_ROWS, true)] {
            for rows in launches {
                for k in [256usize, 4096, 6656, 19968] {
                    let nch = mvk_chunks(k);
                    let mut starts = vec![0];
                    for r in rows {
                        starts.push(starts.last().unwrap() + r.div_ceil(unit) * unit);
                    }
                    let tasks = starts[rows.len()] / unit * nch;
                    let blocks = if unit == 4 {
                        mvk_blocks(tasks / nch, nch, sms)
                    } else {
                        let g = mmv_grid(tasks, sms, 4, spread);
                        // Spread: the full wave from 3/4 of its warps on (run 87).
                        let full = spread && 4 * tasks >= 3 * 4 * sms * 4;
                        assert!(!full || g as usize == 4 * sms, "{rows:?} K {k}: {g} blocks");
                        g
                    };
                    let ww = 4 * blocks as usize;
                    assert!(
                        ww >= rows.len() && ww <= sms * 16,
                        "{rows:?} K {k}: {ww} warps"
                    );
                    let mut seen = vec![0u8; tasks];
                    let mut most = 0;
                    for w in 0..ww {
                        let (j, t0, t1) = mvk_span(&starts, nch, unit, ww, w);
                        assert!(t0 <= t1);
                        for (t, s) in seen.iter_mut().enumerate().take(t1).skip(t0) {
                            // Task t's row block lies in job j.
                            let rb = t / nch;
                            assert!(
                                unit * rb >= starts[j] && unit * rb < starts[j + 1],
                                "{rows:?} {t}"
                            );
                            *s += 1;
                        }
                        most = most.max(t1 - t0);
                    }
                    assert!(
                        seen.iter().all(|&s| s == 1),
                        "{rows:?} K {k}: a task missed or repeated"
                    );
                    // One job of one row quad per warp: no row quad shared between warps.
                    let quads = rows[0].div_ceil(4);
                    if unit == 4
                        && rows.len() == 1
                        && quads <= sms * 16
                        && 4 * quads >= 3 * sms * 16
                        && quads % 4 == 0
                    {
                        assert_eq!(ww, quads);
                        for w in 0..ww {
                            let (_, t0, t1) = mvk_span(&starts, nch, unit, ww, w);
                            assert!(t0 % nch == 0 && t1 % nch == 0, "{rows:?} K {k}: warp {w}");
                        }
                    }
                    // No warp far above the mean (a job's share rounds to whole warps).
                    let mean = tasks.div_ceil(ww);
                    assert!(
                        most <= 2 * mean + 2,
                        "{rows:?} K {k}: {most} tasks against a mean of {mean}"
                    );
                    assert!(mvk_fits(tasks, blocks).is_ok());
                    // The split scratch holds every chunk value and counter.
                    assert_eq!(starts[rows.len()] * nch, tasks * unit);
                }
            }
        }
    }

    #[test]
    fn q8_0_decode_groups_get_the_k_major_layout_and_the_rest_the_row_major() {
        let q8 = [GgmlType::Q4_K, GgmlType::Q8_0];
        assert!(!kmajor_layout(1, 6656, &q8));
        assert!(kmajor_layout(2, 6656, &q8));
        assert!(kmajor_layout(64, 6656, &q8));
        assert!(!kmajor_layout(65, 6656, &q8));
        assert!(!kmajor_layout(8, 6656, &[GgmlType::Q4_K, GgmlType::Q6_K]));
        // The Q8_0 quantizer (no K-quant, or K not a multiple of 256) keeps the row-major layout.
        assert!(!kmajor_layout(8, 6656, &[GgmlType::Q8_0]));
        assert!(!kmajor_layout(8, 6656 + 32, &[GgmlType::Q8_0]));
        // Every column count up to MAX_COLS has its matvec kernel.
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(f, _)| *f == "matvec.cu")
            .unwrap()
            .1;
        let compiled = crate::device::kernel_names(src);
        for silu in [false, true] {
            let one = matvec_config(1, 100, silu).1;
            let group = matvec_config(2, 100, silu).1;
            assert!(one != group);
            assert!(compiled.iter().any(|k| k == one) && compiled.iter().any(|k| k == group));
            for n in 2..=MAX_COLS {
                assert_eq!(matvec_config(n, 100, silu).1, group);
            }
        }
    }

    #[test]
    fn glimmer_matrices_route_to_dp4a_kernels_with_aligned_rows() {
        // (rows, cols, type) of Muse Glimmer's matrices.
        for (cols, ty) in [
            (6656u64, GgmlType::Q4_K),
            (6656, GgmlType::Q6_K),
            (4096, GgmlType::Q4_K),
            (19968, GgmlType::Q4_K),
            (19968, GgmlType::Q6_K),
            (6656, GgmlType::Q5_K),
        ] {
            assert!(uses_q8_activation(ty));
            assert!(format_code(ty).is_ok());
            let rb = ty.row_bytes(cols).unwrap();
            if ty != GgmlType::Q6_K {
                assert_eq!(rb % 16, 0, "{ty} rows of {cols}");
            }
        }
    }

    #[test]
    fn fused_quantization_only_where_the_kernels_read_row_major_q8_k() {
        use GgmlType::*;
        // K-quants read Q8_K row-major at any width and any number of columns...
        for ncols in [1, 2, 8, 16, 17, 64, 512] {
            assert!(reads_row_major_q8_k(ncols, 6656, &[Q4_K, Q6_K]));
        }
        // ...but for a Q8_0 matrix among them decode groups take the k-major layout,
        assert!(reads_row_major_q8_k(1, 4096, &[Q4_K, Q8_0]));
        assert!(!reads_row_major_q8_k(8, 4096, &[Q4_K, Q8_0]));
        // Q8_0 alone reads Q8_0 blocks, float matrices read no int8, and a width that is not a
        // whole number of super-blocks has no Q8_K.
        assert!(!reads_row_major_q8_k(1, 4096, &[Q8_0]));
        assert!(!reads_row_major_q8_k(1, 4096, &[F16, F32]));
        assert!(!reads_row_major_q8_k(1, 4000, &[Q4_K]));
    }

    #[test]
    fn mmv_rings_match_the_kernel_and_fit_an_sm() {
        // The slot sizes the host reserves are those mmk.cu reads and writes (its #defines).
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(f, _)| *f == "mmk.cu")
            .map(|(_, s)| *s)
            .expect("mmk.cu");
        let def = |name: &str| {
            let line = src
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("#define {name}"));
            line[name.len() + 9..]
                .split("//")
                .next()
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(def("MMV_Q6_ROW"), "208");
        assert_eq!(def("MMV_SLOT_ONE"), "(MMV_Q6_D + 16 * 2)");
        assert_eq!(def("MMV_Q6_D"), "(MMV_Q6_SC + 16 * 16)");
        assert_eq!(def("MMV_Q6_SC"), "(16 * MMV_Q6_ROW)");
        assert_eq!(def("MMV_SLOT_PAIR"), "(2 * 16 * 144)");
        assert_eq!(MMV_SLOT_ONE, 3616);
        // mmv_silu_1's 4 blocks stay within the 164 KiB shared-memory carveout. H200, 8 streams
        // (2026-12-03, lab run 38): slot rows padded to 160 bytes (4 x 42 KiB, the 196 KiB
        // carveout) lost 6%. (More L1 for the activations gained nothing either: lab run 40.)
        let (_, per_sm) = mmv_kernel(8, true, true).expect("mmv_silu_1");
        assert!(per_sm * (mmv_smem(true, mmv_stages(1)) + 1024) <= 164 * 1024);
        // Every stage count, at the blocks per SM mmv_kernel promises, fits the 227 KiB an H200
        // block may use and the 228 KiB of an SM (1 KiB reserved per block).
        for ncols in [2, 8, 9, 16] {
            for silu in [false, true] {
                let (_, per_sm) = mmv_kernel(ncols, silu, true).expect("an mmv kernel");
                let smem = mmv_smem(silu, mmv_stages(ncols.div_ceil(8)));
                assert!(smem <= 227 * 1024, "{ncols} {silu}: {smem}");
                assert!(
                    per_sm * (smem + 1024) <= 228 * 1024,
                    "{ncols} {silu}: {per_sm} x {smem}"
                );
            }
        }
        assert!(mmv_smem(true, 2) > mmv_smem(false, 2));
    }

    #[test]
    fn repack_places_every_block() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (ty, bs) in [
            (GgmlType::Q4_K, 144usize),
            (GgmlType::Q5_K, 176),
            (GgmlType::Q6_K, 210),
            (GgmlType::Q8_0, 34),
        ] {
            // 7 rows (one padded quad) of 3 blocks.
            let (rows, nb) = (7usize, 3usize);
            let bytes: Vec<u8> = (0..rows * nb * bs)
                .map(|_| rng.gen_range(1..=255))
                .collect();
            let out = repack(ty, rows, &bytes);
            // Into a reused buffer full of other bytes (the upload's staging buffer): the same
            // bytes, the padding rows' zeros included.
            let n = repacked_len(ty, rows, bytes.len()).expect("a repacked type");
            let mut reused = vec![0xA5u8; n + 9];
            repack_to(ty, rows, &bytes, &mut reused[..n]);
            assert_eq!(&reused[..n], &out[..], "{ty}: repack_to into a used buffer");
            let blk = |r: usize, b: usize| &bytes[(r * nb + b) * bs..(r * nb + b + 1) * bs];
            if ty == GgmlType::Q8_0 {
                let nblk = rows * nb;
                assert_eq!(out.len(), bytes.len());
                assert_eq!(&out[5 * 32..6 * 32], &blk(1, 2)[2..34]);
                assert_eq!(&out[nblk * 32 + 10..nblk * 32 + 12], &blk(1, 2)[..2]);
                continue;
            }
            // Padded to 8 rows; block b of row r at ((r / 4) * nb + b) * 4 + r % 4.
            let nblk = 8 * nb;
            assert_eq!(out.len(), nblk * bs, "{ty}");
            let at = |r: usize, b: usize| ((r / 4) * nb + b) * 4 + r % 4;
            for r in 0..8 {
                for b in 0..nb {
                    let k = at(r, b);
                    let (q, s, d) = if ty == GgmlType::Q6_K {
                        (
                            &out[k * 192..(k + 1) * 192],
                            &out[nblk * 192 + k * 16..nblk * 192 + (k + 1) * 16],
                            &out[nblk * 208 + k * 2..nblk * 208 + (k + 1) * 2],
                        )
                    } else {
                        (&out[k * bs..(k + 1) * bs], &[][..], &[][..])
                    };
                    if r >= rows {
                        // Padding rows: zero blocks (d = 0, so every value is 0).
                        assert!(
                            q.iter().chain(s).chain(d).all(|&x| x == 0),
                            "{ty} pad {r} {b}"
                        );
                    } else if ty == GgmlType::Q6_K {
                        assert_eq!(q, &blk(r, b)[..192]);
                        assert_eq!(s, &blk(r, b)[192..208]);
                        assert_eq!(d, &blk(r, b)[208..210]);
                    } else {
                        assert_eq!(q, blk(r, b), "{ty} row {r} block {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_window_reads_as_the_matrix_of_its_rows() {
        // The bytes of rows r0..r1 resident on their own are the whole matrix's resident bytes
        // from window_offset on, for every type a window serves; the planar types serve none.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(89);
        let cols = 512;
        for (ty, row_bytes) in [
            (GgmlType::Q4_K, 2 * 144),
            (GgmlType::Q5_K, 2 * 176),
            (GgmlType::F16, cols * 2),
            (GgmlType::F32, cols * 4),
        ] {
            let rows = 4 * rng.gen_range(3..40);
            let bytes: Vec<u8> = (0..rows * row_bytes).map(|_| rng.gen()).collect();
            let whole = repack(ty, rows, &bytes);
            for (r0, r1) in row_chunks(rows, rng.gen_range(2..5), 4) {
                let own = repack(ty, r1 - r0, &bytes[r0 * row_bytes..r1 * row_bytes]);
                let at = window_offset(ty, rows, cols, r0).expect("a window");
                assert_eq!(
                    &whole[at..at + own.len()],
                    &own[..],
                    "{ty:?} rows {r0}..{r1}"
                );
            }
            assert_eq!(window_offset(ty, rows, cols, rows + 1), None);
        }
        assert_eq!(window_offset(GgmlType::Q4_K, 64, 256, 2), None);
        assert_eq!(window_offset(GgmlType::Q6_K, 64, 256, 4), None);
        assert_eq!(window_offset(GgmlType::Q8_0, 64, 256, 4), None);
    }
}
