//! `muser perplexity`: perplexity of a text file following llama-perplexity's method: the whole
//! file tokenized once (BOS as the model asks), cut into chunks of n_ctx tokens whose first token
//! is replaced by BOS, each chunk evaluated from an empty cache, and only the second half of each
//! chunk scored (each position predicting the next token). Prints the running perplexity after
//! each chunk and the final estimate with its uncertainty as llama.cpp computes it.

use super::backend::{CliBackend, ModelJob};
use anyhow::{bail, Context};
use muser_engine::{Model, Session};
use muser_tokenizer::Tokenizer;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Text file.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx_size: usize,
    /// Evaluate at most this many chunks (default: all).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Backend: auto (CUDA when a GPU is usable), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend::BackendKind::Auto)]
    pub backend: super::backend::BackendKind,
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

/// -log softmax(logits)[target], computed in f64.
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.chunks != Some(0), "--chunks: at least 1 chunk");
    let path = super::run::resolve_model(args.model.as_deref())?;
    super::backend::with_model(&path, args.backend, args.threads, args)
}

impl ModelJob for Args {
    fn run<B: CliBackend>(self, model: Model<B>) -> anyhow::Result<()> {
        let args = self;
        let tok = Tokenizer::from_gguf(model.gguf()).context("reading the tokenizer")?;
        let text = std::fs::read(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?;
        let tokens = tok.encode_bytes(&text, true, false);
        let n_ctx = args.ctx_size;
        if n_ctx < 4 {
            bail!("context of {n_ctx} tokens is too small (at least 4)");
        }
        // Two chunks at least (2 * n_ctx counted in u128: it can pass usize).
        if (tokens.len() as u128) < 2 * n_ctx as u128 {
            bail!(
                "you need at least {} tokens to evaluate perplexity with a context of {n_ctx}; the file has {}",
                2 * n_ctx as u128,
                tokens.len()
            );
        }
        let mut n_chunk = tokens.len() / n_ctx;
        if let Some(c) = args.chunks {
            n_chunk = n_chunk.min(c);
        }
        let nv = model.config.n_vocab;
        let first = n_ctx / 2;
        eprintln!(
            "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring the last {} of each",
            tokens.len(),
            n_ctx - 1 - first
        );

        let mut s = Session::new(&model, n_ctx)?;
        let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
        let t0 = Instant::now();
        let mut out = std::io::stdout().lock();
        for i in 0..n_chunk {
            let start = i * n_ctx;
            let mut chunk = tokens[start..start + n_ctx].to_vec();
            if tok.add_bos() {
                if let Some(bos) = tok.bos() {
                    chunk[0] = bos;
                }
            }
            s.reset();
            let logits = s.prefill_all(&chunk)?;
            for j in first..n_ctx - 1 {
                let v = nll(&logits[j * nv..(j + 1) * nv], tokens[start + j + 1]);
                sum += v;
                sum2 += v * v;
                count += 1;
            }
            if i == 0 {
                let per = t0.elapsed().as_secs_f64();
                eprintln!(
                    "{:.2} seconds per pass - ETA {:.1} minutes",
                    per,
                    per * n_chunk as f64 / 60.0
                );
            }
            write!(out, "[{}]{:.4},", i + 1, (sum / count as f64).exp())?;
            out.flush()?;
        }
        writeln!(out)?;
        let mean = sum / count as f64;
        let ppl = mean.exp();
        let var = sum2 / count as f64 - mean * mean;
        let unc = if var > 0.0 && count > 1 {
            (var / (count - 1) as f64).sqrt() * ppl
        } else {
            0.0
        };
        writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {unc:.5}")?;
        Ok(())
    }
}
