//! The model's weights: every expected tensor is checked for presence, shape (dims, innermost
//! first) and type before the first token, with one error listing every problem by tensor name,
//! expected and found. Tensors reach the backend as zero-copy views into the file's mapping.

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use muser_gguf::{GgmlType, GgufFile};
use std::sync::Arc;

/// Where a tensor's bytes live: the mapped GGUF file, or memory (tests, converted tensors).
#[derive(Clone)]
pub enum ByteSource {
    File(Arc<GgufFile>),
    Owned(Arc<[u8]>),
}

/// A zero-copy view of one tensor: its name, type, dims and bytes.
#[derive(Clone)]
pub struct TensorView {
    pub name: String,
    pub ty: GgmlType,
    /// Innermost first: dims[0] is the row length.
    pub dims: Vec<u64>,
    source: ByteSource,
    start: usize,
    len: usize,
}

impl TensorView {
    /// A view of tensor `name` of `file` (which must hold it).
    pub fn from_file(file: &Arc<GgufFile>, name: &str) -> Option<TensorView> {
        let info = file.tensor(name)?;
        let data = file.tensor_data(info);
        let start = data.as_ptr() as usize - file.bytes().as_ptr() as usize;
        Some(TensorView {
            name: name.to_string(),
            ty: info.ggml_type,
            dims: info.dims.clone(),
            source: ByteSource::File(file.clone()),
            start,
            len: data.len(),
        })
    }

    /// A tensor held in memory (its byte count must match type and dims).
    pub fn owned(name: &str, ty: GgmlType, dims: &[u64], bytes: Vec<u8>) -> Result<TensorView> {
        let n: u64 = dims.iter().product();
        let expected = ty
            .row_bytes(dims.first().copied().unwrap_or(1))
            .map(|r| r * (n / dims.first().copied().unwrap_or(1).max(1)));
        if expected != Some(bytes.len() as u64) {
            return Err(EngineError::Invalid(format!(
                "tensor {name}: {ty} {dims:?} needs {expected:?} bytes, got {}",
                bytes.len()
            )));
        }
        let len = bytes.len();
        Ok(TensorView {
            name: name.to_string(),
            ty,
            dims: dims.to_vec(),
            source: ByteSource::Owned(bytes.into()),
            start: 0,
            len,
        })
    }

    /// For a view of a memory-mapped file: its pages leave the process's resident set
    /// (`GgufFile::release`), for a backend that has copied the bytes into a layout of its own.
    /// The bytes stay readable.
    pub fn release(&self) {
        if let ByteSource::File(f) = &self.source {
            f.release(self.start, self.len);
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.source {
            ByteSource::File(f) => &f.bytes()[self.start..self.start + self.len],
            ByteSource::Owned(b) => &b[self.start..self.start + self.len],
        }
    }

    /// Row length.
    pub fn cols(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }
    /// Number of rows (product of the outer dims).
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

/// Weights of one decoder layer. Optional tensors follow the architecture's switches.
pub struct LayerWeights<W> {
    pub attn_norm: W,              // (n_embd)
    pub wq: W,                     // (n_head*head_dim, n_embd)
    pub wk: W,                     // (n_head_kv*head_dim, n_embd)
    pub wv: W,                     // (n_head_kv*head_dim, n_embd)
    pub wgate: Option<W>,          // (n_head*head_dim, n_embd)       muse
    pub q_norm: Option<W>,         // (head_dim)                      muse, qwen3
    pub k_norm: Option<W>,         // (head_dim)                      muse, qwen3
    pub wo: W,                     // (n_embd, n_head*head_dim)
    pub post_attn_norm: Option<W>, // (n_embd)                     muse
    pub ffn_norm: W,               // (n_embd)
    pub ffn_gate: W,               // (n_ff, n_embd)
    pub ffn_up: W,                 // (n_ff, n_embd)
    pub ffn_down: W,               // (n_embd, n_ff)
    pub post_ffn_norm: Option<W>,  // (n_embd)                      muse
}

pub struct ModelWeights<W> {
    pub token_embd: W, // (n_vocab, n_embd)
    pub layers: Vec<LayerWeights<W>>,
    pub output_norm: W, // (n_embd)
    /// None when tied to token_embd.
    pub output: Option<W>, // (n_vocab, n_embd)
}

/// Types a matrix may have.
pub const MATRIX_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
/// Types a norm vector may have.
pub const VECTOR_TYPES: &[GgmlType] = &[GgmlType::F32, GgmlType::F16, GgmlType::BF16];

fn type_list(types: &[GgmlType]) -> String {
    types
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Collects every tensor problem before failing.
struct Checker<'a> {
    file: &'a Arc<GgufFile>,
    problems: Vec<String>,
}

impl Checker<'_> {
    fn get(&mut self, name: &str, dims: &[usize], types: &[GgmlType]) -> Option<TensorView> {
        let Some(v) = TensorView::from_file(self.file, name) else {
            self.problems
                .push(format!("{name}: missing (expected dims {dims:?})"));
            return None;
        };
        let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        if v.dims != want {
            self.problems.push(format!(
                "{name}: expected dims {want:?}, found {:?}",
                v.dims
            ));
            return None;
        }
        if !types.contains(&v.ty) {
            self.problems.push(format!(
                "{name}: type {} is not supported (supported: {})",
                v.ty,
                type_list(types)
            ));
            return None;
        }
        Some(v)
    }
}

impl<W> ModelWeights<W> {
    /// Checks every tensor the configuration expects, then makes each resident in `backend`.
    pub fn load<B: Backend<Weight = W>>(
        file: &Arc<GgufFile>,
        cfg: &ModelConfig,
        backend: &B,
    ) -> Result<ModelWeights<W>> {
        let views = check_tensors(file, cfg)?;
        let mut it = views.into_iter();
        let mut next = |present: bool| -> Result<Option<W>> {
            if !present {
                return Ok(None);
            }
            let v = it
                .next()
                .expect("check_tensors returns one view per expected tensor");
            backend.weight(&v).map(Some)
        };
        let a = &cfg.arch;
        let token_embd = next(true)?.unwrap();
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            layers.push(LayerWeights {
                attn_norm: next(true)?.unwrap(),
                wq: next(true)?.unwrap(),
                wk: next(true)?.unwrap(),
                wv: next(true)?.unwrap(),
                wgate: next(a.attn_gate)?,
                q_norm: next(a.qk_norm)?,
                k_norm: next(a.qk_norm)?,
                wo: next(true)?.unwrap(),
                post_attn_norm: next(a.post_norms)?,
                ffn_norm: next(true)?.unwrap(),
                ffn_gate: next(true)?.unwrap(),
                ffn_up: next(true)?.unwrap(),
                ffn_down: next(true)?.unwrap(),
                post_ffn_norm: next(a.post_norms)?,
            });
        }
        let output_norm = next(true)?.unwrap();
        let output = next(!cfg.tied_output)?;
        backend.weights_loaded();
        Ok(ModelWeights {
            token_embd,
            layers,
            output_norm,
            output,
        })
    }
}

/// The expected tensors in load order (the order `ModelWeights::load` consumes them), each checked
/// for presence, dims and type. Errors list every problem.
pub fn check_tensors(file: &Arc<GgufFile>, cfg: &ModelConfig) -> Result<Vec<TensorView>> {
    let mut c = Checker {
        file,
        problems: Vec::new(),
    };
    let (e, qw, kvw, hd, ff, nv) = (
        cfg.n_embd,
        cfg.q_width(),
        cfg.kv_width(),
        cfg.head_dim,
        cfg.n_ff,
        cfg.n_vocab,
    );
    let (m, v) = (MATRIX_TYPES, VECTOR_TYPES);
    let a = &cfg.arch;
    let mut views = Vec::new();
    let mut want = |c: &mut Checker, name: String, dims: &[usize], types: &[GgmlType]| {
        if let Some(t) = c.get(&name, dims, types) {
            views.push(t);
        }
    };
    want(&mut c, "token_embd.weight".into(), &[e, nv], m);
    for i in 0..cfg.n_layer {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        want(&mut c, p("attn_norm"), &[e], v);
        want(&mut c, p("attn_q"), &[e, qw], m);
        want(&mut c, p("attn_k"), &[e, kvw], m);
        want(&mut c, p("attn_v"), &[e, kvw], m);
        if a.attn_gate {
            want(&mut c, p("attn_gate"), &[e, qw], m);
        }
        if a.qk_norm {
            want(&mut c, p("attn_q_norm"), &[hd], v);
            want(&mut c, p("attn_k_norm"), &[hd], v);
        }
        want(&mut c, p("attn_output"), &[qw, e], m);
        if a.post_norms {
            want(&mut c, p("post_attention_norm"), &[e], v);
        }
        want(&mut c, p("ffn_norm"), &[e], v);
        want(&mut c, p("ffn_gate"), &[e, ff], m);
        want(&mut c, p("ffn_up"), &[e, ff], m);
        want(&mut c, p("ffn_down"), &[ff, e], m);
        if a.post_norms {
            want(&mut c, p("post_ffw_norm"), &[e], v);
        }
    }
    want(&mut c, "output_norm.weight".into(), &[e], v);
    if !cfg.tied_output {
        want(&mut c, "output.weight".into(), &[e, nv], m);
    }
    if !c.problems.is_empty() {
        let total = c.problems.len();
        let mut problems: Vec<String> = c.problems.into_iter().take(12).collect();
        if total > 12 {
            problems.push(format!("... and {} more", total - 12));
        }
        return Err(EngineError::Tensors {
            arch: a.name.to_string(),
            problems,
        });
    }
    Ok(views)
}
