//! `muser logits`: the logits of every position of a token sequence, written as a `.npy` file
//! of f32, shape [n_tokens, n_vocab].

use anyhow::{bail, Context};
use muser_engine::Session;
use muser_tokenizer::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
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

/// Writes a little-endian f32 array of `shape` as NumPy .npy version 1.0.
pub fn write_npy(path: &Path, shape: &[usize], data: &[f32]) -> anyhow::Result<()> {
    assert_eq!(shape.iter().product::<usize>(), data.len());
    let dims = shape.iter().map(|d| d.to_string()).collect::<Vec<_>>();
    let shape_txt = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.div_ceil(64) * 64 - total));
    header.push('\n');
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for v in data {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()?;
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::run::resolve_model(args.model.as_deref())?;
    let model = super::run::load_model(&path, args.threads)?;
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
    let logits = s.prefill_all(&tokens)?;
    write_npy(&args.out, &[tokens.len(), model.config.n_vocab], &logits)?;
    eprintln!(
        "wrote {} ({} x {})",
        args.out.display(),
        tokens.len(),
        model.config.n_vocab
    );
    Ok(())
}
