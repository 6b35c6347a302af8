//! Writing f32 arrays as NumPy `.npy` files (format version 1.0, little-endian, C order).

use std::io::Write;
use std::path::Path;

/// Writes `data` (row-major, `shape.iter().product()` values) to `path` as a `<f4` array.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> anyhow::Result<()> {
    let n: usize = shape.iter().product();
    anyhow::ensure!(
        n == data.len(),
        "npy shape {shape:?} holds {n} values, got {}",
        data.len()
    );
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
    let pad = (64 - (10 + header.len() + 1) % 64) % 64;
    header.extend(std::iter::repeat_n(' ', pad));
    header.push('\n');
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?,
    );
    out.write_all(b"\x93NUMPY\x01\x00")?;
    out.write_all(&(header.len() as u16).to_le_bytes())?;
    out.write_all(header.as_bytes())?;
    for chunk in data.chunks(1 << 16) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        out.write_all(&bytes)?;
    }
    out.flush()?;
    Ok(())
}
