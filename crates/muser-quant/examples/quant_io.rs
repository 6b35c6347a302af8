//! File-level access to the reference (de)quantizers, for the Python oracle tests
//! (tests/python/test_quant_oracle.py). Files are raw little-endian: blocks as ggml stores them,
//! values as f32.
//!
//!   quant_io dequant TYPE in.bin out.f32   # in.bin: whole blocks of TYPE
//!   quant_io quant   TYPE in.f32 out.bin   # in.f32: a multiple of TYPE's block size of f32s

use muser_quant::{dequantize_row, quantize_row, GgmlType};

fn run(args: &[String]) -> Result<(), String> {
    let [cmd, ty, input, output] = args else {
        return Err("usage: quant_io (dequant|quant) TYPE IN OUT".into());
    };
    let ty = GgmlType::from_name(ty).ok_or_else(|| format!("unknown type {ty}"))?;
    let data = std::fs::read(input).map_err(|e| format!("{input}: {e}"))?;
    let (block, size) = ty.block_layout();
    let out: Vec<u8> = match cmd.as_str() {
        "dequant" => {
            if data.len() % size != 0 {
                return Err(format!(
                    "{input}: {} bytes is not whole {ty} blocks of {size}",
                    data.len()
                ));
            }
            let mut y = vec![0f32; data.len() / size * block];
            dequantize_row(ty, &data, &mut y).map_err(|e| e.to_string())?;
            y.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        "quant" => {
            if data.len() % 4 != 0 {
                return Err(format!("{input}: {} bytes is not whole f32s", data.len()));
            }
            let x: Vec<f32> = data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let n_bytes = ty.row_bytes(x.len() as u64).ok_or_else(|| {
                format!("{} values are not whole {ty} blocks of {block}", x.len())
            })?;
            let mut y = vec![0u8; n_bytes as usize];
            quantize_row(ty, &x, &mut y).map_err(|e| e.to_string())?;
            y
        }
        other => return Err(format!("unknown command {other} (dequant or quant)")),
    };
    std::fs::write(output, out).map_err(|e| format!("{output}: {e}"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("quant_io: {e}");
        std::process::exit(1);
    }
}
