//! `muser tensor FILE NAME --out X.npy`: one tensor dequantized to f32, GGUF dims reversed
//! (a matrix of GGUF dims [cols, rows] is written as shape [rows, cols]).

use muser_gguf::GgufFile;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file.
    file: PathBuf,
    /// The tensor's name, e.g. blk.0.attn_q.weight.
    name: String,
    /// The .npy file to write.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let f = GgufFile::open(&args.file)?;
    let Some(t) = f.tensor(&args.name) else {
        anyhow::bail!(
            "{} has no tensor named {:?} ({} tensors; `muser inspect` lists them)",
            args.file.display(),
            args.name,
            f.tensors.len()
        );
    };
    let cols = t.n_cols() as usize;
    let rows = t.n_rows() as usize;
    let row_bytes = t.n_bytes as usize / rows.max(1);
    let data = f.tensor_data(t);
    let mut out = vec![0f32; rows * cols];
    for (r, dst) in out
        .chunks_mut(cols.max(1))
        .enumerate()
        .take(rows * cols.min(1))
    {
        muser_quant::dequantize_row(t.ggml_type, &data[r * row_bytes..(r + 1) * row_bytes], dst)
            .map_err(|e| anyhow::anyhow!("tensor {}: {e}", t.name))?;
    }
    let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
    crate::npy::write_f32(&args.out, &shape, &out)?;
    eprintln!(
        "wrote {} ({} {:?} -> f32 {:?})",
        args.out.display(),
        t.ggml_type,
        t.dims,
        shape
    );
    Ok(())
}
