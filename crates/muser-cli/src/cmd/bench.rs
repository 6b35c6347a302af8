//! `muser bench`: llama-bench's table (prompt processing ppN, text generation tgN; mean ± sd
//! over r repetitions after one warm-up), plus for tg the bytes a decode step reads, the achieved
//! GB/s and its share of the read bandwidth this run measures.
//!
//! `--audit` (GPU backends) then prints each compiled kernel's dispatches in the run and in one
//! more decode step, and lists the kernels the run never dispatched.
//!
//! `-s 1,8,32` replaces the tg row by one row per stream count N: N sessions (prompts of a few
//! tokens, or of depth + a few), then n_gen decode steps, each one `DecodeGroup` of all N; the
//! rate is the aggregate N * n_gen / time, and a step reads the weights once plus every
//! session's K/V. With `--argmax` (`--top-k K`) each step picks every stream's next token (its
//! K best candidates) on the backend, the greedy (sampled) serving path, instead of reading the
//! logits back.

use super::backend::{CliBackend, ModelJob};
use muser_engine::{DecodeGroup, Model, RowNeed, Session};
use rayon::prelude::*;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Prompt tokens of the pp test (0: skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens of the tg test (0: skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Context depth: tokens prefilled (untimed) before each pp and tg run, as llama-bench's -d.
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: usize,
    /// Repetitions (at least 1).
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: usize,
    /// Backend: auto (CUDA when a GPU is usable), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend::BackendKind::Auto)]
    pub backend: super::backend::BackendKind,
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Concurrent decode streams, comma-separated (e.g. 1,8,32): one tg row per count, all the
    /// streams advanced together one decode group per step.
    #[arg(short = 's', long, value_delimiter = ',')]
    pub streams: Vec<usize>,
    /// Streams rows: each stream's next token picked by the backend's argmax, as `serve` does
    /// for greedy requests without logprobs (a GPU reads back one id per stream instead of its
    /// logits). By default every stream's logits are read back, as llama.cpp's batched bench
    /// does.
    #[arg(long, conflicts_with = "top_k")]
    pub argmax: bool,
    /// Streams rows: each stream's K best candidates taken on the backend, as `serve` does for
    /// sampled requests with top-k K (its default is 40) and no logprobs or penalties (a GPU
    /// reads back K pairs per stream instead of its logits).
    #[arg(long = "top-k", value_name = "K")]
    pub top_k: Option<usize>,
    /// Dispatch audit: each kernel's launches in the run and per decode step, and the kernels
    /// the run never dispatched.
    #[arg(long)]
    pub audit: bool,
}

/// Read bandwidth in bytes/s: the best of a few multi-threaded passes summing a 1 GiB buffer
/// (larger than any cache).
pub fn measure_read_bandwidth(threads: usize) -> anyhow::Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let n = (1usize << 30) / 8;
    pool.install(|| {
        let mut buf = vec![0u64; n];
        buf.par_chunks_mut(1 << 16).enumerate().for_each(|(i, c)| {
            c.iter_mut()
                .enumerate()
                .for_each(|(j, v)| *v = (i ^ j) as u64)
        });
        let mut best = 0f64;
        for _ in 0..4 {
            let t = Instant::now();
            let s: u64 = buf
                .par_chunks(1 << 18)
                .map(|c| {
                    // Eight independent lanes so the loop is load-bound, not add-latency-bound.
                    let mut acc = [0u64; 8];
                    for ch in c.chunks_exact(8) {
                        for k in 0..8 {
                            acc[k] = acc[k].wrapping_add(ch[k]);
                        }
                    }
                    acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
                })
                .reduce(|| 0, |a, b| a.wrapping_add(b));
            std::hint::black_box(s);
            best = best.max((n * 8) as f64 / t.elapsed().as_secs_f64());
        }
        Ok(best)
    })
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (m, var.sqrt())
}

fn human_params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.2} M", n as f64 / 1e6)
    }
}

/// "llama 1.10 B Q4_K": architecture, parameters and the type holding most weight bytes.
fn model_name<B: CliBackend>(model: &Model<B>) -> String {
    let mut by_type: Vec<(String, u64)> = Vec::new();
    for t in &model.gguf().tensors {
        let name = t.ggml_type.name().to_string();
        match by_type.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 += t.n_bytes,
            None => by_type.push((name, t.n_bytes)),
        }
    }
    let main = by_type
        .iter()
        .max_by_key(|e| e.1)
        .map(|e| e.0.clone())
        .unwrap_or_default();
    format!(
        "{} {} {}",
        model.config.arch.name,
        human_params(model.n_params()),
        main
    )
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.reps > 0, "-r / --reps: at least 1 repetition");
    anyhow::ensure!(
        args.streams.iter().all(|&n| n > 0),
        "-s: a stream count must be at least 1"
    );
    anyhow::ensure!(args.top_k != Some(0), "--top-k: K must be at least 1");
    let path = super::run::resolve_model(args.model.as_deref())?;
    super::backend::with_model(&path, args.backend, args.threads, args)
}

/// The sessions a run makes, checked before any is made: (the options that ask for them, how
/// many, the context of each). A context whose sum overflows is an error naming its parts.
fn planned_sessions(args: &Args) -> anyhow::Result<Vec<(String, usize, usize)>> {
    let ctx = |parts: &[usize], what: &str| {
        parts
            .iter()
            .try_fold(args.depth, |a, &b| a.checked_add(b))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{what} -d {}: the context (depth + tokens{}) overflows",
                    args.depth,
                    if parts.len() > 1 {
                        format!(" + {STREAM_EXTRA_CTX}")
                    } else {
                        String::new()
                    }
                )
            })
    };
    let mut plan = Vec::new();
    if args.n_prompt > 0 {
        let what = format!("-p {}", args.n_prompt);
        plan.push((what.clone(), 1, ctx(&[args.n_prompt], &what)?));
    }
    if args.n_gen > 0 {
        let what = format!("-n {}", args.n_gen);
        if args.streams.is_empty() {
            plan.push((what.clone(), 1, ctx(&[args.n_gen], &what)?));
        } else {
            let n_ctx = ctx(&[args.n_gen, STREAM_EXTRA_CTX], &what)?;
            for &n in &args.streams {
                plan.push((format!("{what} -s {n}"), n, n_ctx));
            }
        }
    }
    Ok(plan)
}

/// Refuses a planned session set whose K/V cache and buffers (`planned_sessions`) exceed the
/// backend's memory, naming it, before anything is allocated.
fn check_memory<B: CliBackend>(model: &Model<B>, args: &Args) -> anyhow::Result<()> {
    let c = &model.config;
    // Each stream's host and scratch rows: its logits, and one row of each activation in its
    // own scratch and in a decode group's.
    let row = 3 * c.n_embd + 4 * c.q_width() + 2 * c.kv_width() + c.n_ff + c.n_vocab;
    let per_stream_rows = (2 * row + c.n_vocab) as u64 * 4;
    let Some(memory) = model.backend().memory_bytes() else {
        return Ok(());
    };
    let gb = |b: u64| format!("{:.1} GB", b as f64 / 1e9);
    for (what, n, n_ctx) in planned_sessions(args)? {
        let need = model
            .kv_cache_bytes(n_ctx)
            .and_then(|kv| kv.checked_add(per_stream_rows))
            .and_then(|b| b.checked_mul(n as u64));
        if need.is_some_and(|b| b <= memory) {
            continue;
        }
        let sessions = if n == 1 {
            format!("a context of {n_ctx} tokens needs")
        } else {
            format!("{n} streams of {n_ctx} tokens of context need")
        };
        anyhow::bail!(
            "{what} -d {}: {sessions} {} of K/V cache and buffers, more than the {} of memory \
             the {} backend has",
            args.depth,
            need.map_or("more than 2^64 bytes".to_string(), gb),
            gb(memory),
            model.backend().name()
        );
    }
    Ok(())
}

/// `n` token ids from `next`, or an error (not an abort) when the memory for them cannot be had.
fn token_ids(n: usize, next: &mut impl FnMut() -> u32) -> anyhow::Result<Vec<u32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|e| anyhow::anyhow!("cannot allocate {n} token ids: {e}"))?;
    v.extend((0..n).map(|_| next()));
    Ok(v)
}

/// The context a stream has beyond depth + n_gen: its prompt's 2 to 6 tokens past the depth
/// (`streams`), and one spare.
const STREAM_EXTRA_CTX: usize = 7;

impl ModelJob for Args {
    fn run<B: CliBackend>(self, model: Model<B>) -> anyhow::Result<()> {
        let args = self;
        check_memory(&model, &args)?;
        let threads = model.backend().threads();
        let reps = args.reps;
        let nv = model.config.n_vocab as u32;
        // Token ids from a fixed xorshift sequence (the ids do not change the work).
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next_token = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % nv as u64) as u32
        };

        eprintln!("measuring read bandwidth ...");
        let bw = model.backend().read_bandwidth()?;
        eprintln!("read bandwidth: {:.1} GB/s", bw / 1e9);

        let counts0 = model.backend().dispatch_counts();
        let name = model_name(&model);
        let size = format!(
            "{:.2} GiB",
            model.weight_bytes() as f64 / (1u64 << 30) as f64
        );
        let params = human_params(model.n_params());
        let backend = model.backend().label();
        outln!("| model | size | params | backend | threads | test | t/s | MB/step | GB/s | % of read BW |")?;
        outln!("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;

        if args.n_prompt > 0 {
            // Checked by `planned_sessions`, and the session made before the token ids.
            let mut s = Session::new(&model, args.depth + args.n_prompt)?;
            let toks = token_ids(args.n_prompt, &mut next_token)?;
            let context = token_ids(args.depth, &mut next_token)?;
            let mut rates = Vec::new();
            for rep in 0..=reps {
                s.reset();
                if !context.is_empty() {
                    s.prefill(&context)?;
                }
                let t = Instant::now();
                s.prefill(&toks)?;
                if rep > 0 {
                    rates.push(args.n_prompt as f64 / t.elapsed().as_secs_f64());
                }
            }
            let (m, sd) = mean_sd(&rates);
            let test = if args.depth > 0 {
                format!("pp{} @ d{}", args.n_prompt, args.depth)
            } else {
                format!("pp{}", args.n_prompt)
            };
            outln!("| {name} | {size} | {params} | {backend} | {threads} | {test} | {m:.2} ± {sd:.2} | | | |")?;
        }
        if args.n_gen > 0 && !args.streams.is_empty() {
            for &n in &args.streams {
                let (m, sd, bytes) = streams(&model, n, &args, &mut next_token)?;
                let gbs = bytes * m / n as f64 / 1e9;
                let pick = match (args.argmax, args.top_k) {
                    (true, _) => ", argmax".to_string(),
                    (_, Some(k)) => format!(", top-{k}"),
                    _ => String::new(),
                };
                let test = if args.depth > 0 {
                    format!("tg{} @ d{} x{n} streams{pick}", args.n_gen, args.depth)
                } else {
                    format!("tg{} x{n} streams{pick}", args.n_gen)
                };
                outln!(
                    "| {name} | {size} | {params} | {backend} | {threads} | {test} | {m:.2} ± {sd:.2} | {:.1} | {gbs:.2} | {:.0}% |",
                    bytes / 1e6,
                    100.0 * gbs * 1e9 / bw
                )?;
            }
        } else if args.n_gen > 0 {
            let mut s = Session::new(&model, args.depth + args.n_gen)?;
            let toks = token_ids(args.n_gen, &mut next_token)?;
            let context = token_ids(args.depth, &mut next_token)?;
            let mut rates = Vec::new();
            for rep in 0..=reps {
                s.reset();
                if !context.is_empty() {
                    s.prefill(&context)?;
                }
                profile_decode(model.backend(), true)?;
                let t = Instant::now();
                for &tok in &toks {
                    s.decode(tok)?;
                }
                let dt = t.elapsed();
                profile_decode(model.backend(), false)?;
                if rep > 0 {
                    rates.push(args.n_gen as f64 / dt.as_secs_f64());
                }
            }
            let (m, sd) = mean_sd(&rates);
            // Mean context over the run: the depth plus half the generated tokens.
            let bytes = model.decode_bytes(args.depth + args.n_gen.div_ceil(2)) as f64;
            let gbs = bytes * m / 1e9;
            let test = if args.depth > 0 {
                format!("tg{} @ d{}", args.n_gen, args.depth)
            } else {
                format!("tg{}", args.n_gen)
            };
            outln!(
                "| {name} | {size} | {params} | {backend} | {threads} | {test} | {m:.2} ± {sd:.2} | {:.1} | {gbs:.2} | {:.0}% |",
                bytes / 1e6,
                100.0 * gbs * 1e9 / bw
            )?;
        }
        if args.audit {
            audit(&model, counts0, &mut next_token)?;
        }
        Ok(())
    }
}

/// The dispatch audit of `--audit`: launches per kernel since `before`, and in one more decode
/// step (after a warm-up step, so a recorded step is replayed).
fn audit<B: CliBackend>(
    model: &Model<B>,
    before: Option<Vec<(String, u64)>>,
    next_token: &mut impl FnMut() -> u32,
) -> anyhow::Result<()> {
    let (Some(before), Some(_)) = (before, model.backend().dispatch_counts()) else {
        outln!(
            "\ndispatch audit: the {} backend has no kernels of its own",
            model.backend().name()
        )?;
        return Ok(());
    };
    let run = model.backend().dispatch_counts().unwrap_or_default();
    let mut s = Session::new(model, 8)?;
    s.prefill(&[next_token(), next_token()])?;
    for _ in 0..2 {
        s.decode(next_token())?;
    }
    let pre = model.backend().dispatch_counts().unwrap_or_default();
    s.decode(next_token())?;
    let post = model.backend().dispatch_counts().unwrap_or_default();
    outln!(
        "\ndispatch audit (kernel | launches in the benchmark run | launches per decode step):"
    )?;
    let (mut never, mut per_step) = (Vec::new(), 0u64);
    for (((k, b), (_, r)), ((_, p0), (_, p1))) in before.iter().zip(&run).zip(pre.iter().zip(&post))
    {
        let (n, step) = (r - b, p1 - p0);
        per_step += step;
        if n == 0 {
            never.push(k.as_str());
        }
        outln!("| {k} | {n} | {step} |")?;
    }
    outln!("one decode step launches {per_step} kernels")?;
    if let Some(note) = model.backend().step_note() {
        outln!("decode step: {note}")?;
    }
    if never.is_empty() {
        outln!("every compiled kernel was dispatched by this run")?;
    } else {
        outln!(
            "never dispatched by this run ({}): {}",
            never.len(),
            never.join(", ")
        )?;
    }
    Ok(())
}

/// With `MUSER_PROFILE_DECODE=1`, opens (`on`) or closes the profiler's capture range around the
/// timed decode steps (`CliBackend::profiler_range`), so Nsight Compute run with
/// `--profile-from-start off` profiles decode launches only, not the prefill before them (which
/// launches some of the same kernels, thousands of times at depth).
fn profile_decode<B: CliBackend>(be: &B, on: bool) -> anyhow::Result<()> {
    if std::env::var("MUSER_PROFILE_DECODE").is_ok_and(|v| v == "1") {
        be.profiler_range(on)?;
    }
    Ok(())
}

/// `n` sessions decoding together: (mean, sd) of the aggregate tokens/s over the repetitions,
/// and the bytes one step reads (the weights once, each session's K/V at its mean context).
fn streams<B: CliBackend>(
    model: &Model<B>,
    n: usize,
    args: &Args,
    next_token: &mut impl FnMut() -> u32,
) -> anyhow::Result<(f64, f64, f64)> {
    // The contexts and their memory were checked by `check_memory`; the sessions are made first.
    let n_ctx = args.depth + STREAM_EXTRA_CTX + args.n_gen;
    let mut sessions = (0..n)
        .map(|_| Session::new(model, n_ctx))
        .collect::<muser_engine::Result<Vec<_>>>()?;
    // Prompts of different lengths, so the sequences sit at different positions.
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| token_ids(args.depth + 2 + i % 5, next_token))
        .collect::<anyhow::Result<_>>()?;
    let steps: Vec<Vec<u32>> = (0..args.n_gen)
        .map(|_| token_ids(n, next_token))
        .collect::<anyhow::Result<_>>()?;
    let mut group = DecodeGroup::new();
    let need = match (args.argmax, args.top_k) {
        (true, _) => Some(vec![RowNeed::Argmax; n]),
        (_, Some(k)) => Some(vec![RowNeed::TopK(k); n]),
        _ => None,
    };
    let mut rates = Vec::new();
    for rep in 0..=args.reps {
        for (s, p) in sessions.iter_mut().zip(&prompts) {
            s.reset();
            s.prefill(p)?;
        }
        profile_decode(model.backend(), true)?;
        let t = Instant::now();
        for toks in &steps {
            let mut members: Vec<&mut Session<B>> = sessions.iter_mut().collect();
            if let Some(need) = &need {
                std::hint::black_box(group.decode_rows(&mut members, toks, need)?);
            } else {
                group.decode(&mut members, toks)?;
            }
        }
        let dt = t.elapsed();
        profile_decode(model.backend(), false)?;
        if rep > 0 {
            rates.push((n * args.n_gen) as f64 / dt.as_secs_f64());
        }
    }
    let (m, sd) = mean_sd(&rates);
    let weights = model.decode_bytes(0) as f64;
    let kv: f64 = prompts
        .iter()
        .map(|p| (model.decode_bytes(p.len() + args.n_gen / 2) as f64) - weights)
        .sum();
    Ok((m, sd, weights + kv))
}
