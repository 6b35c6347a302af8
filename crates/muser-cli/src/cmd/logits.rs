//! `muser logits`: the logits of every position of a token sequence, written as a `.npy` file
//! of f32, shape [n_tokens, n_vocab]: from one prefill, or (`--decode`) from one decode step per
//! token, the path generation takes.

use super::backend::{CliBackend, ModelJob};
use anyhow::{bail, Context};
use muser_engine::{Model, Session};
use muser_tokenizer::Tokenizer;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Comma-separated token ids.
    #[arg(long, conflicts_with = "prompt")]
    pub tokens: Option<String>,
    /// Text, tokenized with the model's tokenizer (BOS as the model asks).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Output .npy path.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
    /// Backend: auto (CUDA when a GPU is usable), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend::BackendKind::Auto)]
    pub backend: super::backend::BackendKind,
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// One decode step per token (the kernels generation runs) instead of one prefill.
    #[arg(long)]
    pub decode: bool,
}

fn parse_tokens(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("bad token id {t:?} in --tokens"))
        })
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::run::resolve_model(args.model.as_deref())?;
    super::backend::with_model(&path, args.backend, args.threads, args)
}

impl ModelJob for Args {
    fn run<B: CliBackend>(self, model: Model<B>) -> anyhow::Result<()> {
        let args = self;
        let tokens = match (&args.tokens, &args.prompt) {
            (Some(t), None) => parse_tokens(t)?,
            (None, Some(p)) => Tokenizer::from_gguf(model.gguf())
                .context("reading the tokenizer")?
                .encode(p, true, true),
            _ => bail!("give exactly one of --tokens and -p"),
        };
        if tokens.is_empty() {
            bail!("no tokens");
        }
        let mut s = Session::new(&model, tokens.len())?;
        let logits = if args.decode {
            let mut all = Vec::with_capacity(tokens.len() * model.config.n_vocab);
            for &t in &tokens {
                all.extend_from_slice(s.decode(t)?);
            }
            all
        } else {
            s.prefill_all(&tokens)?
        };
        crate::npy::write_f32(&args.out, &[tokens.len(), model.config.n_vocab], &logits)?;
        eprintln!(
            "wrote {} ({} x {})",
            args.out.display(),
            tokens.len(),
            model.config.n_vocab
        );
        Ok(())
    }
}
