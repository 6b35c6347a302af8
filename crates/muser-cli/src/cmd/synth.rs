//! `muser synth PRESET OUT [--seed N]`: write a synthetic model; `muser synth --list` lists the
//! presets with their sizes. The model appears whole or not at all (an error or a Ctrl-C leaves
//! nothing behind).

use crate::outfile::OutFile;
use anyhow::Context;
use muser_synth::{find_preset, parameter_count, synthesize, weight_bytes, PRESETS};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The preset (see --list).
    #[arg(required_unless_present = "list")]
    preset: Option<String>,
    /// The GGUF file to write.
    #[arg(required_unless_present = "list")]
    out: Option<PathBuf>,
    /// Seed of the weights; the file is a pure function of (preset, seed).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// List the presets and exit.
    #[arg(long)]
    list: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.list {
        outln!(
            "{:<14} {:>8} {:>16} {:>16}  description",
            "preset",
            "arch",
            "parameters",
            "weight bytes"
        )?;
        for p in PRESETS {
            outln!(
                "{:<14} {:>8} {:>16} {:>16}  {}",
                p.name,
                p.arch.name(),
                parameter_count(p),
                weight_bytes(p),
                p.description
            )?;
        }
        return Ok(());
    }
    let (name, out) = (
        args.preset.expect("clap requires it"),
        args.out.expect("clap requires it"),
    );
    let p = find_preset(&name)?;
    let start = Instant::now();
    // Written to a temporary next to OUT and renamed into place once complete: an error or a
    // Ctrl-C never leaves a truncated model behind.
    let file = OutFile::new(&out, None)?;
    let s = synthesize(p, file.path(), args.seed, std::io::stderr().is_terminal())
        .with_context(|| format!("cannot write the model {}", out.display()))?;
    file.commit()?;
    let secs = start.elapsed().as_secs_f64();
    outln!(
        "wrote {} ({}, seed {}): {} tensors, {} parameters, {} bytes of weights in {:.1} s ({:.2} GB/s)",
        out.display(),
        p.name,
        args.seed,
        s.n_tensors,
        s.parameters,
        s.weight_bytes,
        secs,
        s.weight_bytes as f64 / secs / 1e9
    )?;
    Ok(())
}
