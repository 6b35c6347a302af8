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

/// The ids of `--tokens`: comma-separated, spaces around an id allowed; an empty item (`1,,2`,
/// a trailing comma) is an error, as is anything that is not an id.
fn parse_tokens(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, t)| {
            anyhow::ensure!(
                !t.is_empty(),
                "--tokens {s:?}: item {} is empty (expected comma-separated token ids, e.g. 1,15043,29871)",
                i + 1
            );
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

#[cfg(test)]
mod tests {
    use super::parse_tokens;

    #[test]
    fn token_lists_parse_and_empty_items_are_refused() {
        assert_eq!(
            parse_tokens("1,15043, 29871 ").unwrap(),
            vec![1, 15043, 29871]
        );
        for (bad, says) in [
            ("1,,2", "item 2 is empty"),
            ("1,2,", "item 3 is empty"),
            ("", "item 1 is empty"),
            (" , 3", "item 1 is empty"),
            ("1,x", "bad token id \"x\""),
            ("4294967296", "bad token id"),
        ] {
            let e = format!("{:#}", parse_tokens(bad).unwrap_err());
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
