//! K-quant weights (Q4_K, Q5_K, Q6_K) repacked at load so that one register holds R rows: R = 16
//! (zmm) on AVX-512 VNNI CPUs (`avx512.rs`), R = 8 (ymm) on AVX2 ones (`avx2.rs`), the kernels
//! written once over the level (`kernels.rs`). The repacked matrices serve every matmul over
//! them: decode, decode groups and prefill.
//!
//! Layout. Rows in groups of R (the last padded with zero blocks); per group and super-block,
//! `Lay::block(ty)` bytes: the R GGUF blocks' own plus at most 4 R (the scales unpacked). A
//! "dword" of a row is 4 consecutive quant bytes; dword i of the R rows is one line of 4 R bytes,
//! row r at 4 r, so one load brings R rows' 4-value groups, and one multiply-add with the
//! column's 4 activation bytes broadcast (`vpdpbusd`, or `vpmaddubsw` then `vpmaddwd`) adds R
//! rows' 4 products. No lane is ever reduced across: lane r is row r. A pass takes several
//! columns at once, each line unpacked once for all of them (`pass_cols`: up to 8 with 16-row
//! groups, 2 with 8-row ones). Offsets, in units of R:
//!
//! - Q4_K (148 R bytes) and Q5_K (180 R): 0: the rows' `d` (f16), 2 R: `dmin`; 4 R: scale j of row
//!   r at 4 R + R j + r; 12 R: min pair k of row r at 12 R + 2 R k + 2 r (m_2k, m_2k+1: one zero
//!   extension gives the i16 pairs of `vpdpwssd` / `vpmaddwd`); 20 R: `qs` dword i at 20 R + 4 R i
//!   (Q5_K: `qh` dword q at 20 R + 4 R q, then `qs` from 52 R). Dword i = 8 c + q of `qs` holds
//!   values 64 c + 4 q .. + 3 (low nibbles, sub-block 2 c) and 64 c + 32 + 4 q .. + 3 (high nibbles,
//!   sub-block 2 c + 1); bit j of `qh` byte l is the fifth bit of value 32 j + l.
//! - Q6_K (212 R): 0: scale pair k of row r at 2 R k + 2 r (sc_2k, sc_2k+1, i8); 16 R: the rows'
//!   `d`; 20 R: the quants, 16 triples of lines in the order the kernels read them (`Lay::q6`).
//!
//! Every format's lines lie in the order the kernels first read them, so a group's weights are one
//! forward stream. (A first layout, with Q6_K's scales at the end of each block and Q5_K's fifth
//! bits after its quants, streamed at 7.6 GB/s against 14.5-18.4 for the one-column dots from
//! memory, one thread; Q4_K at 23.8.)
//!
//! Order. Per (row, column) and block the exact integers of the scalar reference (the sub-block
//! dots times their scales; Q4_K/Q5_K the mins times the sub-block sums, Q6_K 32 times the scaled
//! sub-block sums), then its f32 step (`d_y * d * isc - d_y * dmin * im`, Q6_K `d_y * d * isc`)
//! added block by block from 0: the bits of `muser_quant::dot` and of the AVX-512 kernels
//! (`tests/gemm.rs`), at both levels. (muser-quant's AVX2 one-column dots add the blocks in
//! another f32 order; with the repacking an AVX2 CPU's K-quant matmuls no longer use them, so its
//! logits now have the scalar reference's bits, as an AVX-512 CPU's do.)
//!
//! Why. With the GGUF layout a one-column dot reduces each block's lanes to one row (the
//! horizontal sums and the per-row scale steps are most of its instructions), and on a 2-core
//! Zen 4 decode of 2-4 streams was bound by that arithmetic per column (BENCHMARKS.md,
//! 2026-12-02). llama.cpp repacks Q4_K for the same reason (8 rows interleaved on AVX2).

mod avx2;
mod avx512;
mod kernels;

use muser_gguf::GgmlType;
use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rows per group at most (AVX-512).
const R_MAX: usize = 16;

/// Columns a pass takes at most (16-row groups; 8-row groups take 2).
const C_MAX: usize = 8;

/// One group's outputs of one pass: `sums[t][r]`, column t of the pass, row r of the group.
pub(super) type Sums = [[f32; R_MAX]; C_MAX];

/// Columns per pass of a 16-row group over `n` columns: 8 for decode groups of up to 32
/// columns, 4 past that (prefill). `MUSER_X16_COLS=1..8` decides instead, for comparisons.
/// Measured on a 2-core Zen 4 (BENCHMARKS.md, 2026-12-05), llama-1b Q4_K_M, passes of 8
/// against passes of 4, alternated: 8 streams 206-231 -> 223-258 tokens/s (faster in 7 of 8
/// pairs), 16 streams 230-249 -> 255-276 (every pair), 24 streams 241-263 -> 262-277, 32
/// streams 254-267 -> 256-280 (every pair); prefill 2-11% slower (pp32 310-311 -> 305-306, pp64
/// 319-322 -> 286-310, pp512 300-302 -> 288-291), so calls of 17-32 columns, decode groups or
/// short prompts, lose ~2% on prompts to gain 3-15% on decode.
fn pass_cols(n: usize) -> usize {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| {
        std::env::var("MUSER_X16_COLS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|c| (1..=C_MAX).contains(c))
    });
    forced.unwrap_or(if n <= 32 { C_MAX } else { 4 })
}

/// Byte offsets of one group's super-block, for `r` rows per group (see the module doc).
#[derive(Clone, Copy)]
pub(super) struct Lay {
    pub r: usize,
}

impl Lay {
    pub const fn dmin(self) -> usize {
        2 * self.r
    }
    pub const fn sc(self) -> usize {
        4 * self.r
    }
    pub const fn mn(self) -> usize {
        12 * self.r
    }
    pub const fn qh5(self) -> usize {
        20 * self.r
    }
    pub const fn qs(self, five: bool) -> usize {
        if five {
            52 * self.r
        } else {
            20 * self.r
        }
    }
    pub const fn d6(self) -> usize {
        16 * self.r
    }
    /// Q6_K's triple of lines for half n and dword q: `ql` dwords 16 n + q and 16 n + 8 + q,
    /// then `qh` dword 8 n + q, in the kernels' order (n, then q / 4, then q % 4).
    pub const fn q6(self, n: usize, q: usize) -> usize {
        20 * self.r + 12 * self.r * (4 * (2 * n + q / 4) + q % 4)
    }
    pub const fn block(self, ty: GgmlType) -> Option<usize> {
        match ty {
            GgmlType::Q4_K => Some(148 * self.r),
            GgmlType::Q5_K => Some(180 * self.r),
            GgmlType::Q6_K => Some(212 * self.r),
            _ => None,
        }
    }

    /// Row r's dword i (bytes 4 i .. 4 i + 3 of `src`) to line i from `at`.
    fn put_dwords(self, o: &mut [u8], at: usize, r: usize, src: &[u8]) {
        for (i, d) in src.chunks_exact(4).enumerate() {
            let a = at + 4 * self.r * i + 4 * r;
            o[a..a + 4].copy_from_slice(d);
        }
    }

    /// Q4_K/Q5_K's d, dmin, scales and mins of row r.
    fn put_k4_meta(self, o: &mut [u8], r: usize, d: half::f16, dmin: half::f16, scales: &[u8; 12]) {
        o[2 * r..2 * r + 2].copy_from_slice(&d.to_bits().to_le_bytes());
        let m = self.dmin() + 2 * r;
        o[m..m + 2].copy_from_slice(&dmin.to_bits().to_le_bytes());
        for j in 0..8 {
            let (sc, m) = muser_quant::blocks::scale_min_k4(j, scales);
            o[self.sc() + self.r * j + r] = sc;
            o[self.mn() + 2 * self.r * (j / 2) + 2 * r + j % 2] = m;
        }
    }

    /// Row r's GGUF block `src` of format `ty` into the group's block `o`.
    fn put(self, ty: GgmlType, o: &mut [u8], r: usize, src: &[u8]) {
        match ty {
            GgmlType::Q4_K => {
                let blk: &BlockQ4K = bytemuck::from_bytes(src);
                self.put_k4_meta(o, r, blk.d, blk.dmin, &blk.scales);
                self.put_dwords(o, self.qs(false), r, &blk.qs);
            }
            GgmlType::Q5_K => {
                let blk: &BlockQ5K = bytemuck::from_bytes(src);
                self.put_k4_meta(o, r, blk.d, blk.dmin, &blk.scales);
                self.put_dwords(o, self.qs(true), r, &blk.qs);
                self.put_dwords(o, self.qh5(), r, &blk.qh);
            }
            _ => {
                let blk: &BlockQ6K = bytemuck::from_bytes(src);
                let line = 4 * self.r;
                for (i, d) in blk.ql.chunks_exact(4).enumerate() {
                    let at = self.q6(i / 16, i % 8) + line * ((i % 16) / 8) + 4 * r;
                    o[at..at + 4].copy_from_slice(d);
                }
                for (i, d) in blk.qh.chunks_exact(4).enumerate() {
                    let at = self.q6(i / 8, i % 8) + 2 * line + 4 * r;
                    o[at..at + 4].copy_from_slice(d);
                }
                for (j, &s) in blk.scales.iter().enumerate() {
                    o[2 * self.r * (j / 2) + 2 * r + j % 2] = s as u8;
                }
                let d = self.d6() + 2 * r;
                o[d..d + 2].copy_from_slice(&blk.d.to_bits().to_le_bytes());
            }
        }
    }
}

/// Rows per group this CPU's kernels take (16 with AVX-512 VNNI, 8 with AVX2, FMA and F16C),
/// or None; `MUSER_ISA` caps it as it caps the dot kernels.
pub fn rows_per_group() -> Option<usize> {
    static R: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *R.get_or_init(|| {
        if super::tile::available() {
            return Some(16);
        }
        let cap = std::env::var("MUSER_ISA").ok();
        (avx2::available() && cap.as_deref() != Some("scalar")).then_some(8)
    })
}

/// Whether this CPU runs these kernels.
pub fn available() -> bool {
    rows_per_group().is_some()
}

/// How the kernels ask for the weight lines of a group's first pass (which reads them from
/// memory; later passes find them in cache) before they read them (`kernels.rs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ahead {
    /// Not at all: the CPU's hardware prefetchers alone.
    None,
    /// Every line 4 KiB ahead into L1, at the start of each super-block (`kernels::PF_BLOCK`).
    Block,
    /// Each line 16 KiB ahead into L2, spread over the super-block's reads (`kernels::PF_SPREAD`).
    Spread,
}

/// The patterns of one-column passes (per format: Q4_K, Q5_K, Q6_K) and of 2-4-column passes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AheadPlan {
    pub one: [Ahead; 3],
    pub many: Ahead,
}

impl AheadPlan {
    /// One pattern for every pass.
    pub const fn all(a: Ahead) -> AheadPlan {
        AheadPlan {
            one: [a; 3],
            many: a,
        }
    }

    /// The pattern of a first pass over `c` columns of a `ty` matrix.
    pub fn pass(self, ty: GgmlType, c: usize) -> Ahead {
        match (c, ty) {
            (2.., _) => self.many,
            (_, GgmlType::Q4_K) => self.one[0],
            (_, GgmlType::Q5_K) => self.one[1],
            _ => self.one[2],
        }
    }

    /// `ONE,MANY`, or one pattern for every pass; ONE is one pattern or three, `Q4_K/Q5_K/Q6_K`;
    /// each pattern is `none`, `block` or `spread` (`none/spread/none,spread` is Zen 4's plan).
    pub fn parse(s: &str) -> Option<AheadPlan> {
        let one = |s: &str| match s.trim() {
            "none" => Some(Ahead::None),
            "block" => Some(Ahead::Block),
            "spread" => Some(Ahead::Spread),
            _ => None,
        };
        let (a, b) = s.split_once(',').unwrap_or((s, s));
        let many = one(b)?;
        let formats: Vec<&str> = a.split('/').collect();
        let one = match formats[..] {
            [x] => [one(x)?; 3],
            [x, y, z] => [one(x)?, one(y)?, one(z)?],
            _ => return None,
        };
        Some(AheadPlan { one, many })
    }
}

/// This CPU's [`AheadPlan`]. The patterns depend on the CPU's own prefetchers, and each was
/// measured where it is used (llama-1b, BENCHMARKS.md):
/// - AMD family 0x1A (Zen 5) and later: `Block` for every pass. One-thread tg32 on Q4_K_M
///   27.1-33.8 -> 37.9-47.1 tokens/s (2-core Zen 5, 2026-12-03).
/// - AMD family 0x19 with AVX-512 (Zen 4): `Spread` for 2-8 columns and for one column of Q5_K,
///   nothing for one column of Q4_K or Q6_K. There `Block` halved one-stream decode (one thread
///   39.0-40.2 without against 18.0-18.3 on Q4_K_M); `Spread` lifted decode groups of 4-16
///   streams by 14-60% and one thread's single stream of Q5_K_M by 21-29%, and cost one stream of
///   Q4_K_M 3-6% and of Q6_K 5-11% (2-core Zen 4, 2026-12-04). Passes of 8 columns need it
///   as much: 8 / 16 streams 162-163 / 204-211 tokens/s without, 249-253 / 265-268 with
///   (2026-12-05).
/// - Every other CPU (not measured): the hardware prefetchers alone.
///
/// `MUSER_X16_PREFETCH` (see [`AheadPlan::parse`]) decides instead, for comparisons.
pub fn ahead_plan() -> AheadPlan {
    static PLAN: std::sync::OnceLock<AheadPlan> = std::sync::OnceLock::new();
    *PLAN.get_or_init(|| {
        if let Some(p) = std::env::var("MUSER_X16_PREFETCH")
            .ok()
            .and_then(|v| AheadPlan::parse(&v))
        {
            return p;
        }
        match amd_family() {
            Some(f) if f >= 0x1A => AheadPlan::all(Ahead::Block),
            Some(0x19) if super::tile::available() => AheadPlan {
                one: [Ahead::None, Ahead::Spread, Ahead::None],
                many: Ahead::Spread,
            },
            _ => AheadPlan::all(Ahead::None),
        }
    })
}

/// The CPU family of an AMD CPU (base plus extended family, as AMD counts it), or None.
fn amd_family() -> Option<u32> {
    use std::arch::x86_64::__cpuid;
    let v = __cpuid(0);
    let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    if vendor != b"AuthenticAMD" {
        return None;
    }
    let eax = __cpuid(1).eax;
    let base = (eax >> 8) & 0xF;
    Some(if base == 0xF {
        base + ((eax >> 20) & 0xFF)
    } else {
        base
    })
}

/// Bytes of repacked matrices alive in this process.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// What the repacked copies may hold in all: the memory the OS reported available when the first
/// one was made, less a reserve for the KV cache, the activations and the rest of the system (a
/// tenth of the memory, at least 2 GiB); `MUSER_CPU_X16_BUDGET` (bytes) sets it instead. The
/// copies are anonymous memory and the GGUF's pages are the page cache's, so a model whose copy
/// does not fit would not fail to load but be killed when the pages are touched. Past the budget
/// its remaining matrices stay on the GGUF-layout paths, which read the mapped file (slower, the
/// same bits on AVX-512).
fn budget() -> usize {
    static B: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        if let Some(b) = std::env::var("MUSER_CPU_X16_BUDGET")
            .ok()
            .and_then(|v| v.trim().parse().ok())
        {
            return b;
        }
        let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib = |key: &str| -> Option<usize> {
            let line = info.lines().find(|l| l.starts_with(key))?;
            line[key.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()
        };
        match (kib("MemAvailable:"), kib("MemTotal:")) {
            (Some(avail), Some(total)) => {
                let reserve = (total / 10).max(2 << 20);
                avail.saturating_sub(reserve).saturating_mul(1024)
            }
            _ => usize::MAX,
        }
    })
}

/// `bytes` counted in `count` (the process's repacked bytes) while this lives.
struct Held {
    bytes: usize,
    count: &'static AtomicUsize,
}

impl Held {
    /// Counts `bytes` against the process's budget, or None past it.
    fn take(bytes: usize) -> Option<Held> {
        Held::take_in(&HELD, budget(), bytes)
    }

    fn take_in(count: &'static AtomicUsize, budget: usize, bytes: usize) -> Option<Held> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                h.checked_add(bytes).filter(|&n| n <= budget)
            })
            .ok()?;
        Some(Held { bytes, count })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.count.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A K-quant matrix in the layout above.
pub struct X16 {
    /// Anonymous memory asked for in huge pages where the OS gives them (`new`).
    data: memmap2::MmapMut,
    /// Its bytes, counted against the budget while the matrix lives.
    _held: Held,
    ty: GgmlType,
    lay: Lay,
    rows: usize,
    nb: usize,
    bs: usize,
    /// How a group's first pass asks for its weight lines ([`ahead_plan`] by default).
    ahead: AheadPlan,
}

impl X16 {
    /// Repacks `rows` GGUF rows of `nb` blocks each of Q4_K, Q5_K or Q6_K for this CPU's kernels,
    /// or None (another type, an empty matrix, a CPU without them, or no memory for the copy).
    pub fn new(ty: GgmlType, bytes: &[u8], rows: usize, nb: usize) -> Option<X16> {
        X16::with_rows(ty, bytes, rows, nb, rows_per_group()?)
    }

    /// As `new`, with `r` rows per group (16 or 8; tests and comparisons). The CPU must run that
    /// level's kernels for `gemm_into`.
    pub fn with_rows(ty: GgmlType, bytes: &[u8], rows: usize, nb: usize, r: usize) -> Option<X16> {
        assert!(r == 16 || r == 8, "X16: {r} rows per group");
        let lay = Lay { r };
        let bs = lay.block(ty)?;
        if rows == 0 || nb == 0 {
            return None;
        }
        let src_bs = ty.type_size();
        assert_eq!(
            bytes.len(),
            rows * nb * src_bs,
            "X16: {rows} rows of {nb} {ty} blocks"
        );
        let (groups, gb) = (rows.div_ceil(r), nb * bs);
        // Zeroed anonymous memory in huge pages where the OS gives them (Linux: transparent huge
        // pages on madvise): the kernel's zeroing happens in 2 MB faults of the parallel writes
        // below, and decode walks the matrices with 512 times fewer TLB entries. A Vec filled by
        // this thread took 40% of llama-1b's load time on 2 cores.
        // Without the memory, the matrix stays on the GGUF-layout paths: past the budget of
        // `Held` (the pages are only touched below, so a failed map is not the only way out).
        let held = Held::take(groups * gb)?;
        let mut data = memmap2::MmapMut::map_anon(groups * gb).ok()?;
        #[cfg(target_os = "linux")]
        let _ = data.advise(memmap2::Advice::HugePage);
        data.par_chunks_mut(gb).enumerate().for_each(|(g, out)| {
            for b in 0..nb {
                let o = &mut out[b * bs..(b + 1) * bs];
                for i in 0..r.min(rows - g * r) {
                    let at = ((g * r + i) * nb + b) * src_bs;
                    lay.put(ty, o, i, &bytes[at..at + src_bs]);
                }
            }
        });
        Some(X16 {
            data,
            _held: held,
            ty,
            lay,
            rows,
            nb,
            bs,
            ahead: ahead_plan(),
        })
    }

    /// Overrides [`ahead_plan`] for this matrix (tests and comparisons: the same bits whatever
    /// the plan, only the speed differs).
    pub fn set_ahead(&mut self, plan: AheadPlan) {
        self.ahead = plan;
    }

    /// Rows per group: task boundaries of a matmul must be multiples of it.
    pub fn group_rows(&self) -> usize {
        self.lay.r
    }

    /// out[t * ld + r - r0] = dot(row r, y[t]) for r in r0..r1 (r0 a multiple of
    /// `group_rows()`) and the `n` columns of `y` (n x nb Q8_K blocks).
    ///
    /// # Safety
    /// `out` must be valid for writes at t * ld + r - r0 for t < n, r0 <= r < r1, and not
    /// written by anyone else meanwhile.
    pub unsafe fn gemm_into(
        &self,
        y: &[BlockQ8K],
        n: usize,
        r0: usize,
        r1: usize,
        out: *mut f32,
        ld: usize,
    ) {
        let r = self.lay.r;
        let (fits, cb) = match r {
            16 => (super::tile::available(), pass_cols(n)),
            _ => (avx2::available(), 2),
        };
        assert!(
            fits,
            "X16::gemm_into: this CPU lacks the kernels of {r}-row groups"
        );
        assert!(
            r0.is_multiple_of(r) && r0 <= r1 && r1 <= self.rows && y.len() == n * self.nb,
            "X16::gemm_into: rows {r0}..{r1} of {}, {n} columns of {} blocks ({} given)",
            self.rows,
            self.nb,
            y.len()
        );
        let bytes: &[u8] = &self.data;
        let gb = self.nb * self.bs;
        // Each pass writes the sums of its c columns (all 16 or 8 lanes) before they are read.
        let mut sums: Sums = [[0f32; R_MAX]; C_MAX];
        for g in r0 / r..r1.div_ceil(r) {
            let w = &bytes[g * gb..(g + 1) * gb];
            let rows = (r1 - g * r).min(r);
            let base = g * r - r0;
            let mut c0 = 0;
            while c0 < n {
                let c = (n - c0).min(cb);
                let ys = &y[c0 * self.nb..(c0 + c) * self.nb];
                let pf = if c0 == 0 {
                    self.ahead.pass(self.ty, c)
                } else {
                    Ahead::None
                };
                // SAFETY: the CPU has the level's features (asserted); the slices have the
                // sizes the kernels read.
                if r == 16 {
                    avx512::group(self.ty, c, w, ys, self.nb, &mut sums, pf);
                } else {
                    avx2::group(self.ty, c, w, ys, self.nb, &mut sums, pf);
                }
                for (t, s) in sums.iter().enumerate().take(c) {
                    let o = out.add((c0 + t) * ld + base);
                    std::ptr::copy_nonoverlapping(s.as_ptr(), o, rows);
                }
                c0 += c;
            }
        }
    }
}

/// Repacking (`r` rows per group) and `gemm_into` over all rows as a [`super::tile::GemmFn`],
/// when this CPU runs that level (tests and comparisons).
pub fn gemm<W: bytemuck::Pod>(ty: GgmlType, r: usize) -> Option<super::tile::GemmFn<W>> {
    fn run<W: bytemuck::Pod, const T: u32, const R: usize>(
        w: &[W],
        rows: usize,
        y: &[BlockQ8K],
        n: usize,
        out: &mut [f32],
    ) {
        let ty = match T {
            4 => GgmlType::Q4_K,
            5 => GgmlType::Q5_K,
            _ => GgmlType::Q6_K,
        };
        let bytes: &[u8] = bytemuck::cast_slice(w);
        let nb = bytes.len() / ty.type_size() / rows.max(1);
        assert!(out.len() == rows * n, "x16 gemm: {rows} rows, {n} columns");
        let x = X16::with_rows(ty, bytes, rows, nb, R).expect("a K-quant type");
        // SAFETY: out holds n x rows outputs and is borrowed mutably here.
        unsafe { x.gemm_into(y, n, 0, rows, out.as_mut_ptr(), rows) }
    }
    let runs = match r {
        16 => super::tile::available(),
        8 => avx2::available(),
        _ => false,
    };
    let f: super::tile::GemmFn<W> = match (ty, r) {
        (GgmlType::Q4_K, 16) => run::<W, 4, 16>,
        (GgmlType::Q5_K, 16) => run::<W, 5, 16>,
        (GgmlType::Q6_K, 16) => run::<W, 6, 16>,
        (GgmlType::Q4_K, 8) => run::<W, 4, 8>,
        (GgmlType::Q5_K, 8) => run::<W, 5, 8>,
        (GgmlType::Q6_K, 8) => run::<W, 6, 8>,
        _ => return None,
    };
    runs.then_some(f)
}

const _: () = {
    let l = Lay { r: 16 };
    assert!(l.qs(false) + 32 * 64 == 2368 && l.qs(true) + 32 * 64 == 2880);
    assert!(l.q6(1, 7) + 192 == 3392 && muser_quant::QK_K == 256);
};

#[cfg(test)]
mod tests {
    use super::{Ahead, AheadPlan, Held};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn repacked_bytes_are_held_against_the_budget_and_given_back() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let a = Held::take_in(&COUNT, 1000, 600).expect("600 of 1000");
        assert!(Held::take_in(&COUNT, 1000, 401).is_none(), "1001 of 1000");
        let b = Held::take_in(&COUNT, 1000, 400).expect("1000 of 1000");
        assert_eq!(COUNT.load(Ordering::Relaxed), 1000);
        drop(a);
        assert_eq!(COUNT.load(Ordering::Relaxed), 400);
        let c = Held::take_in(&COUNT, 1000, 600).expect("600 given back");
        assert!(
            Held::take_in(&COUNT, usize::MAX, usize::MAX).is_none(),
            "overflow"
        );
        drop((b, c));
        assert_eq!(COUNT.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn ahead_plans_parse_and_pick_by_columns() {
        use muser_gguf::GgmlType::{Q4_K, Q5_K, Q6_K};
        let p = AheadPlan::parse("none,spread").unwrap();
        assert_eq!(
            p,
            AheadPlan {
                one: [Ahead::None; 3],
                many: Ahead::Spread
            }
        );
        assert_eq!(
            (p.pass(Q4_K, 1), p.pass(Q6_K, 2), p.pass(Q5_K, 4)),
            (Ahead::None, Ahead::Spread, Ahead::Spread)
        );
        assert_eq!(
            AheadPlan::parse(" block "),
            Some(AheadPlan::all(Ahead::Block))
        );
        let p = AheadPlan::parse("none/spread/block,none").unwrap();
        assert_eq!(
            [
                p.pass(Q4_K, 1),
                p.pass(Q5_K, 1),
                p.pass(Q6_K, 1),
                p.pass(Q5_K, 3)
            ],
            [Ahead::None, Ahead::Spread, Ahead::Block, Ahead::None]
        );
        for bad in [
            "",
            "on",
            "1",
            "block,",
            "none,spread,block",
            "Block",
            "none/spread,none",
            "none/spread/none",
        ] {
            assert_eq!(AheadPlan::parse(bad), None, "{bad:?}");
        }
    }
}
