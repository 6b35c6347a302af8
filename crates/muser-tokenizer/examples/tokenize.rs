//! The `muser tokenize` subcommand as a standalone binary, so the tokenizer can be driven (and
//! tested against HF `tokenizers`) without building the whole CLI:
//! `cargo run -p muser-tokenizer --example tokenize -- -m model.gguf -p "text" [-v]`.

#[macro_use]
#[path = "../../muser-cli/src/out.rs"]
mod out;
#[path = "../../muser-cli/src/cmd/tokenize.rs"]
mod tokenize;

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tokenize::Args,
}

fn main() -> anyhow::Result<()> {
    tokenize::run(Cli::parse().args)
}
