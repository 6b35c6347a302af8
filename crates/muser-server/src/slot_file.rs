//! A slot's cache in a file (`POST /slots/{id}?action=save|restore`, llama-server's, under
//! `--slot-save-path`): the tokens a slot holds and their KV cache entries, to be taken back by
//! a later server of the same model.
//!
//! Layout: the 8 bytes `MUSERKV1`, a u64 (little-endian) byte length, that many bytes of JSON
//! (`n_vocab`, `n` positions, and per layer `n_head`, `n_head_kv`, `head_dim`, `window`, `slots`),
//! the n tokens as u32, then per layer its K and V values as f16 bits (u16), each
//! `[len][n_head_kv * head_dim]` with len the layer's slots kept (`KvLayerSpec::prefix_slots`),
//! all little-endian. Every backend writes and reads the same layout (`KvHost`).

use muser_engine::backend::{KvHost, KvLayerSpec};
use muser_engine::Snapshot;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"MUSERKV1";
/// The longest JSON header read (a model of thousands of layers stays far below).
const MAX_HEADER: u64 = 1 << 24;

/// Whether `name` may name a file in the save directory: a plain name, no path.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', ':'])
        && !name.chars().any(char::is_control)
}

/// Writes `tokens` (the positions `snap` holds) and `snap` to `path`; the bytes written.
pub fn write(path: &Path, tokens: &[u32], snap: &Snapshot, n_vocab: usize) -> std::io::Result<u64> {
    let layers: Vec<Value> = snap
        .specs()
        .iter()
        .map(|s| {
            json!({"n_head": s.n_head, "n_head_kv": s.n_head_kv, "head_dim": s.head_dim,
                   "window": s.window, "slots": s.slots})
        })
        .collect();
    let header = json!({"n_vocab": n_vocab, "n": tokens.len(), "layers": layers}).to_string();
    let mut out = Vec::with_capacity(16 + header.len() + 4 * tokens.len() + snap.bytes());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for [k, v] in &snap.host().layers {
        for x in k.iter().chain(v) {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    // Written whole under another name, then renamed: a reader never sees half a file.
    let part = path.with_extension("part");
    std::fs::File::create(&part)?.write_all(&out)?;
    std::fs::rename(&part, path)?;
    Ok(out.len() as u64)
}

/// Reads a slot file: its snapshot, tokens, the vocabulary size it was written for and its
/// bytes; an error naming what is wrong with it.
pub fn read(path: &Path) -> Result<(Snapshot, Vec<u32>, usize, u64), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut r = std::io::BufReader::new(file);
    let mut magic = [0u8; 8];
    let short = |e: std::io::Error| format!("it ends early ({e})");
    r.read_exact(&mut magic).map_err(short)?;
    if &magic != MAGIC {
        return Err("it is not a Muser slot file (no MUSERKV1 at its start)".into());
    }
    let mut len = [0u8; 8];
    r.read_exact(&mut len).map_err(short)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER.min(size) {
        return Err(format!("its header claims {len} bytes"));
    }
    let mut header = vec![0u8; len as usize];
    r.read_exact(&mut header).map_err(short)?;
    let h: Value =
        serde_json::from_slice(&header).map_err(|e| format!("its header is not JSON: {e}"))?;
    let field = |v: &Value, k: &str| -> Result<usize, String> {
        v[k].as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| format!("its header has no integer {k}"))
    };
    let (n_vocab, n) = (field(&h, "n_vocab")?, field(&h, "n")?);
    let specs = h["layers"]
        .as_array()
        .ok_or("its header has no layers")?
        .iter()
        .map(|l| {
            Ok(KvLayerSpec {
                n_head: field(l, "n_head")?,
                n_head_kv: field(l, "n_head_kv")?,
                head_dim: field(l, "head_dim")?,
                window: l["window"].as_u64().map(|w| w as usize),
                slots: field(l, "slots")?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    // What the rest must hold, checked against the file's size before anything is allocated.
    let values: Option<u64> = specs.iter().try_fold(0u64, |sum, s| {
        let per = s
            .prefix_slots(n)
            .checked_mul(s.n_head_kv)?
            .checked_mul(s.head_dim)?;
        sum.checked_add(2 * 2 * per as u64)
    });
    let want = values
        .and_then(|v| v.checked_add(4 * n as u64))
        .and_then(|v| v.checked_add(16 + len));
    if want != Some(size) {
        return Err(format!(
            "its size ({size} bytes) is not what its header describes ({})",
            want.map_or("more than 2^64".into(), |w| format!("{w} bytes"))
        ));
    }
    let mut tokens = vec![0u32; n];
    let mut buf = [0u8; 4];
    for t in &mut tokens {
        r.read_exact(&mut buf).map_err(short)?;
        *t = u32::from_le_bytes(buf);
    }
    let mut layers = Vec::with_capacity(specs.len());
    for s in &specs {
        let per = s.prefix_slots(n) * s.n_head_kv * s.head_dim;
        let mut kv = [vec![0u16; per], vec![0u16; per]];
        for plane in &mut kv {
            let mut bytes = vec![0u8; 2 * per];
            r.read_exact(&mut bytes).map_err(short)?;
            for (x, b) in plane.iter_mut().zip(bytes.chunks_exact(2)) {
                *x = u16::from_le_bytes([b[0], b[1]]);
            }
        }
        layers.push(kv);
    }
    let snap = Snapshot::from_parts(specs, n, KvHost { layers });
    Ok((snap, tokens, n_vocab, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use muser_engine::{LoadOptions, Model, Session};

    #[test]
    fn a_slot_file_reads_back_what_was_written_and_a_damaged_one_is_named() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let m = Model::load(root.join("muse-default.gguf"), &LoadOptions::default()).unwrap();
        let nv = m.config.n_vocab;
        let mut rng = 0x51_07_f1_1eu64;
        let tokens: Vec<u32> = (0..90)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % nv as u64) as u32
            })
            .collect();
        let mut s = Session::new(&m, 256).unwrap();
        s.prefill(&tokens).unwrap();
        let snap = s.save(tokens.len()).unwrap();
        let dir = std::env::temp_dir().join(format!("muser-slot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.bin");
        let written = write(&path, &tokens, &snap, nv).unwrap();
        let (back, toks, vocab, read_bytes) = read(&path).unwrap();
        assert_eq!((toks, vocab, read_bytes), (tokens.clone(), nv, written));
        assert_eq!(back.specs(), snap.specs());
        assert_eq!(back.host(), snap.host());
        // cut short, or one byte more: named by size; not a slot file: named
        let bytes = std::fs::read(&path).unwrap();
        for (i, damaged) in [
            &bytes[..bytes.len() - 1],
            &[&bytes[..], &[0u8]].concat()[..],
        ]
        .into_iter()
        .enumerate()
        {
            let p = dir.join(format!("d{i}.bin"));
            std::fs::write(&p, damaged).unwrap();
            let e = read(&p).err().unwrap();
            assert!(e.contains("size"), "{e}");
        }
        std::fs::write(dir.join("x.bin"), b"GGUF....").unwrap();
        assert!(read(&dir.join("x.bin"))
            .err()
            .unwrap()
            .contains("not a Muser slot file"));
        std::fs::remove_dir_all(&dir).unwrap();
        for (name, ok) in [
            ("a.bin", true),
            ("../a", false),
            (".hidden", false),
            ("", false),
            ("a/b", false),
            ("c:d", false),
            ("tab\there", false),
        ] {
            assert_eq!(valid_name(name), ok, "{name:?}");
        }
    }
}
