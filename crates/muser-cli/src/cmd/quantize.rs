//! `muser quantize IN OUT TYPE [--pure]`: quantizes the 2-D weights of a GGUF holding F32, F16
//! or BF16 tensors with the reference quantizers, carrying every metadata key over.
//!
//! Which tensors are quantized follows llama.cpp: tensors of two or more dimensions whose name
//! ends in "weight" and is not a norm ("_norm.weight"); 1-D tensors keep their type. With
//! `--pure` every such tensor gets TYPE. Without it, `output.weight` gets Q6_K (Q8_0 stays Q8_0),
//! and Q4_K_M is llama.cpp's mix for the tensors Muser knows: attn_v and ffn_down on the
//! "more bits" layers and output get Q6_K, the rest Q4_K. A row length that TYPE's block does
//! not divide falls back to Q8_0, then F16 (llama.cpp would pick Q5_0/Q5_1 for Q4_K/Q5_K, which
//! Muser does not implement).
//!
//! The output appears whole or not at all ([`OutFile`]): an error, a SIGINT (Ctrl-C), SIGTERM or
//! SIGHUP leaves neither it nor its temporary behind.

use crate::outfile::OutFile;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use muser_gguf::{GgmlType, GgufFile, GgufWriter, MetaValue, TensorInfo, TensorSpec};
use rayon::prelude::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Input GGUF (F32, F16 or BF16 weights).
    input: PathBuf,
    /// Output GGUF.
    output: PathBuf,
    /// Q8_0, Q4_K, Q5_K, Q6_K or Q4_K_M.
    #[arg(value_name = "TYPE")]
    ty: String,
    /// Every quantizable tensor gets TYPE (no per-tensor mix).
    #[arg(long)]
    pure: bool,
}

/// The target: one type everywhere, or the Q4_K_M mix.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Single(GgmlType),
    Q4KM,
}

impl Target {
    fn parse(s: &str) -> anyhow::Result<Target> {
        if s.eq_ignore_ascii_case("Q4_K_M") {
            return Ok(Target::Q4KM);
        }
        match GgmlType::from_name(s) {
            Some(t @ (GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)) => {
                Ok(Target::Single(t))
            }
            _ => anyhow::bail!(
                "unknown quantization type {s:?}: expected Q8_0, Q4_K, Q5_K, Q6_K or Q4_K_M"
            ),
        }
    }

    /// llama.cpp's `general.file_type` (llama_ftype) for this target.
    fn file_type(self) -> u32 {
        match self {
            Target::Q4KM => 15,
            Target::Single(GgmlType::Q8_0) => 7,
            Target::Single(GgmlType::Q4_K) => 14,
            Target::Single(GgmlType::Q5_K) => 16,
            Target::Single(_) => 18,
        }
    }
}

/// llama.cpp's "more bits" layers: the first and last eighth, and every third in between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer index of a `blk.N.` tensor.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The type a tensor is written with. `tied`: the file has no `output.weight`, so the token
/// embedding is the output matrix too and takes the output's type (as llama.cpp's quantizer
/// does).
fn choose_type(
    t: &TensorInfo,
    target: Target,
    pure: bool,
    n_layers: usize,
    tied: bool,
) -> GgmlType {
    let quantizable =
        t.dims.len() >= 2 && t.name.ends_with("weight") && !t.name.contains("_norm.weight");
    if !quantizable {
        return t.ggml_type;
    }
    let base = match target {
        Target::Single(ty) => ty,
        Target::Q4KM => GgmlType::Q4_K,
    };
    let wanted = if pure {
        base
    } else if t.name == "output.weight" || (tied && t.name == "token_embd.weight") {
        if base == GgmlType::Q8_0 {
            base
        } else {
            GgmlType::Q6_K
        }
    } else if target == Target::Q4KM
        && (t.name.contains("attn_v.weight") || t.name.contains("ffn_down.weight"))
        && layer_of(&t.name).is_some_and(|i| use_more_bits(i, n_layers))
    {
        GgmlType::Q6_K
    } else {
        base
    };
    // Fall back when the block does not divide the row.
    [wanted, GgmlType::Q8_0, GgmlType::F16]
        .into_iter()
        .find(|ty| t.n_cols().is_multiple_of(ty.block_size() as u64))
        .unwrap_or(GgmlType::F32)
}

/// Whether `a` and `b` name the same file (device and inode, so `./x`, a symlink or a hard link
/// to it count); false when either does not exist.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let target = Target::parse(&args.ty)?;
    // The input is memory-mapped while the output is written: writing over it would truncate
    // the mapped file under the reader (SIGBUS) and destroy the input.
    anyhow::ensure!(
        !same_file(&args.input, &args.output),
        "the output {} is the input file {}: write the quantized model to another file",
        args.output.display(),
        args.input.display()
    );
    let f = GgufFile::open(&args.input)?;
    for t in &f.tensors {
        anyhow::ensure!(
            matches!(t.ggml_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16),
            "tensor {} is {}: muser quantize takes F32, F16 or BF16 input",
            t.name,
            t.ggml_type
        );
    }
    let n_layers = f
        .tensors
        .iter()
        .filter_map(|t| layer_of(&t.name))
        .max()
        .map_or(0, |i| i + 1);
    let tied = !f.tensors.iter().any(|t| t.name == "output.weight");
    let types: Vec<GgmlType> = f
        .tensors
        .iter()
        .map(|t| choose_type(t, target, args.pure, n_layers, tied))
        .collect();

    let mut metadata: Vec<(String, MetaValue)> = f
        .metadata
        .iter()
        .filter(|(k, _)| k != "general.file_type" && k != "general.quantization_version")
        .cloned()
        .collect();
    metadata.push(("general.quantization_version".into(), MetaValue::U32(2)));
    metadata.push((
        "general.file_type".into(),
        MetaValue::U32(target.file_type()),
    ));
    let specs: Vec<TensorSpec> = f
        .tensors
        .iter()
        .zip(&types)
        .map(|(t, &ty)| TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: ty,
        })
        .collect();

    let total: u64 = f.tensors.iter().map(|t| t.n_elements()).sum();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{msg:>28} [{bar:40}] {percent:>3}% {elapsed} (eta {eta})")
            .unwrap()
            .progress_chars("=> "),
    );
    // Written to a temporary next to the output and renamed into place once complete.
    let out = OutFile::new(&args.output, Some(&bar))?;
    let (bytes_in, bytes_out) = write_output(&f, &metadata, &specs, out, &args.output, &bar)?;
    bar.finish_and_clear();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for ty in &types {
        *counts.entry(ty.name()).or_default() += 1;
    }
    eprintln!(
        "wrote {}: {:.2} MB -> {:.2} MB; tensors by type: {:?}",
        args.output.display(),
        bytes_in as f64 / 1e6,
        bytes_out as f64 / 1e6,
        counts
    );
    Ok(())
}

/// Writes every tensor, converted to its spec's type, to `out`'s temporary and renames it into
/// place; returns the bytes read and written.
fn write_output(
    f: &GgufFile,
    metadata: &[(String, MetaValue)],
    specs: &[TensorSpec],
    out: OutFile,
    output: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<(u64, u64)> {
    let mut w = GgufWriter::create(out.path(), metadata, specs)
        .with_context(|| format!("cannot write the output {}", output.display()))?;
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    for (t, spec) in f.tensors.iter().zip(specs) {
        bar.set_message(t.name.clone());
        let data = convert(f, t, spec.ggml_type).with_context(|| format!("tensor {}", t.name))?;
        w.write_tensor(&data)?;
        bytes_in += t.n_bytes;
        bytes_out += data.len() as u64;
        bar.inc(t.n_elements());
    }
    w.finish()?
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|file| file.sync_all())
        .with_context(|| format!("writing {}", out.path().display()))?;
    out.commit()?;
    Ok((bytes_in, bytes_out))
}

/// The tensor's bytes in type `ty`: rows dequantized to f32 and quantized again, in parallel.
/// Every value must be finite (a NaN or an infinity would be quantized into garbage, or copied
/// into a model that computes NaN): the error names the first one.
fn convert(f: &GgufFile, t: &TensorInfo, ty: GgmlType) -> anyhow::Result<Vec<u8>> {
    let src = f.tensor_data(t);
    let cols = t.n_cols() as usize;
    let rows = t.n_rows() as usize;
    let in_row = t.ggml_type.row_bytes(cols as u64).context("row length")? as usize;
    let same = ty == t.ggml_type;
    let out_row = if same {
        0
    } else {
        ty.row_bytes(cols as u64).context("row length")? as usize
    };
    // Row r checked (its values finite) and, unless the type stays, quantized into `dst`.
    let convert_row = |r: usize, dst: &mut [u8]| -> anyhow::Result<()> {
        let mut row = vec![0f32; cols];
        muser_quant::dequantize_row(t.ggml_type, &src[r * in_row..(r + 1) * in_row], &mut row)?;
        if let Some(c) = row.iter().position(|v| !v.is_finite()) {
            anyhow::bail!(
                "value {} at index {} (row {r}, column {c}) is not finite: muser quantize takes \
                 finite weights only",
                row[c],
                r as u64 * cols as u64 + c as u64
            );
        }
        if same {
            return Ok(());
        }
        muser_quant::quantize_row(ty, &row, dst)?;
        // Finite weights can still leave the new type's range (70,000 in F16, a block whose
        // scale overflows f16): refuse a row that would read back as inf or NaN.
        muser_quant::dequantize_row(ty, dst, &mut row)?;
        if let Some(c) = row.iter().position(|v| !v.is_finite()) {
            anyhow::bail!(
                "row {r}, column {c}: in {} this weight reads back as {} (too large for \
                 the type's f16 values or scales)",
                ty.name(),
                row[c]
            );
        }
        Ok(())
    };
    // The first failing row in order names the error.
    let mut out = vec![0u8; rows * out_row];
    let failed = if same {
        (0..rows)
            .into_par_iter()
            .map(|r| convert_row(r, &mut []))
            .find_first(Result::is_err)
    } else {
        out.par_chunks_mut(out_row.max(1))
            .enumerate()
            .take(rows)
            .map(|(r, dst)| convert_row(r, dst))
            .find_first(Result::is_err)
    };
    if let Some(Err(e)) = failed {
        return Err(e);
    }
    Ok(if same { src.to_vec() } else { out })
}
