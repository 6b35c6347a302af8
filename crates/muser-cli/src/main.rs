//! `muser`: the command-line interface. Each subcommand lives in `cmd/<name>.rs` with its own
//! clap `Args` struct and a `run` function.

#[macro_use]
mod out;

mod cmd;
mod npy;
mod outfile;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "muser",
    version,
    about = "Muser: a GGUF inference engine for K-quant models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it.
    Run(cmd::run::Args),
    /// Write the logits of every position to a .npy file.
    Logits(cmd::logits::Args),
    /// Measure prompt processing and decode speed (llama-bench's table, plus bandwidth).
    Bench(cmd::bench::Args),
    /// Perplexity of a text file, following llama-perplexity's method.
    Perplexity(cmd::perplexity::Args),
    /// Print a GGUF file's metadata and tensor table.
    Inspect(cmd::inspect::Args),
    /// Dequantize one tensor to f32 and write it as .npy.
    Tensor(cmd::tensor::Args),
    /// Quantize a GGUF of F32/F16/BF16 weights.
    Quantize(cmd::quantize::Args),
    /// Write a synthetic model from a preset.
    Synth(cmd::synth::Args),
    /// Check a backend's kernels against the CPU reference kernels.
    Check(cmd::check::Args),
    /// Compile the CUDA kernels into the kernel cache ahead of time (no GPU needed).
    Kernels(cmd::kernels::Args),
    /// Print the token ids of a text.
    Tokenize(cmd::tokenize::Args),
    /// Serve the OpenAI API (completions, chat, streaming) with continuous batching.
    Serve(cmd::serve::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Logits(a) => cmd::logits::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Tensor(a) => cmd::tensor::run(a),
        Command::Quantize(a) => cmd::quantize::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Kernels(a) => cmd::kernels::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Serve(a) => cmd::serve::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
