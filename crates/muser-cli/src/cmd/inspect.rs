//! `muser inspect FILE`: metadata (long arrays summarised) and the tensor table.

use muser_gguf::{GgufFile, MetaValue};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file.
    file: PathBuf,
    /// Show arrays up to this many elements in full (longer ones are summarised).
    #[arg(long, default_value_t = 8)]
    max_array: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let f = GgufFile::open(&args.file)?;
    let mut o = String::new();
    let total: u64 = f.tensors.iter().map(|t| t.n_bytes).sum();
    let params: u64 = f.tensors.iter().map(|t| t.n_elements()).sum();
    writeln!(
        o,
        "{}: GGUF v{}, {} metadata keys, {} tensors, {} parameters, {} bytes of tensor data, alignment {}",
        args.file.display(),
        f.version,
        f.metadata.len(),
        f.tensors.len(),
        params,
        total,
        f.alignment
    )?;
    writeln!(o, "\nmetadata:")?;
    for (key, value) in &f.metadata {
        writeln!(o, "  {key} = {}", show(value, args.max_array))?;
    }
    writeln!(o, "\ntensors:")?;
    let w = f
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        o,
        "  {:<w$}  {:<7}  {:<24}  {:>14}  {:>14}",
        "name", "type", "shape", "bytes", "offset"
    )?;
    for t in &f.tensors {
        let shape = format!("{:?}", t.dims);
        writeln!(
            o,
            "  {:<w$}  {:<7}  {:<24}  {:>14}  {:>14}",
            t.name,
            t.ggml_type.name(),
            shape,
            t.n_bytes,
            t.offset
        )?;
    }
    // A closed pipe (`muser inspect F | head`) is an error, as in every command (`outln!`).
    std::io::stdout().lock().write_all(o.as_bytes())?;
    Ok(())
}

/// One value in a line; arrays longer than `max` show their first and last elements.
fn show(v: &MetaValue, max: usize) -> String {
    match v {
        MetaValue::String(s) => format!("{:?}", truncate(s, 200)),
        MetaValue::Array(ty, items) => {
            let shown: Vec<String> = if items.len() <= max {
                items.iter().map(|x| show(x, max)).collect()
            } else {
                let mut s: Vec<String> = items[..max / 2].iter().map(|x| show(x, max)).collect();
                s.push(format!("... {} more ...", items.len() - max / 2 - 1));
                s.push(show(&items[items.len() - 1], max));
                s
            };
            format!("[{ty:?}; {}] [{}]", items.len(), shown.join(", "))
        }
        MetaValue::U8(x) => x.to_string(),
        MetaValue::I8(x) => x.to_string(),
        MetaValue::U16(x) => x.to_string(),
        MetaValue::I16(x) => x.to_string(),
        MetaValue::U32(x) => x.to_string(),
        MetaValue::I32(x) => x.to_string(),
        MetaValue::U64(x) => x.to_string(),
        MetaValue::I64(x) => x.to_string(),
        MetaValue::F32(x) => x.to_string(),
        MetaValue::F64(x) => x.to_string(),
        MetaValue::Bool(x) => x.to_string(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}
