//! The preset table: every synthetic model is one configuration of the same generator.

/// The GGUF architecture a preset writes (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Muse Glimmer's layer (SPEC section 2): output gate, QK norm, post-norms, sliding-window
    /// RoPE layers with every `full_attention_interval`-th layer full-attention NoPE, softcap.
    Muse,
    Llama,
    /// Llama with per-head QK norm and an explicit head size.
    Qwen3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Muse => "muse",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// One synthetic model. Fields named after the GGUF keys they become (`{arch}.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub description: &'static str,
    pub arch: Arch,
    pub block_count: u32,
    pub embedding_length: u64,
    pub feed_forward_length: u64,
    pub head_count: u64,
    pub head_count_kv: u64,
    /// key_length == value_length == the rotary dimension count.
    pub head_dim: u64,
    /// Total tokens: byte tokens + learned merges + special tokens + reserved padding.
    pub vocab_size: u64,
    pub context_length: u32,
    /// Upper bound on learned merges (the trainer may learn fewer; reserved tokens pad).
    pub max_merges: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    // Muse only (ignored for the other architectures).
    pub post_norm_eps: f32,
    pub sliding_window: u32,
    pub full_attention_interval: u32,
    pub logit_scale: f32,
    pub final_logit_softcapping: f32,
}

const MUSE_GLIMMER: Preset = Preset {
    name: "muse-glimmer",
    description: "Muse Glimmer at full size, Q4_K_M mix (SPEC section 2)",
    arch: Arch::Muse,
    block_count: 52,
    embedding_length: 6656,
    feed_forward_length: 19968,
    head_count: 32,
    head_count_kv: 2,
    head_dim: 128,
    vocab_size: 202_048,
    context_length: 65536,
    max_merges: 100_000,
    rope_freq_base: 500_000.0,
    rms_eps: 1e-5,
    post_norm_eps: 1e-8,
    sliding_window: 4096,
    full_attention_interval: 4,
    logit_scale: 0.196_116_14,
    final_logit_softcapping: 20.0,
};

const LLAMA_DEFAULTS: Preset = Preset {
    name: "",
    description: "",
    arch: Arch::Llama,
    block_count: 4,
    embedding_length: 256,
    feed_forward_length: 768,
    head_count: 4,
    head_count_kv: 2,
    head_dim: 64,
    vocab_size: 2048,
    context_length: 2048,
    max_merges: 100_000,
    rope_freq_base: 500_000.0,
    rms_eps: 1e-5,
    post_norm_eps: 0.0,
    sliding_window: 0,
    full_attention_interval: 0,
    logit_scale: 1.0,
    final_logit_softcapping: 0.0,
};

/// Every preset, in the order `muser synth --list` prints them.
pub const PRESETS: &[Preset] = &[
    MUSE_GLIMMER,
    Preset {
        name: "muse-tiny",
        description: "every muse feature at test size: 8 layers (2 full-attention), window 32",
        block_count: 8,
        embedding_length: 256,
        feed_forward_length: 768,
        head_count: 4,
        head_count_kv: 2,
        head_dim: 64,
        vocab_size: 2048,
        context_length: 2048,
        sliding_window: 32,
        logit_scale: 0.5,
        ..MUSE_GLIMMER
    },
    Preset {
        name: "muse-mid",
        description: "muse at mid size for GPU parity: 8 layers, hidden 2048, vocab 32768",
        block_count: 8,
        embedding_length: 2048,
        feed_forward_length: 6144,
        head_count: 16,
        head_count_kv: 2,
        head_dim: 128,
        vocab_size: 32768,
        context_length: 8192,
        sliding_window: 256,
        logit_scale: 0.353_553_38,
        ..MUSE_GLIMMER
    },
    Preset {
        name: "llama-tiny",
        description: "llama at test size: 4 layers, hidden 256, 4/2 heads of 64",
        ..LLAMA_DEFAULTS
    },
    Preset {
        name: "qwen3-tiny",
        description: "qwen3 at test size: 4 layers, hidden 256, 8/2 heads of 64 (q width 512)",
        arch: Arch::Qwen3,
        head_count: 8,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..LLAMA_DEFAULTS
    },
    Preset {
        name: "llama-1b",
        description: "a ~1.0B-parameter llama for CPU benchmarks: 16 layers, hidden 2048, ffn 7168",
        block_count: 16,
        embedding_length: 2048,
        feed_forward_length: 7168,
        head_count: 32,
        head_count_kv: 8,
        head_dim: 64,
        vocab_size: 32768,
        context_length: 8192,
        ..LLAMA_DEFAULTS
    },
    Preset {
        name: "llama-glimmer",
        description:
            "a llama with Muse Glimmer's sizes and Q4_K_M mix (the llama.cpp comparator file)",
        block_count: 52,
        embedding_length: 6656,
        feed_forward_length: 19968,
        head_count: 32,
        head_count_kv: 2,
        head_dim: 128,
        vocab_size: 202_048,
        context_length: 65536,
        ..LLAMA_DEFAULTS
    },
];

/// The preset named `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

impl Preset {
    /// Width of the query (and gate, and attention output) projection.
    pub fn q_dim(&self) -> u64 {
        self.head_count * self.head_dim
    }
    /// Width of the key and value projections.
    pub fn kv_dim(&self) -> u64 {
        self.head_count_kv * self.head_dim
    }
    /// Muse: layer `i` is a full-attention NoPE layer (else sliding-window with RoPE).
    pub fn is_full_attention_layer(&self, i: u32) -> bool {
        self.full_attention_interval > 0 && (i + 1).is_multiple_of(self.full_attention_interval)
    }
}
