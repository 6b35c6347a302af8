//! Model configuration: one decoder-layer template whose switches (entry norm, sandwich post-norms,
//! QK norm, sigmoid output gate, RoPE style and the layers it applies to, sliding pattern and
//! window, logit scale, softcap, tied output) describe every supported architecture. An
//! architecture is a row in `ARCHITECTURES` plus hyper-parameters read from GGUF metadata.
//!
//! This module reads metadata only; it never looks at tensor data.

use crate::error::{EngineError, Result};
use muser_gguf::{GgufFile, MetaValue};

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-J / ggml's ROPE_TYPE_NORM: pairs (x[2i], x[2i+1]).
    Interleaved,
    /// GPT-NeoX: pairs (x[i], x[i + n_rot/2]).
    Neox,
}

/// Which layers attend over a sliding window (the others attend over every past position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlidingPattern {
    /// Every layer is full attention with RoPE.
    None,
    /// Layer i is a full-attention layer without RoPE (NoPE) iff (i+1) % interval == 0; the
    /// others slide over `sliding_window` positions with RoPE (muse).
    NopeFullEvery,
}

/// The architecture-level switches of the decoder template.
#[derive(Debug, Clone, Copy)]
pub struct ArchTemplate {
    pub name: &'static str,
    /// rmsnorm (weight ones) of the embedding before the first layer.
    pub entry_norm: bool,
    /// post_attention_norm and post_ffw_norm on the residual branches (sandwich norms).
    pub post_norms: bool,
    /// Per-head rmsnorm of q and k (attn_q_norm, attn_k_norm) before RoPE.
    pub qk_norm: bool,
    /// attn * sigmoid(W_gate x) before the output projection.
    pub attn_gate: bool,
    pub rope_style: RopeStyle,
    pub sliding: SlidingPattern,
    /// Untied output is required (`output.weight` must exist); otherwise it is optional.
    pub output_required: bool,
}

/// The supported architectures, keyed by `general.architecture`.
pub const ARCHITECTURES: &[ArchTemplate] = &[
    ArchTemplate {
        name: "muse",
        entry_norm: true,
        post_norms: true,
        qk_norm: true,
        attn_gate: true,
        rope_style: RopeStyle::Interleaved,
        sliding: SlidingPattern::NopeFullEvery,
        output_required: true,
    },
    ArchTemplate {
        name: "llama",
        entry_norm: false,
        post_norms: false,
        qk_norm: false,
        attn_gate: false,
        rope_style: RopeStyle::Interleaved,
        sliding: SlidingPattern::None,
        output_required: false,
    },
    ArchTemplate {
        name: "qwen3",
        entry_norm: false,
        post_norms: false,
        qk_norm: true,
        attn_gate: false,
        rope_style: RopeStyle::Neox,
        sliding: SlidingPattern::None,
        output_required: false,
    },
];

/// What one layer does differently from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKind {
    /// Attends over the last `sliding_window` positions only.
    pub sliding: bool,
    /// Rotates q and k.
    pub rope: bool,
}

/// RoPE parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    pub style: RopeStyle,
    pub freq_base: f32,
    /// Rotated dimensions per head (the first `n_rot`; the rest pass through).
    pub n_rot: usize,
}

/// Everything the graph needs to know about a model, read from metadata.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: ArchTemplate,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    /// Training context (`{arch}.context_length`): the default session context.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub post_norm_eps: f32,
    pub rope: RopeParams,
    pub sliding_window: Option<usize>,
    pub layers: Vec<LayerKind>,
    /// Multiplies the logits (1.0 when absent).
    pub logit_scale: f32,
    /// logits = c * tanh(logits / c) when set.
    pub softcap: Option<f32>,
    /// The LM head reuses `token_embd.weight` (no `output.weight` in the file).
    pub tied_output: bool,
}

fn supported_list() -> String {
    ARCHITECTURES
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn meta_err(key: &str, msg: impl Into<String>) -> EngineError {
    EngineError::Metadata {
        key: key.to_string(),
        msg: msg.into(),
    }
}

/// Typed metadata access with errors naming the key.
struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{}", self.arch, k)
    }
    fn has(&self, k: &str) -> bool {
        self.file.get(&self.key(k)).is_some()
    }
    fn usize(&self, k: &str) -> Result<usize> {
        let key = self.key(k);
        let v = self.file.get_u64(&key)?;
        usize::try_from(v).map_err(|_| meta_err(&key, format!("{v} does not fit in usize")))
    }
    fn positive(&self, k: &str) -> Result<usize> {
        let v = self.usize(k)?;
        if v == 0 {
            return Err(meta_err(&self.key(k), "must be > 0, found 0"));
        }
        Ok(v)
    }
    fn usize_or(&self, k: &str, default: usize) -> Result<usize> {
        if self.has(k) {
            self.positive(k)
        } else {
            Ok(default)
        }
    }
    fn f32_or(&self, k: &str, default: f32) -> Result<f32> {
        if !self.has(k) {
            return Ok(default);
        }
        let key = self.key(k);
        let v = self.file.get_f32(&key)?;
        if !v.is_finite() {
            return Err(meta_err(&key, format!("must be finite, found {v}")));
        }
        Ok(v)
    }
    /// As `f32_or`, and the value must be >= 0 (`strict`: > 0).
    fn f32_min_or(&self, k: &str, default: f32, strict: bool) -> Result<f32> {
        let v = self.f32_or(k, default)?;
        if v < 0.0 || (strict && v == 0.0) {
            let bound = if strict { "> 0" } else { ">= 0" };
            return Err(meta_err(
                &self.key(k),
                format!("must be {bound}, found {v}"),
            ));
        }
        Ok(v)
    }
}

/// The blocks the file's tensors hold: one more than the largest N of a tensor named `blk.N.*`
/// (0 when there is none).
fn blocks_in_file(file: &GgufFile) -> usize {
    file.tensors
        .iter()
        .filter_map(|t| {
            t.name
                .strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .map(|n| n.saturating_add(1))
        .max()
        .unwrap_or(0)
}

impl ModelConfig {
    /// Reads the architecture and its hyper-parameters. Fails on an unsupported architecture
    /// (naming it and the supported ones) and on missing or inconsistent keys.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let arch_name = file.get_str("general.architecture")?;
        let arch = *ARCHITECTURES
            .iter()
            .find(|a| a.name == arch_name)
            .ok_or_else(|| EngineError::UnsupportedArch {
                arch: arch_name.to_string(),
                supported: supported_list(),
            })?;
        let m = Meta {
            file,
            arch: arch_name,
        };

        let n_layer = m.positive("block_count")?;
        // Checked against the tensors before anything is sized by it: a block count past the
        // file's blocks would be millions of missing tensors, one short of them a model run on
        // part of its weights (wrong logits with no error).
        let in_file = blocks_in_file(file);
        if n_layer != in_file {
            return Err(meta_err(
                &m.key("block_count"),
                format!(
                    "{n_layer}, but the file's tensors are those of {in_file} blocks (blk.0 .. \
                     blk.{})",
                    in_file.saturating_sub(1)
                ),
            ));
        }
        let n_embd = m.positive("embedding_length")?;
        let n_ff = m.positive("feed_forward_length")?;
        let n_head = m.positive("attention.head_count")?;
        let n_head_kv = m.usize_or("attention.head_count_kv", n_head)?;
        if n_head % n_head_kv != 0 {
            return Err(meta_err(
                &m.key("attention.head_count_kv"),
                format!("{n_head} query heads are not a multiple of {n_head_kv} KV heads"),
            ));
        }
        let default_hd = n_embd / n_head;
        let head_dim = m.usize_or("attention.key_length", default_hd)?;
        let head_dim_v = m.usize_or("attention.value_length", head_dim)?;
        if head_dim_v != head_dim {
            return Err(meta_err(
                &m.key("attention.value_length"),
                format!("{head_dim_v} differs from key_length {head_dim}; Muser needs them equal"),
            ));
        }
        let n_rot = m.usize_or("rope.dimension_count", head_dim)?;
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(meta_err(
                &m.key("rope.dimension_count"),
                format!("{n_rot} must be even and <= head dim {head_dim}"),
            ));
        }
        let n_vocab = if m.has("vocab_size") {
            m.positive("vocab_size")?
        } else if let Some(MetaValue::Array(_, toks)) = file.get("tokenizer.ggml.tokens") {
            toks.len()
        } else if let Some(t) = file.tensor("token_embd.weight") {
            t.dims.get(1).copied().unwrap_or(0) as usize
        } else {
            return Err(meta_err(
                &m.key("vocab_size"),
                "missing, and no tokenizer or token_embd to infer it",
            ));
        };
        // RoPE scaling changes the angles; refuse rather than compute wrong logits.
        if file.tensor("rope_freqs.weight").is_some() {
            return Err(EngineError::Invalid(
                "tensor rope_freqs.weight (per-dimension RoPE frequency factors, e.g. Llama 3.1 \
                 scaling) is not supported yet"
                    .into(),
            ));
        }
        if let Some(MetaValue::String(t)) = file.get(&m.key("rope.scaling.type")) {
            if t != "none" {
                return Err(meta_err(
                    &m.key("rope.scaling.type"),
                    format!("RoPE scaling '{t}' is not supported yet"),
                ));
            }
        }
        let n_ctx_train = m.usize_or("context_length", 4096)?;
        // A negative epsilon can make the norm's square root NaN, a base <= 0 the RoPE angles.
        let rms_eps = m.f32_min_or("attention.layer_norm_rms_epsilon", 1e-5, false)?;
        let post_norm_eps = m.f32_min_or("attention.post_norm_rms_epsilon", rms_eps, false)?;
        let freq_base = m.f32_min_or("rope.freq_base", 10000.0, true)?;

        let (sliding_window, layers) = match arch.sliding {
            SlidingPattern::None => (
                None,
                vec![
                    LayerKind {
                        sliding: false,
                        rope: true
                    };
                    n_layer
                ],
            ),
            SlidingPattern::NopeFullEvery => {
                let window = m.positive("attention.sliding_window")?;
                let interval = m.positive("attention.full_attention_interval")?;
                let layers = (0..n_layer)
                    .map(|i| {
                        let full = (i + 1) % interval == 0;
                        LayerKind {
                            sliding: !full,
                            rope: !full,
                        }
                    })
                    .collect();
                (Some(window), layers)
            }
        };
        // 0 would make every token equally likely, a negative scale the least likely the first.
        let logit_scale = m.f32_min_or("logit_scale", 1.0, true)?;
        let softcap = if m.has("final_logit_softcapping") {
            let c = m.f32_or("final_logit_softcapping", 0.0)?;
            if c < 0.0 {
                return Err(meta_err(
                    &m.key("final_logit_softcapping"),
                    format!("{c} must be >= 0"),
                ));
            }
            (c > 0.0).then_some(c)
        } else {
            None
        };
        let tied_output = file.tensor("output.weight").is_none() && !arch.output_required;

        Ok(ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rms_eps,
            post_norm_eps,
            rope: RopeParams {
                style: arch.rope_style,
                freq_base,
                n_rot,
            },
            sliding_window,
            layers,
            logit_scale,
            softcap,
            tied_output,
        })
    }

    /// Query width (n_head * head_dim).
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }
    /// Key/value width (n_head_kv * head_dim).
    pub fn kv_width(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
