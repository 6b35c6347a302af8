//! `muser tokenize`: the token ids of a prompt under a GGUF file's tokenizer. Reads only the
//! file's metadata, so a tokenizer-only GGUF (no tensors) works.

use muser_gguf::GgufFile;
use muser_tokenizer::{StreamDecoder, Tokenizer};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file whose `tokenizer.ggml.*` metadata define the tokenizer.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Text to tokenize.
    #[arg(short = 'p', long, allow_hyphen_values = true)]
    prompt: String,
    /// Print one line per token: id, stored text, and the bytes it decodes to.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Do not add BOS/EOS even where the file asks for them.
    #[arg(long)]
    no_add_special: bool,
    /// Let control tokens written in the prompt (e.g. `<|eot_id|>`) become those tokens.
    #[arg(long)]
    parse_special: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = GgufFile::open(&args.model)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&args.prompt, !args.no_add_special, args.parse_special);
    if args.verbose {
        let mut stream = StreamDecoder::new();
        for &id in &ids {
            let piece = String::from_utf8_lossy(tok.token_to_piece_bytes(id)?).into_owned();
            let shown = stream.push(&tok, id)?;
            outln!(
                "{id:>8}  {:<24} {piece:?} -> {shown:?}",
                format!("{:?}", tok.token_text(id)?)
            )?;
        }
        outln!("{} tokens", ids.len())?;
    } else {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        outln!("{}", ids.join(" "))?;
    }
    Ok(())
}
