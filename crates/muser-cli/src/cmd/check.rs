//! `muser check --backend cuda`: every op of the CUDA backend against the same op of the CPU
//! backend (the reference) on fresh random inputs, at the Muse Glimmer shapes and on both sides
//! of every routing boundary (1, 2, 8, 9, 16, 64 and 65 columns, 512), with SPEC section 5's NMSE
//! thresholds, including the decode-group row ops (RoPE, KV store and attention with a position
//! and a cache per row); then whole models (`--model`, e.g. synthesized muse-tiny and muse-mid):
//! logits of every prompt position, and a greedy continuation whose every step is compared
//! (first divergence shown with its logit margin). `--bench` times the matvecs at the Glimmer
//! shapes and whole-model decode. Prints a table, the dispatch audit (kernels never dispatched
//! flagged) and exits non-zero on any failure.
//!
//! Batch invariance, bit for bit on the GPU: each matmul column of a decode group against the
//! same column alone, each row op's row against the one-row op, and whole models
//! (`--invariance`, every `--model`, or a synthesized muse-tiny with `--quick`): 32 greedy
//! requests decoded alone, then in decode groups of 2, 8, 16, 24 and 32, every step's logits
//! compared.

use anyhow::Context;
use muser_cuda::backend::mma_attention_fits;
use muser_cuda::parity::{nmse, random_matrix, Rand, ELEMENTWISE_NMSE, LOGITS_NMSE, MATVEC_NMSE};
use muser_cuda::{CudaBackend, CudaBuf};
use muser_engine::backend::{Backend, Heads, KvLayerSpec, NormArgs};
use muser_engine::config::{RopeParams, RopeStyle};
use muser_engine::weights::TensorView;
use muser_engine::{CpuBackend, Model, RowGot, RowNeed, Session};
use muser_gguf::{GgmlType, GgufFile};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The backend to check (cuda).
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Small shapes only (a quick smoke test).
    #[arg(long)]
    quick: bool,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Whole-model parity on these GGUF files (repeatable).
    #[arg(long)]
    model: Vec<PathBuf>,
    /// Tokens of the greedy continuation compared per model.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Prompt length of the whole-model check.
    #[arg(long, default_value_t = 100)]
    prompt: usize,
    /// Skip the op-by-op parity (whole models only).
    #[arg(long)]
    no_ops: bool,
    /// Also time the matvecs at the Glimmer shapes and whole-model decode.
    #[arg(long)]
    bench: bool,
    /// Time prefill (pp512) and decode (tg) of these GGUF files on CUDA alone (repeatable).
    #[arg(long)]
    speed: Vec<PathBuf>,
    /// Context depth of an extra decode timing of the --speed models (0: none).
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Batch invariance on CUDA alone (no CPU run) for these GGUF files (repeatable); every
    /// --model is checked too, and with --quick and no model a synthesized muse-tiny.
    #[arg(long)]
    invariance: Vec<PathBuf>,
    /// Decode steps of each request in the invariance check.
    #[arg(long, default_value_t = 8)]
    invariance_steps: usize,
    /// Per-op time of a decode-group step of the --speed models at these group sizes
    /// (comma-separated, e.g. 8,32).
    #[arg(long, value_delimiter = ',')]
    group_profile: Vec<usize>,
}

/// One parity measurement.
struct Row {
    op: String,
    shape: String,
    nmse: f64,
    threshold: f64,
}

impl Row {
    fn pass(&self) -> bool {
        self.nmse.is_finite() && self.nmse <= self.threshold
    }

    /// The row as the report prints it: verdict, op, shape, NMSE and its threshold.
    fn line(&self) -> String {
        format!(
            "{:<5} {:<22} {:<34} nmse {:>10.3e} (<= {:.0e})",
            if self.pass() { "ok" } else { "FAIL" },
            self.op,
            self.shape,
            self.nmse,
            self.threshold
        )
    }
}

/// A bit-for-bit comparison: a row that passes (threshold 0, NMSE 0) when every value of `got`
/// has the bits of `want`, and fails (NMSE infinite) otherwise; printed with the count and the
/// largest difference.
fn exact_row(op: &str, shape: String, got: &[f32], want: &[f32]) -> (Row, String) {
    assert_eq!(got.len(), want.len(), "{op} {shape}: lengths differ");
    let miss = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let r = Row {
        op: op.to_string(),
        shape,
        nmse: if miss == 0 { 0.0 } else { f64::INFINITY },
        threshold: 0.0,
    };
    let line = if miss == 0 {
        format!(
            "{:<5} {:<22} {:<34} bit-identical ({} values)",
            "ok",
            r.op,
            r.shape,
            got.len()
        )
    } else {
        format!(
            "{:<5} {:<22} {:<34} {miss} of {} values differ, max |diff| {max:.3e}",
            "FAIL",
            r.op,
            r.shape,
            got.len()
        )
    };
    (r, line)
}

/// The two backends side by side.
struct Pair {
    cpu: CpuBackend,
    gpu: CudaBackend,
    rng: Rand,
    rows: Vec<Row>,
    /// The first error printing a row met (a closed pipe); `run` returns it after the ops.
    out_err: Option<std::io::Error>,
}

const HIDDEN: usize = 6656;
const Q_WIDTH: usize = 4096;
const KV_WIDTH: usize = 256;
const FFN: usize = 19968;
const VOCAB: usize = 202048;
const HEAD: usize = 128;

impl Pair {
    fn record(&mut self, op: &str, shape: String, got: &[f32], want: &[f32], threshold: f64) {
        let r = Row {
            op: op.to_string(),
            shape,
            nmse: nmse(got, want),
            threshold,
        };
        self.say(&r.line());
        self.rows.push(r);
    }

    fn exact(&mut self, op: &str, shape: String, got: &[f32], want: &[f32]) {
        let (r, line) = exact_row(op, shape, got, want);
        self.say(&line);
        self.rows.push(r);
    }

    /// Prints a row's line, keeping the first error (no more lines are tried after one).
    fn say(&mut self, line: &str) {
        if self.out_err.is_none() {
            if let Err(e) = outln!("{line}") {
                self.out_err = Some(e);
            }
        }
    }

    fn randn(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.rng.f32(-1.0, 1.0) * scale).collect()
    }

    /// The same host data in a CPU and a CUDA buffer.
    fn bufs(
        &mut self,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> (<CpuBackend as Backend>::Buf, CudaBuf) {
        let mut c = self.cpu.buf(rows, cols);
        self.cpu.write(&mut c, data);
        let mut g = self.gpu.buf(rows, cols);
        self.gpu.write(&mut g, data);
        (c, g)
    }

    fn random_bufs(
        &mut self,
        rows: usize,
        cols: usize,
    ) -> (<CpuBackend as Backend>::Buf, CudaBuf, Vec<f32>) {
        let data = self.randn(rows * cols, 1.0);
        let (c, g) = self.bufs(rows, cols, &data);
        (c, g, data)
    }

    fn read_cpu(&self, b: &<CpuBackend as Backend>::Buf) -> Vec<f32> {
        b.data.clone()
    }
    fn read_gpu(&self, b: &CudaBuf) -> Vec<f32> {
        let mut v = vec![0f32; b.rows * b.cols];
        self.gpu.read(b, &mut v);
        v
    }

    fn weights(
        &mut self,
        t: &TensorView,
    ) -> anyhow::Result<(<CpuBackend as Backend>::Weight, muser_cuda::CudaWeight)> {
        Ok((self.cpu.weight(t)?, self.gpu.weight(t)?))
    }

    fn matrix(
        &mut self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
    ) -> anyhow::Result<TensorView> {
        let seed = self.rng.u64();
        Ok(TensorView::owned(
            name,
            ty,
            &[cols as u64, rows as u64],
            random_matrix(ty, rows, cols, seed),
        )?)
    }

    fn vector(&mut self, name: &str, cols: usize) -> anyhow::Result<TensorView> {
        let v: Vec<f32> = (0..cols).map(|_| self.rng.f32(0.5, 1.5)).collect();
        Ok(TensorView::owned(
            name,
            GgmlType::F32,
            &[cols as u64],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )?)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.backend == "cuda",
        "muser check supports --backend cuda (got {:?})",
        args.backend
    );
    let gpu = CudaBackend::new(0)?;
    eprintln!(
        "checking {} ({}, {} SMs) against the CPU backend",
        gpu.gpu.name, gpu.gpu.arch, gpu.gpu.sms
    );
    let mut pair = Pair {
        cpu: CpuBackend::new(None)?,
        gpu,
        rng: Rand::new(args.seed),
        rows: Vec::new(),
        out_err: None,
    };
    let t0 = Instant::now();
    // The read-bandwidth probe (`muser bench`'s reference for % of bandwidth) runs too, so the
    // audit below covers every compiled kernel.
    eprintln!(
        "read bandwidth: {:.2} TB/s",
        pair.gpu.gpu.measure_read_bandwidth()? / 1e12
    );
    if !args.no_ops {
        check_ops(&mut pair, args.quick)?;
        if let Some(e) = pair.out_err.take() {
            return Err(e.into());
        }
        eprintln!("op parity: {:.1} s", t0.elapsed().as_secs_f64());
    }
    let mut audit: BTreeMap<String, u64> = pair.gpu.gpu.dispatch_counts().into_iter().collect();
    if args.bench {
        bench_matvec(&pair)?;
    }
    let mut models = Vec::new();
    for path in &args.model {
        let m = check_model(&mut pair.rows, path, &args, &mut audit)
            .with_context(|| format!("model {}", path.display()))?;
        models.push(m);
    }

    let mut inv_paths: Vec<PathBuf> = args.model.iter().chain(&args.invariance).cloned().collect();
    let tmp = std::env::temp_dir().join(format!("muser-check-{}", std::process::id()));
    if inv_paths.is_empty() && args.quick {
        std::fs::create_dir_all(&tmp)?;
        let path = tmp.join("muse-tiny.gguf");
        muser_synth::synthesize(muser_synth::find_preset("muse-tiny")?, &path, 0, false)?;
        inv_paths.push(path);
    }
    for path in &inv_paths {
        let m = check_invariance(&mut pair.rows, path, args.invariance_steps, &mut audit)
            .with_context(|| format!("batch invariance of {}", path.display()))?;
        models.push(m);
    }
    let _ = std::fs::remove_dir_all(&tmp);

    for path in &args.speed {
        let m = speed(path, args.depth, &args.group_profile, &mut audit)
            .with_context(|| format!("model {}", path.display()))?;
        models.push(m);
    }

    outln!("\ndispatch audit (kernel: launches in this run):")?;
    let mut never = 0;
    for (k, n) in &audit {
        if *n == 0 {
            never += 1;
        }
        outln!(
            "  {k:<18} {n:>9}{}",
            if *n == 0 {
                "   <- never dispatched"
            } else {
                ""
            }
        )?;
    }
    let failed: Vec<&Row> = pair.rows.iter().filter(|r| !r.pass()).collect();
    outln!("\nsummary")?;
    outln!("| checks | failed | worst op NMSE / threshold | kernels never dispatched |")?;
    // Exact checks (threshold 0) count as failed or passed, not in the worst ratio.
    let worst = pair
        .rows
        .iter()
        .filter(|r| r.threshold > 0.0)
        .map(|r| {
            if r.nmse.is_finite() {
                r.nmse / r.threshold
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0f64, f64::max);
    outln!(
        "| {} | {} | {:.3} | {} |",
        pair.rows.len(),
        failed.len(),
        worst,
        never
    )?;
    for m in &models {
        outln!("{m}")?;
    }
    for r in &failed {
        outln!(
            "FAILED: {} {} nmse {:.3e} > {:.0e}",
            r.op,
            r.shape,
            r.nmse,
            r.threshold
        )?;
    }
    anyhow::ensure!(
        failed.is_empty(),
        "{} of {} parity checks failed",
        failed.len(),
        pair.rows.len()
    );
    outln!("all {} parity checks passed", pair.rows.len())?;
    Ok(())
}

/// The read-backs a decode step ends with, bit for bit against what was written: the whole
/// buffer (`read`), one part per row (`read_parts`: a decode group's logits into its sequences)
/// and a subset of the rows (`read_rows`), below the page-locked staging (under 1 MB), inside one
/// staging window (32 rows of a 202k vocabulary, 26 MB) and across windows (128 rows, 103 MB,
/// past `STAGED_READ_MAX`); each into Vecs and into page-locked `host_buf`s (a session's logits
/// by default; `MUSER_CUDA_PINNED_LOGITS=0` for Vecs), which the reads fill straight by DMA.
fn check_reads(p: &mut Pair) -> anyhow::Result<()> {
    // Into Vecs (the staging routes), then into page-locked `host_buf`s (straight by DMA); the
    // switch restored either way.
    let on = p.gpu.pinned_logits();
    for pinned in [false, true] {
        p.gpu.set_pinned_logits(pinned);
        let r = check_reads_into(p, pinned);
        p.gpu.set_pinned_logits(on);
        r?;
    }
    Ok(())
}

/// `check_reads` into `HostBuf`s of one kind: Vecs, or (`pinned`) the backend's page-locked ones,
/// each of which must go straight there (and no read into a Vec may).
fn check_reads_into(p: &mut Pair, pinned: bool) -> anyhow::Result<()> {
    use muser_engine::backend::HostBuf;
    let before = p.gpu.pinned_reads();
    let mut reads = 0;
    let tag = if pinned { " (page-locked)" } else { "" };
    let alloc = |p: &Pair, n: usize| -> anyhow::Result<HostBuf> {
        if !pinned {
            return Ok(HostBuf::zeros(n));
        }
        let b = p.gpu.host_buf(n);
        anyhow::ensure!(
            b.is_backend_mem(),
            "no page-locked host memory of {n} values"
        );
        Ok(b)
    };
    for (rows, cols) in [(3usize, 1000usize), (32, VOCAB), (128, VOCAB)] {
        let host = p.randn(rows * cols, 8.0);
        let mut buf = p.gpu.buf(rows, cols);
        p.gpu.write(&mut buf, &host);
        let mut all = alloc(p, rows * cols)?;
        p.gpu.read(&buf, &mut all);
        p.exact(&format!("read{tag}"), format!("{rows}x{cols}"), &all, &host);
        let mut parts = (0..rows)
            .map(|_| alloc(p, cols))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut outs: Vec<&mut [f32]> = parts.iter_mut().map(|r| &mut r[..]).collect();
        p.gpu.read_parts(&buf, &mut outs);
        let got: Vec<f32> = parts.iter().flat_map(|r| r.iter().copied()).collect();
        p.exact(
            &format!("read_parts{tag}"),
            format!("{rows}x{cols}"),
            &got,
            &host,
        );
        reads += 2;
        // Every row but each third one (runs of two rows and, with the first, of three), and
        // every row but the first (one run from row 1: at 128 rows, across staging windows).
        let picks: [Vec<usize>; 2] = [
            (0..rows).filter(|r| r % 3 != 1 || *r == 1).collect(),
            (1..rows).collect(),
        ];
        for pick in picks {
            let mut rows_got = pick
                .iter()
                .map(|_| alloc(p, cols))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut outs: Vec<&mut [f32]> = rows_got.iter_mut().map(|r| &mut r[..]).collect();
            p.gpu.read_rows(&buf, rows, &pick, &mut outs);
            let want: Vec<f32> = pick
                .iter()
                .flat_map(|&r| host[r * cols..(r + 1) * cols].iter().copied())
                .collect();
            let got: Vec<f32> = rows_got.iter().flat_map(|r| r.iter().copied()).collect();
            let shape = format!("{} of {rows}x{cols}, from {}", pick.len(), pick[0]);
            p.exact(&format!("read_rows{tag}"), shape, &got, &want);
            reads += 1;
        }
    }
    let direct = p.gpu.pinned_reads() - before;
    let want = if pinned { reads } else { 0 };
    anyhow::ensure!(
        direct == want,
        "{direct} of {reads} reads{tag} went straight into page-locked memory, not {want}"
    );
    Ok(())
}

/// Every op of the Backend trait at the Muse Glimmer shapes and column counts.
fn check_ops(p: &mut Pair, quick: bool) -> anyhow::Result<()> {
    check_reads(p)?;
    check_mvk_splits(p)?;
    let columns: &[usize] = if quick {
        &[1, 9, 65]
    } else {
        &[1, 2, 4, 8, 9, 16, 64, 65, 512]
    };
    let (hidden, qw, kvw, ffn) = if quick {
        (512, 256, 128, 768)
    } else {
        (HIDDEN, Q_WIDTH, KV_WIDTH, FFN)
    };

    // Embedding rows of every format.
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ] {
        let vocab = 3000;
        let t = p.matrix("token_embd", ty, vocab, hidden)?;
        let (wc, wg) = p.weights(&t)?;
        let n = 9;
        let tokens: Vec<u32> = (0..n).map(|_| p.rng.below(vocab as u32)).collect();
        let (mut oc, mut og) = (p.cpu.buf(n, hidden), p.gpu.buf(n, hidden));
        p.cpu.embed(&wc, &tokens, &mut oc);
        p.gpu.embed(&wg, &tokens, &mut og);
        let (a, b) = (p.read_gpu(&og), p.read_cpu(&oc));
        p.record(
            "embed",
            format!("{ty} {n}x{hidden}"),
            &a,
            &b,
            ELEMENTWISE_NMSE,
        );
    }

    let norm_w = p.vector("norm", hidden)?;
    let (nwc, nwg) = p.weights(&norm_w)?;
    let post_w = p.vector("post", hidden)?;
    let (pwc, pwg) = p.weights(&post_w)?;
    let head_w = p.vector("q_norm", HEAD)?;
    let (hwc, hwg) = p.weights(&head_w)?;

    // Glimmer's matrices: (name, rows, cols, type).
    let mats: Vec<(&str, usize, usize, GgmlType)> = vec![
        ("attn_q", qw, hidden, GgmlType::Q4_K),
        ("attn_k", kvw, hidden, GgmlType::Q4_K),
        ("attn_v", kvw, hidden, GgmlType::Q6_K),
        ("attn_gate", qw, hidden, GgmlType::Q4_K),
        ("attn_output", hidden, qw, GgmlType::Q4_K),
        ("ffn_down", hidden, ffn, GgmlType::Q4_K),
        ("ffn_down_q6k", hidden, ffn, GgmlType::Q6_K),
    ];
    let mut w = BTreeMap::new();
    for &(name, rows, cols, ty) in &mats {
        let t = p.matrix(name, ty, rows, cols)?;
        w.insert(name, p.weights(&t)?);
    }
    let tg = p.matrix("ffn_gate", GgmlType::Q4_K, ffn, hidden)?;
    let (gc, gg) = p.weights(&tg)?;
    let tu = p.matrix("ffn_up", GgmlType::Q4_K, ffn, hidden)?;
    let (uc, ug) = p.weights(&tu)?;
    // A Q6_K gate+up (mmk_silu_* with the Q6_K tiles).
    let t6g = p.matrix("ffn_gate", GgmlType::Q6_K, 1024, hidden)?;
    let (g6c, g6g) = p.weights(&t6g)?;
    let t6u = p.matrix("ffn_up", GgmlType::Q6_K, 1024, hidden)?;
    let (u6c, u6g) = p.weights(&t6u)?;
    // A Q8_0 gate+up (matvec_silu_1 / matvec_silu_cols).
    let t8g = p.matrix("ffn_gate", GgmlType::Q8_0, 1024, hidden)?;
    let (g8c, g8g) = p.weights(&t8g)?;
    let t8u = p.matrix("ffn_up", GgmlType::Q8_0, 1024, hidden)?;
    let (u8c, u8g) = p.weights(&t8u)?;
    // The other formats at one shape, for the routing of each (Q8_0, F16, BF16, F32, Q5_K).
    let mut other = Vec::new();
    for ty in [
        GgmlType::Q5_K,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ] {
        let t = p.matrix("other", ty, 1024, hidden)?;
        other.push((ty, p.weights(&t)?));
    }

    // The ops at the Glimmer shapes: chunks under 64 columns on the decode steps' integer kernels
    // (the f16 prefill tiles' narrow configurations are checked below, with the groups), 64 and
    // more on the prefill route (the f16 tiles on sm_90).
    let mmh_ops = p.gpu.gpu.mmh();
    for &n in columns {
        p.gpu.gpu.set_mmh(mmh_ops && n >= 64);
        // Norms.
        let (xc, xg, _) = p.random_bufs(n, hidden);
        let (mut oc, mut og) = (p.cpu.buf(n, hidden), p.gpu.buf(n, hidden));
        p.cpu.rmsnorm(&xc, Some(&nwc), 1e-5, &mut oc);
        p.gpu.rmsnorm(&xg, Some(&nwg), 1e-5, &mut og);
        let (a, b) = (p.read_gpu(&og), p.read_cpu(&oc));
        p.record("rmsnorm", format!("{n}x{hidden}"), &a, &b, ELEMENTWISE_NMSE);
        p.cpu.rmsnorm(&xc, None, 1e-5, &mut oc);
        p.gpu.rmsnorm(&xg, None, 1e-5, &mut og);
        let (a, b) = (p.read_gpu(&og), p.read_cpu(&oc));
        p.record(
            "rmsnorm (entry, w=1)",
            format!("{n}x{hidden}"),
            &a,
            &b,
            ELEMENTWISE_NMSE,
        );

        // Residual tails, with and without the post-norm.
        for with_post in [true, false] {
            let (mut hc, mut hg, _) = p.random_bufs(n, hidden);
            let (bc, bg, _) = p.random_bufs(n, hidden);
            let post_c = with_post.then_some(NormArgs {
                weight: &pwc,
                eps: 1e-8,
            });
            let post_g = with_post.then_some(NormArgs {
                weight: &pwg,
                eps: 1e-8,
            });
            p.cpu.residual_norm(
                &mut hc,
                &bc,
                post_c,
                NormArgs {
                    weight: &nwc,
                    eps: 1e-5,
                },
                &mut oc,
            );
            p.gpu.residual_norm(
                &mut hg,
                &bg,
                post_g,
                NormArgs {
                    weight: &nwg,
                    eps: 1e-5,
                },
                &mut og,
            );
            fused_matmul_exact(
                p,
                &og,
                &format!("residual_norm -> matmul {n}x{hidden} (post: {with_post})"),
            );
            let op = if with_post {
                "residual_norm"
            } else {
                "residual_norm (no post)"
            };
            let (a, b) = (p.read_gpu(&hg), p.read_cpu(&hc));
            p.record(op, format!("h {n}x{hidden}"), &a, &b, ELEMENTWISE_NMSE);
            let (a, b) = (p.read_gpu(&og), p.read_cpu(&oc));
            p.record(op, format!("out {n}x{hidden}"), &a, &b, ELEMENTWISE_NMSE);
        }

        // Q/K/V/gate sharing one input (one launch), then the QK norms and RoPE.
        let (mut qc, mut qg) = (p.cpu.buf(n, qw), p.gpu.buf(n, qw));
        let (mut kc, mut kg) = (p.cpu.buf(n, kvw), p.gpu.buf(n, kvw));
        let (mut vc, mut vg) = (p.cpu.buf(n, kvw), p.gpu.buf(n, kvw));
        let (mut gtc, mut gtg) = (p.cpu.buf(n, qw), p.gpu.buf(n, qw));
        {
            let (q, k, v, g) = (&w["attn_q"], &w["attn_k"], &w["attn_v"], &w["attn_gate"]);
            p.cpu.matmul(
                &oc,
                &mut [
                    (&q.0, &mut qc),
                    (&k.0, &mut kc),
                    (&v.0, &mut vc),
                    (&g.0, &mut gtc),
                ],
            );
            p.gpu.matmul(
                &og,
                &mut [
                    (&q.1, &mut qg),
                    (&k.1, &mut kg),
                    (&v.1, &mut vg),
                    (&g.1, &mut gtg),
                ],
            );
        }
        for (name, c, g) in [
            ("attn_q", &qc, &qg),
            ("attn_k", &kc, &kg),
            ("attn_v Q6_K", &vc, &vg),
            ("attn_gate", &gtc, &gtg),
        ] {
            let (a, b) = (p.read_gpu(g), p.read_cpu(c));
            p.record(
                "matmul qkvg",
                format!("{name} {}x{hidden} x{n}", c.cols),
                &a,
                &b,
                MATVEC_NMSE,
            );
        }
        // Continue from identical inputs so each op is measured alone.
        let qdata = p.randn(n * qw, 1.0);
        let (mut qc, mut qg) = p.bufs(n, qw, &qdata);
        p.cpu.rmsnorm_heads(&mut qc, &hwc, HEAD, 1e-5);
        p.gpu.rmsnorm_heads(&mut qg, &hwg, HEAD, 1e-5);
        let (a, b) = (p.read_gpu(&qg), p.read_cpu(&qc));
        p.record(
            "rmsnorm_heads",
            format!("{n}x{qw} /{HEAD}"),
            &a,
            &b,
            ELEMENTWISE_NMSE,
        );
        for (style, base, pos0) in [
            (RopeStyle::Interleaved, 500000.0, 60000 - n.min(60000)),
            (RopeStyle::Neox, 10000.0, 37),
        ] {
            let rope = RopeParams {
                style,
                freq_base: base,
                n_rot: HEAD,
            };
            let (mut rc, mut rg, _) = p.random_bufs(n, qw);
            p.cpu.rope(&mut rc, HEAD, &rope, pos0);
            p.gpu.rope(&mut rg, HEAD, &rope, pos0);
            let (a, b) = (p.read_gpu(&rg), p.read_cpu(&rc));
            p.record(
                "rope",
                format!("{style:?} {n}x{qw} @{pos0}"),
                &a,
                &b,
                ELEMENTWISE_NMSE,
            );
        }

        // Attention over a ring (sliding window 4096) and a plane, at depth.
        for ring in [true, false] {
            let depth = if n >= 512 {
                700
            } else if ring {
                5000
            } else {
                8192
            };
            check_attention(
                p,
                n,
                kvw / HEAD,
                HEAD,
                qw / HEAD,
                ring.then_some(4096),
                depth,
            );
        }
        if n > 1 {
            // A prompt's first chunk (rows that see at most 512 positions run on the tensor-core
            // rows kernel, one block per row, where it fits), and with that kernel off.
            for mma in [true, false] {
                p.gpu.set_attn_mma(mma);
                check_attention(p, n, kvw / HEAD, HEAD, qw / HEAD, None, 0);
            }
            p.gpu.set_attn_mma(true);
        }
        if n == 1 || n == 9 {
            // Head width 256 (over 48 KB of shared memory) and 64.
            check_attention(p, n, 2, 256, 32, None, 3000);
            check_attention(p, n, 4, 64, 8, Some(1000), 1500);
        }

        // Decode-group row ops: a position and a KV cache per row.
        if n <= 65 {
            check_rope_rows(p, n, qw);
            // qkv_rows' register path against its memory path: Muse Glimmer's GPT-J pairs with
            // QK norms, Llama's without, NeoX (Qwen3), a NoPE layer and partial rotations.
            for (style, n_rot, norms) in [
                (RopeStyle::Interleaved, HEAD, true),
                (RopeStyle::Interleaved, HEAD, false),
                (RopeStyle::Neox, HEAD, true),
                (RopeStyle::Neox, 0, true),
                (RopeStyle::Interleaved, 96, true),
                (RopeStyle::Neox, 64, false),
            ] {
                check_qkv_rows_paths(p, n, kvw / HEAD, HEAD, qw / HEAD, style, n_rot, norms);
            }
            let window = if quick { 256 } else { 4096 };
            // 4200: the deepest row (17 splits of 256 positions at Glimmer's 2 KV heads) runs the
            // 8-warp tensor-core attention (`attn_wide`), its shallower neighbours 4 of its warps.
            let deepest = if quick || n > 16 { 4200 } else { 6000 };
            // The tensor-core decode attention (Glimmer's 16 heads of 128 per KV head) and the
            // f32 one.
            for mma in [true, false] {
                p.gpu.set_attn_mma(mma);
                for ring in [true, false] {
                    check_attention_rows(
                        p,
                        n,
                        kvw / HEAD,
                        HEAD,
                        qw / HEAD,
                        ring.then_some(window),
                        deepest,
                    );
                }
            }
            p.gpu.set_attn_mma(true);
            // Every row at most 8 splits deep (2,048 positions), so each row alone merges its
            // splits inside the attention launch (`attn_rows_mma_fin8_128`, which serves 16
            // query heads of 128 per KV head, as Glimmer's), against the group's
            // attn_rows_combine bit for bit.
            check_attention_rows(p, n, 2, HEAD, 32, None, 1500);
            if n == 1 || (n == 9 && !quick) {
                // Rows of up to 20,000 positions: past 12,288 (48 splits of 8 tiles at
                // Glimmer's 2 KV heads) a row's splits grow longer (`attn_max_splits`).
                check_attention_rows(p, n, 2, HEAD, 32, None, 20000);
            }
            if n == 9 {
                check_attention_rows(p, n, 2, 256, 32, None, 1500);
                check_attention_rows(p, n, 4, 64, 8, Some(300), 1000);
            }
        }

        // Output gate, o_proj, FFN.
        let (mut ac, mut ag, _) = p.random_bufs(n, qw);
        let (gc2, gg2, _) = p.random_bufs(n, qw);
        p.cpu.sigmoid_gate(&mut ac, &gc2);
        p.gpu.sigmoid_gate(&mut ag, &gg2);
        let (a, b) = (p.read_gpu(&ag), p.read_cpu(&ac));
        p.record(
            "sigmoid_gate",
            format!("{n}x{qw}"),
            &a,
            &b,
            ELEMENTWISE_NMSE,
        );
        let (mut oc2, mut og2) = (p.cpu.buf(n, hidden), p.gpu.buf(n, hidden));
        let wo = &w["attn_output"];
        p.cpu.matmul(&ac, &mut [(&wo.0, &mut oc2)]);
        p.gpu.matmul(&ag, &mut [(&wo.1, &mut og2)]);
        let (a, b) = (p.read_gpu(&og2), p.read_cpu(&oc2));
        p.record(
            "matmul",
            format!("attn_output {hidden}x{qw} x{n}"),
            &a,
            &b,
            MATVEC_NMSE,
        );

        let (xc, xg, _) = p.random_bufs(n, hidden);
        let (mut fc, mut fg) = (p.cpu.buf(n, ffn), p.gpu.buf(n, ffn));
        p.cpu.ffn_gate_up_silu(&xc, &gc, &uc, &mut fc);
        p.gpu.ffn_gate_up_silu(&xg, &gg, &ug, &mut fg);
        let (a, b) = (p.read_gpu(&fg), p.read_cpu(&fc));
        p.record(
            "ffn_gate_up_silu",
            format!("{ffn}x{hidden} x{n}"),
            &a,
            &b,
            MATVEC_NMSE,
        );
        let (fc, fg, _) = p.random_bufs(n, ffn);
        for name in ["ffn_down", "ffn_down_q6k"] {
            let wd = &w[name];
            p.cpu.matmul(&fc, &mut [(&wd.0, &mut oc2)]);
            p.gpu.matmul(&fg, &mut [(&wd.1, &mut og2)]);
            let (a, b) = (p.read_gpu(&og2), p.read_cpu(&oc2));
            p.record(
                "matmul",
                format!("{name} {hidden}x{ffn} x{n}"),
                &a,
                &b,
                MATVEC_NMSE,
            );
        }
        if n <= 65 {
            let (xc, xg, _) = p.random_bufs(n, hidden);
            for (ty, (wc, wg)) in &other {
                let (mut yc, mut yg) = (p.cpu.buf(n, 1024), p.gpu.buf(n, 1024));
                p.cpu.matmul(&xc, &mut [(wc, &mut yc)]);
                p.gpu.matmul(&xg, &mut [(wg, &mut yg)]);
                let (a, b) = (p.read_gpu(&yg), p.read_cpu(&yc));
                p.record(
                    "matmul",
                    format!("{ty} 1024x{hidden} x{n}"),
                    &a,
                    &b,
                    MATVEC_NMSE,
                );
            }
        }
    }
    p.gpu.gpu.set_mmh(mmh_ops);

    // Each column of a decode group, and of a prefill chunk (the K-quants run both on the
    // tensor-core tiles of mmk.cu, in the canonical order of matvec_1), gets the bits it gets
    // alone; the group's results also against the CPU.
    // (130 columns: three column tiles of the 64 x 64 prefill tiles, each column against itself
    // alone and moved; 200 (quick) and 512 keep the 128 x 128 tiles dispatched.)
    // (Widths 2 to 8 run on mmv_* (9 to 16 on mmv_* or mmw_2) and, checked against it, on
    // mmk_*; 3 and 4 are both sides of the mmk_* / mmv_* boundary when MUSER_CUDA_MMV_MIN=4
    // sets it.)
    let groups: &[usize] = if quick {
        &[2, 3, 4, 6, 9, 20, 32, 64, 130, 200]
    } else {
        &[2, 3, 4, 8, 9, 16, 20, 32, 33, 64, 130, 512]
    };
    {
        for &n in groups.iter().chain([1usize].iter()) {
            let (xc, xg, xdata) = p.random_bufs(n, hidden);
            let mut cases: Vec<(
                String,
                &<CpuBackend as Backend>::Weight,
                &muser_cuda::CudaWeight,
            )> = vec![
                (
                    format!("attn_q Q4_K {qw}x{hidden}"),
                    &w["attn_q"].0,
                    &w["attn_q"].1,
                ),
                (
                    format!("attn_v Q6_K {kvw}x{hidden}"),
                    &w["attn_v"].0,
                    &w["attn_v"].1,
                ),
            ];
            for (ty, (wc, wg)) in &other {
                cases.push((format!("{ty} 1024x{hidden}"), wc, wg));
            }
            // Past 16 columns the K-quants run on mmt.cu, unsplit and with K split over blocks
            // where the launch is narrow (mmt_split_4, on by default).
            // Prefill chunks (mmh_min columns or more: every width by default) of the K-quants
            // run on the f16 tiles (mmh.cu): against the CPU, each column against itself moved to
            // other places in the tiles and (every width on them) alone; the integer tiles at
            // those widths (decode groups) as before.
            // Groups of mmv_min to 16 columns run on mmv.cu's division of the work (`mmv_*`), and
            // on the `mmk_*` blocks when it is off: both.
            let split_default = p.gpu.gpu.mmt_split();
            let mmh_default = p.gpu.gpu.mmh();
            let mmv_default = p.gpu.gpu.mmv();
            let mmh_here =
                mmh_default && p.gpu.gpu.arch == "sm_90" && n >= muser_cuda::mmh::mmh_min();
            let mmk_here = mmv_default && (muser_cuda::matvec::mmv_min()..=16).contains(&n);
            // Groups of mmw_narrow_min to 16 columns run on mmw_2 where it takes the matrices:
            // mmv_* (and mmk_*) with it off too.
            let mmw_default = p.gpu.gpu.mmw();
            let mmv_here = mmk_here
                && mmw_default
                && p.gpu.gpu.arch == "sm_90"
                && n >= muser_cuda::matvec::mmw_narrow_min();
            let mut modes = vec![Tiles::Default];
            if n > 16 {
                modes.push(Tiles::Split);
            }
            if mmh_here {
                modes.push(Tiles::F16);
            }
            if mmk_here {
                modes.push(Tiles::Mmk);
            }
            if mmv_here {
                modes.push(Tiles::Mmv);
            }
            for (mode, (what, wc, wg)) in modes
                .iter()
                .flat_map(|&m| cases.iter().map(move |c| (m, c)))
            {
                let ty = wg.matrix.as_ref().map(|m| m.ty);
                let kq = matches!(ty, Some(GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K));
                if mode != Tiles::Default && !kq {
                    continue;
                }
                mode.set(p, false, mmv_default, mmw_default);
                let what = format!("{what}{}", mode.suffix());
                let mmh = mode == Tiles::F16;
                let (mut yc, mut yg) = (p.cpu.buf(n, wg.rows), p.gpu.buf(n, wg.rows));
                p.cpu.matmul(&xc, &mut [(wc, &mut yc)]);
                p.gpu.matmul(&xg, &mut [(wg, &mut yg)]);
                let group = p.read_gpu(&yg);
                let want = p.read_cpu(&yc);
                p.record(
                    "matmul group",
                    format!("{what} x{n}"),
                    &group,
                    &want,
                    MATVEC_NMSE,
                );
                if n == 1 {
                    continue;
                }
                if mmh {
                    let moved = moved_columns(p, &xdata, hidden, wg.rows, |p, x, y| {
                        p.gpu.matmul(x, &mut [(wg, y)])
                    });
                    p.exact("f16 col == moved", format!("{what} x{n}"), &group, &moved);
                    if muser_cuda::mmh::mmh_min() > 1 {
                        continue;
                    }
                    // Every width on the f16 tiles: each column also against itself alone (a
                    // one-column chunk, on another tile configuration than most widths).
                }
                let mut alone = Vec::with_capacity(group.len());
                for c in 0..n {
                    let (_, x1) = p.bufs(1, hidden, &xdata[c * hidden..(c + 1) * hidden]);
                    let mut y1 = p.gpu.buf(1, wg.rows);
                    p.gpu.matmul(&x1, &mut [(wg, &mut y1)]);
                    alone.extend(p.read_gpu(&y1));
                }
                p.exact(
                    "matmul col == alone",
                    format!("{what} x{n}"),
                    &group,
                    &alone,
                );
            }
            p.gpu.gpu.set_mmt_split(split_default);
            p.gpu.gpu.set_mmh(mmh_default);
            p.gpu.gpu.set_mmv(mmv_default);
            p.gpu.gpu.set_mmw(mmw_default);
            let mut silu_modes = vec![Tiles::Default];
            if mmh_here {
                silu_modes.push(Tiles::F16);
            }
            if mmk_here {
                silu_modes.push(Tiles::Mmk);
            }
            if mmv_here {
                silu_modes.push(Tiles::Mmv);
            }
            for (mode, (what, rows, (gcw, ggw), (ucw, ugw))) in silu_modes.iter().flat_map(|&m| {
                [
                    (format!("Q4_K {ffn}x{hidden}"), ffn, (&gc, &gg), (&uc, &ug)),
                    (
                        format!("Q6_K 1024x{hidden}"),
                        1024,
                        (&g6c, &g6g),
                        (&u6c, &u6g),
                    ),
                    (
                        format!("Q8_0 1024x{hidden}"),
                        1024,
                        (&g8c, &g8g),
                        (&u8c, &u8g),
                    ),
                ]
                .into_iter()
                .map(move |c| (m, c))
            }) {
                if mode != Tiles::Default && what.starts_with("Q8_0") {
                    continue;
                }
                mode.set(p, split_default, mmv_default, mmw_default);
                let what = format!("{what}{}", mode.suffix());
                let mmh = mode == Tiles::F16;
                let (mut fc, mut fg) = (p.cpu.buf(n, rows), p.gpu.buf(n, rows));
                p.cpu.ffn_gate_up_silu(&xc, gcw, ucw, &mut fc);
                p.gpu.ffn_gate_up_silu(&xg, ggw, ugw, &mut fg);
                let group = p.read_gpu(&fg);
                let want = p.read_cpu(&fc);
                p.record(
                    "gate_up_silu group",
                    format!("{what} x{n}"),
                    &group,
                    &want,
                    MATVEC_NMSE,
                );
                if n == 1 {
                    continue;
                }
                if mmh {
                    let moved = moved_columns(p, &xdata, hidden, rows, |p, x, y| {
                        p.gpu.ffn_gate_up_silu(x, ggw, ugw, y)
                    });
                    p.exact(
                        "f16 silu col == moved",
                        format!("{what} x{n}"),
                        &group,
                        &moved,
                    );
                    if muser_cuda::mmh::mmh_min() > 1 {
                        continue;
                    }
                }
                let mut alone = Vec::with_capacity(group.len());
                for c in 0..n {
                    let (_, x1) = p.bufs(1, hidden, &xdata[c * hidden..(c + 1) * hidden]);
                    let mut f1 = p.gpu.buf(1, rows);
                    p.gpu.ffn_gate_up_silu(&x1, ggw, ugw, &mut f1);
                    alone.extend(p.read_gpu(&f1));
                }
                p.exact("silu col == alone", format!("{what} x{n}"), &group, &alone);
            }
            p.gpu.gpu.set_mmh(mmh_default);
            p.gpu.gpu.set_mmv(mmv_default);
            p.gpu.gpu.set_mmw(mmw_default);
        }
    }

    // K split over blocks at a width of several chunks, in the quick check too: 40 columns on
    // 24-column tiles (mmt_split_3), 32 on 32-column tiles (mmt_split_4); 72, a decode group
    // wider than 64, on three 24-column mmw_* tiles against two 64-column mmt_8 ones (mmw off).
    check_split(p, 40, 4096)?;
    check_split(p, 32, 4096)?;
    // 16 columns: one 16-column mmw_2 tile against mmv_2 (mmw off).
    check_split(p, 16, 4096)?;
    check_split(p, 72, 4096)?;

    // LM head (+ scale + softcap) at the full vocabulary, and GPU argmax of its logits.
    let vocab = if quick { 4096 } else { VOCAB };
    let t = p.matrix("output", GgmlType::Q5_K, vocab, hidden)?;
    let (lc, lg) = p.weights(&t)?;
    for (n, first) in [(1usize, 0usize), (2, 0), (9, 7)] {
        let (xc, xg, _) = p.random_bufs(n, hidden);
        let (mut oc, mut og) = (p.cpu.buf(n - first, vocab), p.gpu.buf(n - first, vocab));
        p.cpu
            .lm_head(&xc, first, &lc, 0.196_116_14, Some(20.0), &mut oc);
        p.gpu
            .lm_head(&xg, first, &lg, 0.196_116_14, Some(20.0), &mut og);
        let (a, b) = (p.read_gpu(&og), p.read_cpu(&oc));
        p.record(
            "lm_head+softcap",
            format!("Q5_K {vocab}x{hidden} rows {first}..{n}"),
            &a,
            &b,
            MATVEC_NMSE,
        );
        // argmax: the GPU's index against the host's over the same GPU logits.
        check_argmax(
            p,
            "argmax",
            format!("{} rows of {vocab}", n - first),
            &og,
            &a,
        );
    }
    check_lm_chunks(p, &lg, hidden, quick)
}

/// The GPU argmax of each row of `logits` against the host's over `host` (the logits it should
/// hold), recorded as NMSE of (1 + mismatches) against 1: zero exactly when every index agrees.
fn check_argmax(p: &mut Pair, op: &str, shape: String, logits: &CudaBuf, host: &[f32]) {
    let mut idx = vec![0u32; logits.rows];
    p.gpu.argmax(logits, logits.cols, &mut idx);
    let want: Vec<u32> = host.chunks(logits.cols).map(|r| argmax(r) as u32).collect();
    let miss = idx.iter().zip(&want).filter(|(x, y)| x != y).count();
    p.record(op, shape, &[1.0 + miss as f32], &[1.0], 0.0);
}

/// The LM head in row chunks (lab run 89, `MUSER_CUDA_LM_CHUNKS`) bit for bit against its single
/// launch, at 1, 8 and 32 columns in 2 (the measured best), 3 and 4 chunks: the logits read back
/// chunk by chunk into page-locked rows (each read must take that route), and the GPU argmax of
/// the chunked logits against the host's over the single launch's. With the logits announced as
/// not read (`will_read_logits(false)`), the head must run as one launch (no chunked read).
fn check_lm_chunks(
    p: &mut Pair,
    w: &muser_cuda::CudaWeight,
    hidden: usize,
    quick: bool,
) -> anyhow::Result<()> {
    use muser_engine::backend::HostBuf;
    let (k0, min0, pinned0) = (
        p.gpu.lm_chunks(),
        p.gpu.lm_chunk_min(),
        p.gpu.pinned_logits(),
    );
    // Page-locked rows whatever `MUSER_CUDA_PINNED_LOGITS` says: the chunked read is theirs.
    p.gpu.set_pinned_logits(true);
    let vocab = w.rows;
    let widths: &[usize] = if quick { &[1, 8] } else { &[1, 8, 32] };
    let mut run = || -> anyhow::Result<()> {
        for &n in widths {
            let (_, xg, _) = p.random_bufs(n, hidden);
            p.gpu.set_lm_chunks(1, 1);
            let mut one = p.gpu.buf(n, vocab);
            p.gpu.lm_head(&xg, 0, w, 0.196_116_14, Some(20.0), &mut one);
            let want = p.read_gpu(&one);
            // (chunks set, logits announced as read): the last, reduced on the GPU, runs one launch.
            for (k, read) in [(2, true), (3, true), (4, true), (2, false)] {
                p.gpu.will_read_logits(read);
                p.gpu.set_lm_chunks(k, 1);
                let mut og = p.gpu.buf(n, vocab);
                p.gpu.lm_head(&xg, 0, w, 0.196_116_14, Some(20.0), &mut og);
                let mut rows: Vec<HostBuf> = (0..n).map(|_| p.gpu.host_buf(vocab)).collect();
                anyhow::ensure!(
                    rows.iter().all(|r| r.is_backend_mem()),
                    "no page-locked host memory of {vocab} values"
                );
                let before = p.gpu.lm_reads();
                let mut outs: Vec<&mut [f32]> = rows.iter_mut().map(|r| &mut r[..]).collect();
                p.gpu.read_parts(&og, &mut outs);
                anyhow::ensure!(
                    p.gpu.lm_reads() == before + u64::from(read),
                    "{k} chunks, logits read {read}: {} chunked reads, not {}",
                    p.gpu.lm_reads() - before,
                    u64::from(read)
                );
                let got: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
                let shape = if read {
                    format!("{n} x {vocab}, {k} chunks")
                } else {
                    format!("{n} x {vocab}, logits not read: one launch")
                };
                p.exact("lm_head chunks == one", shape.clone(), &got, &want);
                check_argmax(p, "argmax (chunks)", shape, &og, &want);
            }
        }
        Ok(())
    };
    let r = run();
    p.gpu.set_lm_chunks(k0, min0);
    p.gpu.set_pinned_logits(pinned0);
    p.gpu.will_read_logits(true);
    r
}

/// Which tiles a K-quant group check runs on: the default route, K split over blocks (mmt.cu),
/// the f16 prefill tiles (mmh.cu), the `mmk_*` blocks instead of `mmv_*` / `mmw_2` (6-16
/// columns), or `mmv_*` instead of `mmw_2` (`mmw_narrow_min` to 16 columns).
#[derive(Clone, Copy, PartialEq)]
enum Tiles {
    Default,
    Split,
    F16,
    Mmk,
    Mmv,
}

impl Tiles {
    /// Sets the switches: K split when `Split`, else `split` (the group matmuls compare the
    /// unsplit launch against the split one; gate+up keeps the default).
    fn set(self, p: &Pair, split: bool, mmv_default: bool, mmw_default: bool) {
        p.gpu.gpu.set_mmt_split(self == Tiles::Split || split);
        p.gpu.gpu.set_mmh(self == Tiles::F16);
        p.gpu.gpu.set_mmv(mmv_default && self != Tiles::Mmk);
        p.gpu
            .gpu
            .set_mmw(mmw_default && !matches!(self, Tiles::Mmk | Tiles::Mmv));
    }

    fn suffix(self) -> &'static str {
        match self {
            Tiles::Default => "",
            Tiles::Split => " split",
            Tiles::F16 => " f16",
            Tiles::Mmk => " mmk",
            Tiles::Mmv => " mmv",
        }
    }
}

/// `n` columns of K-quant matrices of width `k` on mmt.cu (16: `mmw_2`, against `mmv_2` for mmt) with K split over blocks against the
/// same launch unsplit (bit for bit: the split kernel adds the chunks in the same order) and
/// against the CPU.
fn check_split(p: &mut Pair, n: usize, k: usize) -> anyhow::Result<()> {
    let (xc, xg, _) = p.random_bufs(n, k);
    let split_default = p.gpu.gpu.mmt_split();
    // The integer tiles (a prefill chunk of n columns would take the f16 ones).
    let mmh_default = p.gpu.gpu.mmh();
    p.gpu.gpu.set_mmh(false);
    for (ty, rows) in [
        (GgmlType::Q4_K, 320usize),
        (GgmlType::Q5_K, 128),
        (GgmlType::Q6_K, 256),
    ] {
        let t = p.matrix("split", ty, rows, k)?;
        let (wc, wg) = p.weights(&t)?;
        let mut outs = Vec::new();
        for split in [false, true] {
            p.gpu.gpu.set_mmt_split(split);
            let mut yg = p.gpu.buf(n, rows);
            p.gpu.matmul(&xg, &mut [(&wg, &mut yg)]);
            outs.push(p.read_gpu(&yg));
        }
        // Where the GPU has mmw_* (bulk-copied stages), groups run there: the split launch on
        // mmt_* must give the same bits.
        let against_mmt = p.gpu.gpu.mmw();
        if against_mmt {
            // The activation laid out by mmw_pack rather than by its quantizer.
            let prepack = p.gpu.gpu.mmw_prepack_on();
            p.gpu.gpu.set_mmw_prepack(false);
            p.gpu.gpu.set_mmt_split(false);
            let mut yg = p.gpu.buf(n, rows);
            p.gpu.matmul(&xg, &mut [(&wg, &mut yg)]);
            outs.push(p.read_gpu(&yg));
            p.gpu.gpu.set_mmw_prepack(prepack);
            p.gpu.gpu.set_mmw(false);
            for split in [false, true] {
                p.gpu.gpu.set_mmt_split(split);
                let mut yg = p.gpu.buf(n, rows);
                p.gpu.matmul(&xg, &mut [(&wg, &mut yg)]);
                outs.push(p.read_gpu(&yg));
            }
            p.gpu.gpu.set_mmw(true);
        }
        p.gpu.gpu.set_mmt_split(split_default);
        let mut yc = p.cpu.buf(n, rows);
        p.cpu.matmul(&xc, &mut [(&wc, &mut yc)]);
        let want = p.read_cpu(&yc);
        let shape = format!("{ty} {rows}x{k} x{n}");
        p.record("matmul split", shape.clone(), &outs[1], &want, MATVEC_NMSE);
        p.exact("split == unsplit", shape.clone(), &outs[1], &outs[0]);
        if against_mmt {
            p.exact("mmw packed == prepacked", shape.clone(), &outs[2], &outs[0]);
            p.exact("mmw == mmt", shape.clone(), &outs[0], &outs[3]);
            p.exact("mmw split == mmt", shape, &outs[1], &outs[4]);
        }
    }
    // The fused gate+up+SiLU on mmw_silu_* against mmt_silu_*.
    if p.gpu.gpu.mmw() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K] {
            let rows = 192;
            let (g, u) = (p.matrix("gate", ty, rows, k)?, p.matrix("up", ty, rows, k)?);
            let ((_, gg), (_, ug)) = (p.weights(&g)?, p.weights(&u)?);
            let mut outs = Vec::new();
            let pairs = p.gpu.gpu.mmw_pairs();
            // mmw_silu_* with gate and up in one block and in blocks of their own, then mmt.
            for (on, pair) in [(true, false), (true, true), (false, false)] {
                p.gpu.gpu.set_mmw(on);
                p.gpu.gpu.set_mmw_pairs(pair);
                let mut yg = p.gpu.buf(n, rows);
                p.gpu.ffn_gate_up_silu(&xg, &gg, &ug, &mut yg);
                outs.push(p.read_gpu(&yg));
            }
            p.gpu.gpu.set_mmw(true);
            p.gpu.gpu.set_mmw_pairs(pairs);
            let shape = format!("{ty} {rows}x{k} x{n}");
            p.exact("mmw silu == mmt", shape.clone(), &outs[0], &outs[2]);
            p.exact("mmw silu pairs == mmt", shape, &outs[1], &outs[2]);
        }
    }
    p.gpu.gpu.set_mmh(mmh_default);
    Ok(())
}

/// `x` was just written by an op that may hand its Q8_K quantization to the next matmul (fused):
/// a Q4_K matmul over x right after it, then the same matmul again (which quantizes x itself),
/// must give the same bits.
/// The one-column kernels that split a launch another way than `mvk_1` (the same bits by
/// design), each on a shape that takes it on this GPU, K = 2048: against the CPU, and bit for bit
/// against the same launch on `mvk_1`. `mvk_1_whole`: a q+k+v+gate whose q and gate hold 8 row
/// quads per SM each (W < Q < 2 W for W = 16 warps per SM); `mvk_1_spread`: one matrix of 13 row
/// quads per SM (3 W / 4 <= Q <= W).
fn check_mvk_splits(p: &mut Pair) -> anyhow::Result<()> {
    use muser_cuda::matvec::{mvk_blocks, mvk_chunks, mvk_spread_fits, mvk_whole_fits};
    let (k, sms) = (2048, p.gpu.gpu.sms);
    let qw = 32 * sms;
    let starts = [0, qw, qw + 256, qw + 512, 2 * qw + 512];
    let ww = 4 * mvk_blocks(starts[4] / 4, mvk_chunks(k), sms) as usize;
    anyhow::ensure!(
        mvk_whole_fits(&starts, mvk_chunks(k), ww) && mvk_spread_fits(1, 13 * sms, sms),
        "the split checks' shapes do not fit their kernels on {sms} SMs"
    );
    let qkvg = [
        ("attn_q", qw, GgmlType::Q4_K),
        ("attn_k", 256, GgmlType::Q4_K),
        ("attn_v", 256, GgmlType::Q6_K),
        ("attn_gate", qw, GgmlType::Q4_K),
    ];
    let one = [("attn_output", 52 * sms, GgmlType::Q6_K)];
    type Shapes<'a> = &'a [(&'a str, usize, GgmlType)];
    type Switch = fn(&muser_cuda::device::Gpu, bool);
    let cases: [(&str, Shapes, Switch); 2] = [
        ("mvk_1_whole", &qkvg, |g, on| g.set_mvk_whole(on)),
        ("mvk_1_spread", &one, |g, on| g.set_mvk_spread(on)),
    ];
    let (whole, spread) = (p.gpu.gpu.mvk_whole(), p.gpu.gpu.mvk_spread());
    for (kernel, shapes, switch) in cases {
        let mut ws = Vec::new();
        for &(name, rows, ty) in shapes {
            let t = p.matrix(name, ty, rows, k)?;
            ws.push(p.weights(&t)?);
        }
        let (xc, xg, _) = p.random_bufs(1, k);
        let mut cpu: Vec<_> = shapes.iter().map(|s| p.cpu.buf(1, s.1)).collect();
        let mut gpu: [Vec<CudaBuf>; 2] =
            [0, 1].map(|_| shapes.iter().map(|s| p.gpu.buf(1, s.1)).collect());
        {
            let mut jobs: Vec<_> = ws.iter().map(|w| &w.0).zip(cpu.iter_mut()).collect();
            p.cpu.matmul(&xc, &mut jobs);
        }
        // On the decode steps' route (a one-column prefill piece runs on the f16 tiles), each
        // side checked to have run on its kernel.
        let launches = |p: &Pair| {
            let counts = p.gpu.gpu.dispatch_counts();
            let n = |k: &str| counts.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
            [n(kernel), n("mvk_1")]
        };
        p.gpu.gpu.set_decoding(true);
        let mut ran = [false; 2];
        for ((on, out), ran) in [true, false].into_iter().zip(gpu.iter_mut()).zip(&mut ran) {
            p.gpu.gpu.set_mvk_whole(false);
            p.gpu.gpu.set_mvk_spread(false);
            switch(&p.gpu.gpu, on);
            let before = launches(p);
            let mut jobs: Vec<_> = ws.iter().map(|w| &w.1).zip(out.iter_mut()).collect();
            p.gpu.matmul(&xg, &mut jobs);
            let side = usize::from(!on);
            *ran = launches(p)[side] == before[side] + 1;
        }
        p.gpu.gpu.set_decoding(false);
        p.gpu.gpu.set_mvk_whole(whole);
        p.gpu.gpu.set_mvk_spread(spread);
        for (side, ran) in ran.into_iter().enumerate() {
            let name = [kernel, "mvk_1"][side];
            anyhow::ensure!(ran, "the split check's launch did not run on {name}");
        }
        for (i, &(name, rows, ty)) in shapes.iter().enumerate() {
            let (a, b) = (p.read_gpu(&gpu[0][i]), p.read_cpu(&cpu[i]));
            let shape = format!("{name} {ty} {rows}x{k} x1");
            p.record(
                &format!("matmul ({kernel})"),
                shape.clone(),
                &a,
                &b,
                MATVEC_NMSE,
            );
            let c = p.read_gpu(&gpu[1][i]);
            p.exact(&format!("{kernel} == mvk_1"), shape, &a, &c);
        }
    }
    Ok(())
}

fn fused_matmul_exact(p: &mut Pair, x: &CudaBuf, what: &str) {
    let t = p
        .matrix("fused", GgmlType::Q4_K, 256, x.cols)
        .expect("a random Q4_K matrix");
    let (_, wg) = p.weights(&t).expect("its upload");
    let (mut fused, mut plain) = (p.gpu.buf(x.rows, 256), p.gpu.buf(x.rows, 256));
    p.gpu.matmul(x, &mut [(&wg, &mut fused)]);
    p.gpu.matmul(x, &mut [(&wg, &mut plain)]);
    let (f, u) = (p.read_gpu(&fused), p.read_gpu(&plain));
    p.exact("fused quantization", what.to_string(), &f, &u);
}

/// kv_store of depth + n random positions, then attention of n query rows at pos0 = depth.
fn check_attention(
    p: &mut Pair,
    n: usize,
    n_kv: usize,
    head: usize,
    n_head: usize,
    window: Option<usize>,
    depth: usize,
) {
    let (kvw, qw) = (n_kv * head, n_head * head);
    let spec = KvLayerSpec {
        n_head,
        n_head_kv: n_kv,
        head_dim: head,
        window,
        slots: window.map_or(depth + n, |w| w + 511),
    };
    let mut kvc = p.cpu.kv_cache(&[spec]).expect("CPU KV cache");
    let mut kvg = p.gpu.kv_cache(&[spec]).expect("GPU KV cache");
    let mut pos = 0;
    while pos < depth + n {
        let m = (depth + n - pos).min(512);
        let kd = p.randn(m * kvw, 1.0);
        let vd = p.randn(m * kvw, 1.0);
        let (kc, kg) = p.bufs(m, kvw, &kd);
        let (vc, vg) = p.bufs(m, kvw, &vd);
        p.cpu.kv_store(&mut kvc, 0, &kc, &vc, pos);
        p.gpu.kv_store(&mut kvg, 0, &kg, &vg, pos);
        pos += m;
    }
    let qd = p.randn(n * qw, 1.0);
    let (qc, qg) = p.bufs(n, qw, &qd);
    let (mut ac, mut ag) = (p.cpu.buf(n, qw), p.gpu.buf(n, qw));
    let scale = 1.0 / (head as f32).sqrt();
    p.cpu.attention(&qc, &kvc, 0, depth, scale, &mut ac);
    p.gpu.attention(&qg, &kvg, 0, depth, scale, &mut ag);
    fused_matmul_exact(
        p,
        &ag,
        &format!("attention -> attn_output {n}x{qw} @{depth}"),
    );
    let (a, b) = (p.read_gpu(&ag), p.read_cpu(&ac));
    let what = window.map_or("plane".to_string(), |w| format!("ring {w}"));
    let off = if p.gpu.attn_mma() { "" } else { " mma off" };
    let shape = format!("{what} {n_head}/{n_kv}x{head}{off} {n} rows @{depth}");
    p.record("kv_store+attention", shape.clone(), &a, &b, MATVEC_NMSE);
    // A row's bits are its own position's, whatever chunk it comes in: the first, a middle and
    // the last row each as a chunk of one.
    if n > 1 {
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for t in [0, n / 2, n - 1] {
            let (_, q1) = p.bufs(1, qw, &qd[t * qw..(t + 1) * qw]);
            let mut o1 = p.gpu.buf(1, qw);
            p.gpu.attention(&q1, &kvg, 0, depth + t, scale, &mut o1);
            got.extend(p.read_gpu(&o1));
            want.extend_from_slice(&a[t * qw..(t + 1) * qw]);
        }
        p.exact("attention row == alone", shape, &want, &got);
    }
}

/// rope_rows (a position per row) against the CPU's, and each row against the one-row GPU rope.
fn check_rope_rows(p: &mut Pair, n: usize, qw: usize) {
    for (style, base) in [
        (RopeStyle::Interleaved, 500000.0),
        (RopeStyle::Neox, 10000.0),
    ] {
        let rope = RopeParams {
            style,
            freq_base: base,
            n_rot: HEAD,
        };
        let pos: Vec<usize> = (0..n).map(|_| p.rng.below(65536) as usize).collect();
        let (mut rc, mut rg, data) = p.random_bufs(n, qw);
        p.cpu.rope_rows(&mut rc, qw, HEAD, &rope, &pos);
        p.gpu.rope_rows(&mut rg, qw, HEAD, &rope, &pos);
        let (a, b) = (p.read_gpu(&rg), p.read_cpu(&rc));
        p.record(
            "rope_rows",
            format!("{style:?} {n}x{qw}"),
            &a,
            &b,
            ELEMENTWISE_NMSE,
        );
        let mut alone = Vec::with_capacity(a.len());
        for (t, &pt) in pos.iter().enumerate() {
            let (_, mut r1) = p.bufs(1, qw, &data[t * qw..(t + 1) * qw]);
            p.gpu.rope(&mut r1, HEAD, &rope, pt);
            alone.extend(p.read_gpu(&r1));
        }
        p.exact(
            "rope_rows row == alone",
            format!("{style:?} {n}x{qw}"),
            &a,
            &alone,
        );
    }
}

/// qkv_rows' register path against its memory path (`set_qkv_regs(false)`), bit for bit: the q
/// and k each leaves in place and the K and V it stores, for a decode group of n rows at random
/// positions of caches of 300 slots (planes) on the same random inputs.
#[allow(clippy::too_many_arguments)]
fn check_qkv_rows_paths(
    p: &mut Pair,
    n: usize,
    n_kv: usize,
    head: usize,
    n_head: usize,
    style: RopeStyle,
    n_rot: usize,
    norms: bool,
) {
    let (kvw, qw) = (n_kv * head, n_head * head);
    let pos: Vec<usize> = (0..n).map(|_| p.rng.below(300) as usize).collect();
    let spec = KvLayerSpec {
        n_head,
        n_head_kv: n_kv,
        head_dim: head,
        window: None,
        slots: 300,
    };
    let (qdata, kdata, vdata) = (
        p.randn(n * qw, 1.0),
        p.randn(n * kvw, 1.0),
        p.randn(n * kvw, 1.0),
    );
    let (qn, kn) = (
        p.vector("q_norm", head).unwrap(),
        p.vector("k_norm", head).unwrap(),
    );
    let (qng, kng) = (p.gpu.weight(&qn).unwrap(), p.gpu.weight(&kn).unwrap());
    let rope = RopeParams {
        style,
        freq_base: 500000.0,
        n_rot,
    };
    let heads = Heads {
        n_head,
        n_head_kv: n_kv,
        head_dim: head,
    };
    // The setting the command started with (`MUSER_CUDA_QKV_REGS`), restored after.
    let was = p.gpu.qkv_regs();
    let mut run = |regs: bool| {
        p.gpu.set_qkv_regs(regs);
        let (_, mut qg) = p.bufs(n, qw, &qdata);
        let (_, mut kg) = p.bufs(n, kvw, &kdata);
        let (_, vg) = p.bufs(n, kvw, &vdata);
        let mut caches: Vec<_> = (0..n)
            .map(|_| p.gpu.kv_cache(&[spec]).expect("GPU KV cache"))
            .collect();
        let mut rg: Vec<&mut _> = caches.iter_mut().collect();
        p.gpu.qkv_rows(
            &mut qg,
            &mut kg,
            &vg,
            norms.then_some((&qng, &kng, 1e-6)),
            heads,
            (n_rot > 0).then_some(&rope),
            &mut rg,
            0,
            &pos,
        );
        let mut out = p.read_gpu(&qg);
        out.extend(p.read_gpu(&kg));
        for c in &caches {
            for plane in [&c.layers[0].k, &c.layers[0].v] {
                let bits = p.gpu.gpu.stream.clone_dtoh(plane).expect("KV read");
                out.extend(bits.iter().map(|&b| f32::from(b)));
            }
        }
        out
    };
    let (regs, mem) = (run(true), run(false));
    p.gpu.set_qkv_regs(was);
    p.exact(
        "qkv_rows regs == memory",
        format!("{style:?} rot {n_rot} norms {norms} {n_head}/{n_kv}x{head} {n} rows"),
        &regs,
        &mem,
    );
}

/// A decode group of n sequences, each with its own cache (its own slot count) filled with
/// random K/V up to its own depth (0 .. deepest): the fused prologue qkv_rows (QK norm, RoPE,
/// KV store of each row's next K/V), then attention_rows with the output gate, against the CPU's
/// (whose qkv_rows runs rmsnorm_heads, rope_rows and kv_store_rows); then each row against the
/// one-row GPU attention and sigmoid_gate over the same cache (bit for bit: a row is split over
/// its positions as it is alone).
fn check_attention_rows(
    p: &mut Pair,
    n: usize,
    n_kv: usize,
    head: usize,
    n_head: usize,
    window: Option<usize>,
    deepest: usize,
) {
    let (kvw, qw) = (n_kv * head, n_head * head);
    let depths: Vec<usize> = (0..n)
        .map(|t| {
            if t == 0 {
                deepest
            } else {
                p.rng.below(deepest as u32 + 1) as usize
            }
        })
        .collect();
    let mut kvc = Vec::new();
    let mut kvg = Vec::new();
    for (t, &depth) in depths.iter().enumerate() {
        let spec = KvLayerSpec {
            n_head,
            n_head_kv: n_kv,
            head_dim: head,
            window,
            // Slot counts differ between the sequences of a group (sessions of different n_ctx).
            slots: window.map_or(depth + 1 + t % 3, |w| w + 511 - 200 * (t % 3)),
        };
        let (mut c, mut g) = (
            p.cpu.kv_cache(&[spec]).expect("CPU KV cache"),
            p.gpu.kv_cache(&[spec]).expect("GPU KV cache"),
        );
        // A ring takes at most slots - window + 1 positions per store (as a session's batches),
        // else one store would write a slot twice (in parallel on the GPU).
        let chunk = window.map_or(512, |w| (spec.slots + 1 - w).min(512));
        let mut pos = 0;
        while pos < depth {
            let m = (depth - pos).min(chunk);
            let kd = p.randn(m * kvw, 1.0);
            let vd = p.randn(m * kvw, 1.0);
            let (kc, kg) = p.bufs(m, kvw, &kd);
            let (vc, vg) = p.bufs(m, kvw, &vd);
            p.cpu.kv_store(&mut c, 0, &kc, &vc, pos);
            p.gpu.kv_store(&mut g, 0, &kg, &vg, pos);
            pos += m;
        }
        kvc.push(c);
        kvg.push(g);
    }
    let (mut kc, mut kg, _) = p.random_bufs(n, kvw);
    let (vc, vg, _) = p.random_bufs(n, kvw);
    let (mut qc, mut qg, _) = p.random_bufs(n, qw);
    let (gc, gg, gdata) = p.random_bufs(n, qw);
    let (mut ac, mut ag) = (p.cpu.buf(n, qw), p.gpu.buf(n, qw));
    let scale = 1.0 / (head as f32).sqrt();
    // Rings: the fused prologue (QK norm, NeoX RoPE, KV store) and the gated attention; planes:
    // the plain KV store and attention.
    let (qn, kn) = (
        p.vector("q_norm", head).unwrap(),
        p.vector("k_norm", head).unwrap(),
    );
    let (qnc, knc) = (p.cpu.weight(&qn).unwrap(), p.cpu.weight(&kn).unwrap());
    let (qng, kng) = (p.gpu.weight(&qn).unwrap(), p.gpu.weight(&kn).unwrap());
    let rope = RopeParams {
        style: RopeStyle::Neox,
        freq_base: 10000.0,
        n_rot: head,
    };
    let heads = Heads {
        n_head,
        n_head_kv: n_kv,
        head_dim: head,
    };
    let ring = window.is_some();
    {
        let mut rc: Vec<&mut _> = kvc.iter_mut().collect();
        let mut rg: Vec<&mut _> = kvg.iter_mut().collect();
        if ring {
            p.cpu.qkv_rows(
                &mut qc,
                &mut kc,
                &vc,
                Some((&qnc, &knc, 1e-6)),
                heads,
                Some(&rope),
                &mut rc,
                0,
                &depths,
            );
            p.gpu.qkv_rows(
                &mut qg,
                &mut kg,
                &vg,
                Some((&qng, &kng, 1e-6)),
                heads,
                Some(&rope),
                &mut rg,
                0,
                &depths,
            );
        } else {
            p.cpu.kv_store_rows(&mut rc, 0, &kc, &vc, kvw, &depths);
            p.gpu.kv_store_rows(&mut rg, 0, &kg, &vg, kvw, &depths);
        }
        let (gate_c, gate_g) = (ring.then_some(&gc), ring.then_some(&gg));
        p.cpu
            .attention_rows(&qc, qw, &rc, 0, &depths, scale, gate_c, &mut ac);
        p.gpu
            .attention_rows(&qg, qw, &rg, 0, &depths, scale, gate_g, &mut ag);
    }
    fused_matmul_exact(p, &ag, &format!("attention_rows -> attn_output {n}x{qw}"));
    let what = window.map_or("plane".to_string(), |w| format!("ring {w}"));
    let mma = if p.gpu.attn_mma() && mma_attention_fits(head, n_head / n_kv) {
        " mma"
    } else {
        ""
    };
    let shape = format!("{what} {n_head}/{n_kv}x{head}{mma} {n} rows @0..{deepest}");
    let qdata = p.read_gpu(&qg);
    if ring {
        let want = p.read_cpu(&qc);
        p.record(
            "qkv_rows (q)",
            shape.clone(),
            &qdata,
            &want,
            ELEMENTWISE_NMSE,
        );
    }
    let (a, b) = (p.read_gpu(&ag), p.read_cpu(&ac));
    let op = if ring {
        "qkv_rows+attn_rows+gate"
    } else {
        "kv_store+attn_rows"
    };
    p.record(op, shape.clone(), &a, &b, MATVEC_NMSE);
    if p.gpu.attn_cluster() {
        // Short rows merge their splits inside the attention launch, or with that off in
        // attn_rows_combine: the same bits either way.
        p.gpu.set_attn_cluster(false);
        let mut ao = p.gpu.buf(n, qw);
        {
            let rg: Vec<&mut _> = kvg.iter_mut().collect();
            p.gpu.attention_rows(
                &qg,
                qw,
                &rg,
                0,
                &depths,
                scale,
                ring.then_some(&gg),
                &mut ao,
            );
        }
        p.gpu.set_attn_cluster(true);
        let combined = p.read_gpu(&ao);
        p.exact(
            "attn_rows clusters == combine",
            shape.clone(),
            &a,
            &combined,
        );
    }
    // Each row alone (a decode group of one, as a single sequence decodes) must get its bits.
    let mut alone = Vec::with_capacity(a.len());
    for (t, &depth) in depths.iter().enumerate() {
        let (_, q1) = p.bufs(1, qw, &qdata[t * qw..(t + 1) * qw]);
        let (_, g1) = p.bufs(1, qw, &gdata[t * qw..(t + 1) * qw]);
        let mut o1 = p.gpu.buf(1, qw);
        let one = [&mut kvg[t]];
        p.gpu.attention_rows(
            &q1,
            qw,
            &one,
            0,
            &[depth],
            scale,
            ring.then_some(&g1),
            &mut o1,
        );
        alone.extend(p.read_gpu(&o1));
    }
    p.exact("attn_rows row == alone", shape, &a, &alone);
}

/// The outputs of `op` for the columns of `xdata` (width `k`, outputs of width `rows`) run after
/// 3 other random columns, so each column sits at another place in its tile (and the last ones
/// in the next tile): a prefill column's result must not depend on where it is.
fn moved_columns(
    p: &mut Pair,
    xdata: &[f32],
    k: usize,
    rows: usize,
    op: impl Fn(&Pair, &CudaBuf, &mut CudaBuf),
) -> Vec<f32> {
    const PRE: usize = 3;
    let n = xdata.len() / k;
    let mut data = p.randn(PRE * k, 1.0);
    data.extend_from_slice(xdata);
    let (_, x) = p.bufs(n + PRE, k, &data);
    let mut y = p.gpu.buf(n + PRE, rows);
    op(p, &x, &mut y);
    p.read_gpu(&y)[PRE * rows..].to_vec()
}

/// A whole-model check whose cases must agree bit for bit, `differ` of them not: its row in
/// `rows` and its line ("ok"/"FAIL", op, shape, `differ` and `what`).
fn count_row(
    rows: &mut Vec<Row>,
    op: &str,
    shape: String,
    differ: usize,
    what: &str,
) -> std::io::Result<()> {
    let r = Row {
        op: op.into(),
        shape,
        nmse: if differ == 0 { 0.0 } else { f64::INFINITY },
        threshold: 0.0,
    };
    outln!(
        "{:<5} {:<22} {:<34} {differ} {what}",
        if r.pass() { "ok" } else { "FAIL" },
        r.op,
        r.shape
    )?;
    rows.push(r);
    Ok(())
}

/// Batch invariance of a whole model on CUDA: 32 greedy requests (prompts of 1 to ~150 tokens)
/// decoded alone op by op (no graphs), then alone again and in decode groups of 2, 8, 16, 24
/// and 32 (the wide groups' `mmw_*` tiles, whose activations the producers lay out) with
/// each step replayed from a recorded graph; every step's logits must have the bits of the
/// request's first solo run (each request is fed its solo run's tokens), and the GPU's argmax
/// (`decode_greedy`) must pick the token the host picks from those logits. A prompt on a prefix
/// copied from another session (`Session::copy_prefix_from`) must give the bits of the prompt
/// computed whole.
fn check_invariance(
    rows: &mut Vec<Row>,
    path: &PathBuf,
    steps: usize,
    audit: &mut BTreeMap<String, u64>,
) -> anyhow::Result<String> {
    let file = Arc::new(GgufFile::open(path)?);
    let total: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let m = Model::from_gguf(file, CudaBackend::new(0)?.with_upload_progress(total))?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().to_string(),
    );
    let nv = m.config.n_vocab;
    let mut rng = Rand::new(0x1a7e);
    let n_req = 32;
    let prompts: Vec<Vec<u32>> = (0..n_req)
        .map(|i| {
            let len = 1 + (i * 37) % 150;
            (0..len).map(|_| rng.below(nv as u32)).collect()
        })
        .collect();
    let n_ctx = 151 + steps;
    let t0 = Instant::now();
    // Solo, op by op: each request's tokens (greedy on its own logits) and the bits of every step.
    let graphs = m.backend().graphs();
    m.backend().set_graphs(false);
    let mut fed: Vec<Vec<u32>> = Vec::new();
    let mut want: Vec<Vec<Vec<u32>>> = Vec::new();
    for p in &prompts {
        let mut s = Session::new(&m, n_ctx)?;
        let mut next = argmax(s.prefill(p)?) as u32;
        let (mut toks, mut bits) = (Vec::new(), Vec::new());
        for _ in 0..steps {
            toks.push(next);
            let l = s.decode(next)?;
            bits.push(l.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
            next = argmax(l) as u32;
        }
        fed.push(toks);
        want.push(bits);
    }
    m.backend().set_graphs(graphs);
    // GPU argmax of solo decode steps (replayed graphs) against the host's pick.
    let mut argmax_differ = 0;
    for ((p, toks), bits) in prompts.iter().zip(&fed).zip(&want) {
        let mut s = Session::new(&m, n_ctx)?;
        s.prefill(p)?;
        for (&t, b) in toks.iter().zip(bits) {
            let host = argmax(&b.iter().map(|&v| f32::from_bits(v)).collect::<Vec<_>>()) as u32;
            if s.decode_greedy(t)? != host {
                argmax_differ += 1;
            }
        }
    }
    count_row(
        rows,
        "decode_greedy",
        format!("{name} GPU argmax"),
        argmax_differ,
        &format!(
            "of {} steps pick another token than the host",
            n_req * steps
        ),
    )?;
    // A prompt prefix copied from another session (`copy_prefix_from`, serve's shared
    // prefixes and `n` choices), the source having prefilled a longer prompt and decoded on:
    // the rest of the prompt prefilled and one step decoded must give the bits of the prompt
    // computed whole.
    // (and the same prefix saved to host memory and taken back: `kv_save`, `kv_load`)
    let (mut copies_differ, mut restores_differ) = (0, 0);
    let bits = |l: &[f32]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (i, p) in prompts
        .iter()
        .enumerate()
        .filter(|(_, p)| p.len() >= 2)
        .take(12)
    {
        let mut whole = Session::new(&m, n_ctx)?;
        let first = bits(whole.prefill(p)?);
        let next = bits(whole.decode(fed[i][0])?);
        let cut = 1 + (i * 29) % (p.len() - 1);
        let mut longer = p[..cut].to_vec();
        longer.extend((0..1 + i % 40).map(|_| rng.below(nv as u32)));
        let mut src = Session::new(&m, n_ctx)?;
        let t = argmax(src.prefill(&longer)?) as u32;
        src.decode(t)?;
        let snap = src.save(cut);
        let mut dst = Session::new(&m, n_ctx)?;
        dst.prefill(&prompts[(i + 1) % n_req])?;
        if dst.copy_prefix_from(&src, cut) {
            let got = bits(dst.prefill(&p[cut..])?);
            let got_next = bits(dst.decode(fed[i][0])?);
            copies_differ += usize::from(got != first || got_next != next);
        } else {
            copies_differ += 1;
        }
        // the snapshot into a session that went on to other positions since
        dst.decode(fed[i][0])?;
        if let Some(true) = snap.as_ref().map(|sn| dst.restore(sn)) {
            let got = bits(dst.prefill(&p[cut..])?);
            let got_next = bits(dst.decode(fed[i][0])?);
            restores_differ += usize::from(got != first || got_next != next);
        } else {
            restores_differ += 1;
        }
    }
    count_row(
        rows,
        "kv_copy_prefix",
        format!("{name} copied prefixes"),
        copies_differ,
        "of 12 prompts on a copied prefix differ from the prompt computed whole",
    )?;
    count_row(
        rows,
        "kv_save_load",
        format!("{name} saved prefixes"),
        restores_differ,
        "of 12 prompts on a prefix saved to host memory differ from the prompt computed whole",
    )?;
    // Prompts sharing prefill passes (`prefill_runs`, serve's prefill), each shorter than
    // `exact_prefill_rows`: the logits of each prompt's own prefill and of the decode after it.
    let short: Vec<Vec<u32>> = (0..n_req)
        .map(|i| {
            let len =
                (1 + (i * 13) % 60).min(m.backend().exact_prefill_rows().saturating_sub(1).max(1));
            (0..len).map(|_| rng.below(nv as u32)).collect()
        })
        .collect();
    let (mut runs_differ, mut runs_checked) = (0usize, 0usize);
    for part in short.chunks(8) {
        let mut alone = Vec::new();
        for p in part {
            let mut s = Session::new(&m, n_ctx)?;
            let l = s.prefill(p)?.to_vec();
            let d = s.decode(argmax(&l) as u32)?.to_vec();
            alone.push((l, d));
        }
        let mut sessions = part
            .iter()
            .map(|_| Session::new(&m, n_ctx))
            .collect::<muser_engine::Result<Vec<_>>>()?;
        {
            let mut refs: Vec<&mut Session<CudaBackend>> = sessions.iter_mut().collect();
            let ps: Vec<&[u32]> = part.iter().map(|p| p.as_slice()).collect();
            muser_engine::prefill_runs(&mut refs, &ps)?;
        }
        for (s, (l, d)) in sessions.iter_mut().zip(&alone) {
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            let ok_l = same(s.logits(), l);
            let next = argmax(l) as u32;
            let ok_d = same(s.decode(next)?, d);
            runs_checked += 1;
            runs_differ += usize::from(!(ok_l && ok_d));
        }
    }
    // The same two prompts (one past 512 positions) cut into parts two ways, in company: the
    // bits do not depend on the cut.
    {
        let a: Vec<u32> = (0..700).map(|_| rng.below(nv as u32)).collect();
        let b: Vec<u32> = (0..90).map(|_| rng.below(nv as u32)).collect();
        let cuts: [&[(usize, usize, usize, usize)]; 2] = [
            &[(0, 448, 0, 64), (448, 700, 64, 90)],
            &[(0, 100, 0, 0), (100, 612, 0, 0), (612, 700, 0, 90)],
        ];
        let mut got = Vec::new();
        for cut in cuts {
            let mut sa = Session::new(&m, 800)?;
            let mut sb = Session::new(&m, 800)?;
            for &(a0, a1, b0, b1) in cut {
                if b1 > b0 {
                    muser_engine::prefill_runs(&mut [&mut sa, &mut sb], &[&a[a0..a1], &b[b0..b1]])?;
                } else {
                    muser_engine::prefill_runs(&mut [&mut sa], &[&a[a0..a1]])?;
                }
            }
            let mut v = Vec::new();
            for s in [&mut sa, &mut sb] {
                let l = s.logits().to_vec();
                let d = s.decode(argmax(&l) as u32)?.to_vec();
                v.push((l, d));
            }
            got.push(v);
        }
        let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        for (x, y) in got[0].iter().zip(&got[1]) {
            runs_checked += 1;
            runs_differ += usize::from(!(same(&x.0, &y.0) && same(&x.1, &y.1)));
        }
    }
    count_row(
        rows,
        "prefill_runs",
        format!("{name} 8 prompts a pass"),
        runs_differ,
        &format!(
            "of {runs_checked} prompts differ from their own prefill or another cut (logits or \
             the next decode)"
        ),
    )?;
    let mut summary = Vec::new();
    for size in [1usize, 2, 8, 16, 24, 32] {
        let mut sessions = prompts
            .iter()
            .map(|_| Session::new(&m, n_ctx))
            .collect::<muser_engine::Result<Vec<_>>>()?;
        for (s, p) in sessions.iter_mut().zip(&prompts) {
            s.prefill(p)?;
        }
        let mut group = muser_engine::DecodeGroup::new();
        let (mut differ, mut max_diff) = (0usize, 0f32);
        let (mut picks, mut picks_differ, mut compared) = (0usize, 0usize, 0usize);
        for step in 0..steps {
            for (g, members) in sessions.chunks_mut(size).enumerate() {
                let ids: Vec<usize> = (g * size..g * size + members.len()).collect();
                let toks: Vec<u32> = ids.iter().map(|&i| fed[i][step]).collect();
                let mut refs: Vec<&mut Session<CudaBackend>> = members.iter_mut().collect();
                // Groups of 8 and 16 also take the serving paths: a third of the rows (a different
                // third each step) read back, a third picked on the GPU (argmax), a third given
                // their 40 best candidates by the GPU (sampling with top-k).
                let need: Vec<RowNeed> = ids
                    .iter()
                    .map(|&i| match (size >= 8, (i + step) % 3) {
                        (true, 1) => RowNeed::Argmax,
                        (true, 2) => RowNeed::TopK(40),
                        _ => RowNeed::Logits,
                    })
                    .collect();
                let got = group.decode_rows(&mut refs, &toks, &need)?;
                for (g, &i) in got.iter().zip(&ids) {
                    let w = || -> Vec<f32> {
                        want[i][step].iter().map(|&b| f32::from_bits(b)).collect()
                    };
                    let same = match g {
                        RowGot::Logits => continue,
                        RowGot::Argmax(id) => *id == argmax(&w()) as u32,
                        RowGot::TopK(top) => {
                            let host: Vec<(u32, u32)> = muser_sample::top_k_logits(&w(), 40)
                                .iter()
                                .map(|c| (c.id, c.logit.to_bits()))
                                .collect();
                            top.iter().map(|&(id, l)| (id, l.to_bits())).eq(host)
                        }
                    };
                    picks += 1;
                    picks_differ += usize::from(!same);
                }
                let read: Vec<(usize, Vec<f32>)> = ids
                    .iter()
                    .zip(&refs)
                    .zip(&need)
                    .filter(|(_, &r)| r == RowNeed::Logits)
                    .map(|((&i, s), _)| (i, s.logits().to_vec()))
                    .collect();
                compared += read.len();
                for (i, row) in &read {
                    let (i, row) = (*i, row.as_slice());
                    let w = &want[i][step];
                    if row.iter().zip(w).any(|(a, &b)| a.to_bits() != b) {
                        differ += 1;
                        let d = row
                            .iter()
                            .zip(w)
                            .map(|(a, &b)| (a - f32::from_bits(b)).abs())
                            .fold(0f32, f32::max);
                        max_diff = max_diff.max(d);
                    }
                }
            }
        }
        if picks > 0 {
            let r = Row {
                op: "decode_rows".into(),
                shape: format!("{name} groups of {size}"),
                nmse: if picks_differ == 0 {
                    0.0
                } else {
                    f64::INFINITY
                },
                threshold: 0.0,
            };
            outln!(
                "{:<5} {:<22} {:<34} {picks_differ} of {picks} GPU argmax / top-40 rows differ from the host's",
                if r.pass() { "ok" } else { "FAIL" },
                r.op,
                r.shape,
            )?;
            rows.push(r);
        }
        let r = Row {
            op: "batch invariance".into(),
            shape: format!("{name} groups of {size}"),
            nmse: if differ == 0 { 0.0 } else { f64::INFINITY },
            threshold: 0.0,
        };
        outln!(
            "{:<5} {:<22} {:<34} {}",
            if r.pass() { "ok" } else { "FAIL" },
            r.op,
            r.shape,
            if differ == 0 {
                format!("{compared} request-steps' logits bit-identical to solo")
            } else {
                format!("{differ} of {compared} request-steps differ from solo, max |diff| {max_diff:.3e}")
            }
        )?;
        summary.push(format!(
            "{size}: {}",
            if differ == 0 {
                "identical".to_string()
            } else {
                format!("{differ} differ")
            }
        ));
        rows.push(r);
    }
    for (k, n) in m.backend().gpu.dispatch_counts() {
        *audit.entry(k).or_default() += n;
    }
    Ok(format!(
        "invariance {name}: {n_req} greedy requests x {steps} steps, alone vs groups of {} ({:.1} s)",
        summary.join(", "),
        t0.elapsed().as_secs_f64()
    ))
}

/// Time of a decode-group step of `n` sequences (prompts of a few tokens): the whole step
/// (logits read back), the logits read-back alone, and the per-op breakdown (each op
/// synchronized).
fn profile_group(m: &Model<CudaBackend>, n: usize, name: &str) -> anyhow::Result<()> {
    let nv = m.config.n_vocab as u32;
    let mut rng = Rand::new(11);
    let steps = 8;
    let mut sessions = (0..n)
        .map(|_| Session::new(m, 16 + 2 * steps))
        .collect::<muser_engine::Result<Vec<_>>>()?;
    for (i, s) in sessions.iter_mut().enumerate() {
        let p: Vec<u32> = (0..2 + i % 5).map(|_| rng.below(nv)).collect();
        s.prefill(&p)?;
    }
    let mut group = muser_engine::DecodeGroup::new();
    let mut step = |sessions: &mut Vec<Session<CudaBackend>>| -> anyhow::Result<()> {
        let toks: Vec<u32> = (0..n).map(|_| rng.below(nv)).collect();
        let mut refs: Vec<&mut Session<CudaBackend>> = sessions.iter_mut().collect();
        group.decode(&mut refs, &toks)?;
        Ok(())
    };
    step(&mut sessions)?;
    let t = Instant::now();
    for _ in 0..steps {
        step(&mut sessions)?;
    }
    let step_s = t.elapsed().as_secs_f64() / steps as f64;
    // The logits read-back a step ends with ([n][n_vocab] f32 to the host).
    let be = m.backend();
    let logits = be.buf(n, nv as usize);
    let mut host = vec![0f32; n * nv as usize];
    be.read(&logits, &mut host);
    let t = Instant::now();
    for _ in 0..4 {
        be.read(&logits, &mut host);
    }
    let read_s = t.elapsed().as_secs_f64() / 4.0;
    // The read a group step really does: into one buffer per sequence (`read_parts`), and the
    // host copy of those rows alone (what the staging adds to the transfer).
    let mut rows: Vec<Vec<f32>> = (0..n).map(|_| vec![0f32; nv as usize]).collect();
    let mut parts: Vec<&mut [f32]> = rows.iter_mut().map(|r| r.as_mut_slice()).collect();
    be.read_parts(&logits, &mut parts);
    let t = Instant::now();
    for _ in 0..4 {
        be.read_parts(&logits, &mut parts);
    }
    let parts_s = t.elapsed().as_secs_f64() / 4.0;
    let t = Instant::now();
    for _ in 0..4 {
        muser_engine::backend::copy_parts(&host, &mut parts);
    }
    let copy_s = t.elapsed().as_secs_f64() / 4.0;
    be.set_profiling(true);
    for _ in 0..steps {
        step(&mut sessions)?;
    }
    print_profile(
        m,
        &format!(
            "decode group of {n} on {name}: {:.2} ms per step = {:.0} tokens/s; logits read-back {:.2} ms ({:.1} MB), into the rows {:.2} ms, a serial host copy of them {:.2} ms",
            step_s * 1e3,
            n as f64 / step_s,
            read_s * 1e3,
            (n * nv as usize * 4) as f64 / 1e6,
            parts_s * 1e3,
            copy_s * 1e3
        ),
        steps,
        "ms per step",
    )?;
    Ok(())
}

/// The first index of the largest value (muser-sample's greedy rule).
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// A whole-model row, printed and kept.
fn model_row(rows: &mut Vec<Row>, r: Row) -> anyhow::Result<()> {
    outln!("{}", r.line())?;
    rows.push(r);
    Ok(())
}

/// Whole-model parity of one GGUF: prompt logits, then a greedy continuation where both
/// backends are fed the CPU's tokens and every step's logits and top-1 are compared.
fn check_model(
    rows: &mut Vec<Row>,
    path: &PathBuf,
    args: &Args,
    audit: &mut BTreeMap<String, u64>,
) -> anyhow::Result<String> {
    let file = Arc::new(GgufFile::open(path)?);
    let total: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let t0 = Instant::now();
    let cuda = Model::from_gguf(
        file.clone(),
        CudaBackend::new(0)?.with_upload_progress(total),
    )?;
    cuda.backend().synchronize();
    let load_s = t0.elapsed().as_secs_f64();
    let cpu = Model::from_gguf(file, CpuBackend::new(None)?)?;
    let c = &cuda.config;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().to_string(),
    );
    let n_ctx = args.prompt + args.tokens + 1;
    let mut rng = Rand::new(args.seed ^ 0x5eed);
    let prompt: Vec<u32> = (0..args.prompt)
        .map(|_| rng.below(c.n_vocab as u32))
        .collect();

    let mut sc = Session::new(&cpu, n_ctx)?;
    let mut sg = Session::new(&cuda, n_ctx)?;
    let lc = sc.prefill_all(&prompt)?;
    let lg = sg.prefill_all(&prompt)?;
    let whole = |op: &str, got: &[f32], want: &[f32]| Row {
        op: op.into(),
        shape: format!("{name} {} pos", prompt.len()),
        nmse: nmse(got, want),
        threshold: LOGITS_NMSE,
    };
    model_row(rows, whole("model prompt logits", &lg, &lc))?;
    // Every position's output-normed hidden state (`Session::embed`, what `muser serve
    // --embeddings` pools), on fresh sessions.
    let ec = Session::new(&cpu, n_ctx)?.embed(&prompt)?;
    let eg = Session::new(&cuda, n_ctx)?.embed(&prompt)?;
    model_row(rows, whole("model embeddings", &eg, &ec))?;

    // Greedy continuation: the CPU picks, both are fed its token.
    let nv = c.n_vocab;
    let mut cpu_logits = lc[(prompt.len() - 1) * nv..].to_vec();
    let mut gpu_logits = lg[(prompt.len() - 1) * nv..].to_vec();
    let (mut num, mut den) = (0f64, 0f64);
    let mut first_div: Option<String> = None;
    let mut agree = 0;
    for step in 0..args.tokens {
        let tc = argmax(&cpu_logits);
        let tg = argmax(&gpu_logits);
        num += cpu_logits
            .iter()
            .zip(&gpu_logits)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>();
        den += cpu_logits.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
        if tc == tg {
            agree += 1;
        } else if first_div.is_none() {
            let margin = cpu_logits[tc] - cpu_logits[tg];
            let rms = (cpu_logits
                .iter()
                .zip(&gpu_logits)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum::<f64>()
                / nv as f64)
                .sqrt();
            let tie = (margin as f64) <= 3.0 * rms.max(1e-6) * std::f64::consts::SQRT_2;
            first_div = Some(format!(
                "step {step}: CPU {tc} vs CUDA {tg}, CPU logit margin {margin:.4} vs logit error rms {rms:.4} ({})",
                if tie { "near-tie" } else { "NOT a near-tie" }
            ));
            if !tie {
                rows.push(Row {
                    op: "greedy divergence".into(),
                    shape: format!("{name} step {step}"),
                    nmse: f64::INFINITY,
                    threshold: 0.0,
                });
            }
        }
        cpu_logits = sc.decode(tc as u32)?.to_vec();
        gpu_logits = sg.decode(tc as u32)?.to_vec();
    }
    let r = Row {
        op: "model decode logits".into(),
        shape: format!("{name} {} steps", args.tokens),
        nmse: num / den.max(f64::MIN_POSITIVE),
        threshold: LOGITS_NMSE,
    };
    model_row(rows, r)?;
    outln!(
        "      greedy top-1 agreement {agree}/{}{}",
        args.tokens,
        first_div
            .as_deref()
            .map_or(String::new(), |d| format!("; first divergence {d}"))
    )?;

    let mut speed = String::new();
    if args.bench {
        // Decode speed on CUDA at the context reached (logits read back every token).
        let n = 32;
        let mut sg = Session::new(&cuda, 16 + n + 1)?;
        sg.prefill(&prompt[..prompt.len().min(16)])?;
        cuda.backend().synchronize();
        let t = Instant::now();
        let mut tok = 1u32;
        for _ in 0..n {
            tok = argmax(sg.decode(tok)?) as u32;
        }
        let s = t.elapsed().as_secs_f64() / n as f64;
        let bytes = cuda.decode_bytes(sg.pos());
        speed = format!(
            "; decode {:.2} ms/token = {:.1} tokens/s, {:.1} MB/token, {:.0} GB/s",
            s * 1e3,
            1.0 / s,
            bytes as f64 / 1e6,
            bytes as f64 / s / 1e9
        );
    }
    for (k, n) in cuda.backend().gpu.dispatch_counts() {
        *audit.entry(k).or_default() += n;
    }
    Ok(format!(
        "model {name}: {} layers, hidden {}, vocab {}; upload {:.2} s ({:.1} GB/s); greedy {agree}/{} agree{}",
        c.n_layer,
        c.n_embd,
        c.n_vocab,
        load_s,
        total as f64 / load_s / 1e9,
        args.tokens,
        speed
    ))
}

/// Times one launch of each Glimmer matrix (1 column) and prints GB/s of weights read.
fn bench_matvec(p: &Pair) -> anyhow::Result<()> {
    outln!("\nmatvec timing (1 column, weights streamed once per launch):")?;
    outln!("| matrix | type | rows x cols | MB | us | GB/s |")?;
    let cases = [
        ("attn_q+k+v+gate", 0usize, 0usize, GgmlType::Q4_K),
        ("attn_q", Q_WIDTH, HIDDEN, GgmlType::Q4_K),
        ("attn_k", KV_WIDTH, HIDDEN, GgmlType::Q4_K),
        ("attn_output", HIDDEN, Q_WIDTH, GgmlType::Q4_K),
        ("ffn_gate", FFN, HIDDEN, GgmlType::Q4_K),
        ("ffn_down", HIDDEN, FFN, GgmlType::Q4_K),
        ("ffn_down", HIDDEN, FFN, GgmlType::Q6_K),
        ("output", VOCAB, HIDDEN, GgmlType::Q5_K),
        ("attn_q", Q_WIDTH, HIDDEN, GgmlType::F16),
        ("attn_q", Q_WIDTH, HIDDEN, GgmlType::Q8_0),
    ];
    let be = &p.gpu;
    for (name, rows, cols, ty) in cases {
        let mats: Vec<(usize, usize, GgmlType)> = if rows == 0 {
            vec![
                (Q_WIDTH, HIDDEN, ty),
                (KV_WIDTH, HIDDEN, ty),
                (KV_WIDTH, HIDDEN, GgmlType::Q6_K),
                (Q_WIDTH, HIDDEN, ty),
            ]
        } else {
            vec![(rows, cols, ty)]
        };
        let mut ws = Vec::new();
        let mut outs = Vec::new();
        let mut bytes = 0u64;
        for (i, &(r, c, t)) in mats.iter().enumerate() {
            let data = random_matrix(t, r, c, 99 + i as u64);
            bytes += data.len() as u64;
            ws.push(be.weight(&TensorView::owned("bench", t, &[c as u64, r as u64], data)?)?);
            outs.push(be.buf(1, r));
        }
        let k = mats[0].1;
        let mut xin = be.buf(1, k);
        be.write(&mut xin, &vec![0.5f32; k]);
        let iters = 50;
        let run = |outs: &mut Vec<CudaBuf>| {
            let mut pairs: Vec<(&muser_cuda::CudaWeight, &mut CudaBuf)> =
                ws.iter().zip(outs.iter_mut()).collect();
            be.matmul(&xin, &mut pairs);
        };
        run(&mut outs);
        be.synchronize();
        let t = Instant::now();
        for _ in 0..iters {
            run(&mut outs);
        }
        be.synchronize();
        let us = t.elapsed().as_secs_f64() / iters as f64 * 1e6;
        let shape = if rows == 0 {
            format!(
                "{}+{}+{}+{} x {HIDDEN}",
                Q_WIDTH, KV_WIDTH, KV_WIDTH, Q_WIDTH
            )
        } else {
            format!("{rows} x {cols}")
        };
        outln!(
            "| {name} | {ty} | {shape} | {:.1} | {us:.1} | {:.0} |",
            bytes as f64 / 1e6,
            bytes as f64 / us / 1e3
        )?;
    }
    Ok(())
}

/// Prints the per-op profile of the last `steps` decode steps (profiling on; turned off here).
fn print_decode_profile(
    m: &Model<CudaBackend>,
    name: &str,
    pos: usize,
    steps: usize,
) -> std::io::Result<()> {
    print_profile(
        m,
        &format!(
            "decode step breakdown of {name} at depth ~{pos} (ms per token; op calls per token):"
        ),
        steps,
        "ms",
    )
}

/// Prints `title` and the per-op profile recorded since profiling was turned on (turned off
/// here), per `steps` (ms and calls divided by it; `ms` heads that column).
fn print_profile(
    m: &Model<CudaBackend>,
    title: &str,
    steps: usize,
    ms: &str,
) -> std::io::Result<()> {
    let prof = m.backend().profile_report();
    m.backend().set_profiling(false);
    let total: f64 = prof.iter().map(|p| p.2).sum();
    outln!("{title}")?;
    outln!("| op | calls | {ms} | share |")?;
    for (op, n, secs) in &prof {
        outln!(
            "| {op} | {} | {:.3} | {:.0}% |",
            n / steps as u64,
            secs * 1e3 / steps as f64,
            100.0 * secs / total
        )?;
    }
    outln!(
        "| total (synchronized) | | {:.3} | |",
        total * 1e3 / steps as f64
    )
}

/// pp512 and tg128 (and tg64 at `depth`) of one model on CUDA alone.
fn speed(
    path: &PathBuf,
    depth: usize,
    group_profile: &[usize],
    audit: &mut BTreeMap<String, u64>,
) -> anyhow::Result<String> {
    let file = Arc::new(GgufFile::open(path)?);
    let file_bytes: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let t0 = Instant::now();
    let m = Model::from_gguf(file, CudaBackend::new(0)?.with_upload_progress(file_bytes))?;
    m.backend().synchronize();
    let load_s = t0.elapsed().as_secs_f64();
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().to_string(),
    );
    let nv = m.config.n_vocab as u32;
    let mut rng = Rand::new(7);
    let prompt: Vec<u32> = (0..depth.max(512)).map(|_| rng.below(nv)).collect();
    let mut s = Session::new(&m, depth.max(512) + 129)?;
    s.prefill(&prompt[..8])?;
    s.reset();
    let t = Instant::now();
    s.prefill(&prompt[..512])?;
    let pp = 512.0 / t.elapsed().as_secs_f64();
    // Per-op time of one 512-token prefill chunk, and of a 64-token one (what a server prefills
    // beside running decodes).
    for n in [512, 64] {
        s.reset();
        m.backend().set_profiling(true);
        s.prefill(&prompt[..n])?;
        print_profile(
            &m,
            &format!("prefill breakdown of {name} ({n} tokens; ms per chunk):"),
            1,
            "ms",
        )?;
    }
    let read_bw = m.backend().gpu.measure_read_bandwidth()?;
    let tg = |s: &mut Session<CudaBackend>, n: usize| -> anyhow::Result<(f64, u64)> {
        let mut tok = argmax(s.logits()) as u32;
        let t = Instant::now();
        for _ in 0..n {
            tok = argmax(s.decode(tok)?) as u32;
        }
        let secs = t.elapsed().as_secs_f64() / n as f64;
        Ok((secs, m.decode_bytes(s.pos() - n / 2)))
    };
    s.reset();
    s.prefill(&prompt[..1])?;
    let (t0s, b0) = tg(&mut s, 128)?;
    let mut line = format!(
        "speed {name}: upload {load_s:.1} s ({:.1} GB/s); pp512 {pp:.0} tokens/s; tg128 {:.1} tokens/s ({:.2} ms/token, {:.2} GB/token, {:.0} GB/s = {:.0}% of the {:.2} TB/s measured)",
        file_bytes as f64 / load_s / 1e9,
        1.0 / t0s,
        t0s * 1e3,
        b0 as f64 / 1e9,
        b0 as f64 / t0s / 1e9,
        100.0 * b0 as f64 / t0s / read_bw,
        read_bw / 1e12
    );
    // Per-op time of a decode step (each op synchronized: launch latencies included, no overlap).
    let steps = 16;
    m.backend().set_profiling(true);
    tg(&mut s, steps)?;
    print_decode_profile(&m, &name, s.pos(), steps)?;
    if depth > 0 {
        s.reset();
        s.prefill(&prompt[..depth])?;
        let (td, bd) = tg(&mut s, 64)?;
        // Per-op time of a decode step at this depth (each op synchronized, as above).
        m.backend().set_profiling(true);
        tg(&mut s, steps)?;
        print_decode_profile(&m, &name, s.pos(), steps)?;
        line += &format!(
            "; tg64 at depth {depth}: {:.1} tokens/s ({:.2} GB/token, {:.0} GB/s)",
            1.0 / td,
            bd as f64 / 1e9,
            bd as f64 / td / 1e9
        );
    }
    for &n in group_profile {
        profile_group(&m, n, &name)?;
    }
    outln!("{line}")?;
    for (k, n) in m.backend().gpu.dispatch_counts() {
        *audit.entry(k).or_default() += n;
    }
    Ok(line)
}
