//! GGUF metadata of a preset: `general.*`, the architecture's hyperparameters (`{arch}.*`) and
//! the tokenizer (`tokenizer.ggml.*`), with the keys llama.cpp requires to load llama and qwen3.

use crate::bpe::{Bpe, CORPUS, REGEX_LLAMA_BPE, REGEX_QWEN2};
use crate::preset::{Arch, Preset};
use muser_gguf::{MetaType, MetaValue};

/// llama.cpp's token types.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// `general.file_type` of a mostly-Q4_K_M file (llama.cpp's `LLAMA_FTYPE_MOSTLY_Q4_K_M`).
pub const FILE_TYPE_MOSTLY_Q4_K_M: u32 = 15;

/// The special tokens, after the learned ones, in this order.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"];

/// A preset's vocabulary: tokens, their types, merges, and the ids of the special tokens.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: u32,
    pub eos: u32,
    pub eot: u32,
}

/// Trains the BPE for `p` (on the embedded corpus, split as the preset's pre-tokenizer does)
/// and pads it to `p.vocab_size` with `<|reserved_N|>` control tokens.
pub fn vocab(p: &Preset) -> Vocab {
    let (pre, pattern) = match p.arch {
        Arch::Qwen3 => ("qwen2", REGEX_QWEN2),
        Arch::Muse | Arch::Llama => ("llama-bpe", REGEX_LLAMA_BPE),
    };
    let room = p.vocab_size as usize - 256 - SPECIAL_TOKENS.len();
    let bpe = Bpe::train(CORPUS, pattern, p.max_merges.min(room));
    let mut tokens = bpe.token_strings();
    let mut token_types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
    let bos = tokens.len() as u32;
    tokens.extend(SPECIAL_TOKENS.iter().map(|s| s.to_string()));
    let mut reserved = 0;
    while tokens.len() < p.vocab_size as usize {
        tokens.push(format!("<|reserved_{reserved}|>"));
        reserved += 1;
    }
    token_types.resize(tokens.len(), TOKEN_TYPE_CONTROL);
    Vocab {
        pre,
        tokens,
        token_types,
        merges: bpe.merge_strings(),
        bos,
        eos: bos + 1,
        eot: bos + 2,
    }
}

fn s(v: &str) -> MetaValue {
    MetaValue::String(v.to_string())
}

/// Every metadata key/value of the preset's file, in file order.
pub fn metadata(p: &Preset, seed: u64) -> Vec<(String, MetaValue)> {
    let a = p.arch.name();
    let mut m: Vec<(String, MetaValue)> = Vec::new();
    let mut put = |k: String, v: MetaValue| m.push((k, v));
    let u32v = |x: u64| MetaValue::U32(u32::try_from(x).expect("hyperparameters fit in u32"));

    put("general.architecture".into(), s(a));
    put(
        "general.name".into(),
        s(&format!("{} (synthetic, seed {seed})", p.name)),
    );
    put(
        "general.file_type".into(),
        MetaValue::U32(FILE_TYPE_MOSTLY_Q4_K_M),
    );
    put("general.quantization_version".into(), MetaValue::U32(2));
    put(
        format!("{a}.context_length"),
        MetaValue::U32(p.context_length),
    );
    put(format!("{a}.embedding_length"), u32v(p.embedding_length));
    put(format!("{a}.block_count"), MetaValue::U32(p.block_count));
    put(
        format!("{a}.feed_forward_length"),
        u32v(p.feed_forward_length),
    );
    put(format!("{a}.attention.head_count"), u32v(p.head_count));
    put(
        format!("{a}.attention.head_count_kv"),
        u32v(p.head_count_kv),
    );
    put(format!("{a}.attention.key_length"), u32v(p.head_dim));
    put(format!("{a}.attention.value_length"), u32v(p.head_dim));
    put(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(p.rms_eps),
    );
    put(format!("{a}.rope.dimension_count"), u32v(p.head_dim));
    put(
        format!("{a}.rope.freq_base"),
        MetaValue::F32(p.rope_freq_base),
    );
    put(format!("{a}.vocab_size"), u32v(p.vocab_size));
    if p.arch == Arch::Muse {
        put(
            format!("{a}.attention.post_norm_rms_epsilon"),
            MetaValue::F32(p.post_norm_eps),
        );
        put(
            format!("{a}.attention.sliding_window"),
            MetaValue::U32(p.sliding_window),
        );
        put(
            format!("{a}.attention.full_attention_interval"),
            MetaValue::U32(p.full_attention_interval),
        );
        put(format!("{a}.logit_scale"), MetaValue::F32(p.logit_scale));
        put(
            format!("{a}.final_logit_softcapping"),
            MetaValue::F32(p.final_logit_softcapping),
        );
    }

    let v = vocab(p);
    let strings = |xs: Vec<String>| {
        MetaValue::Array(
            MetaType::String,
            xs.into_iter().map(MetaValue::String).collect(),
        )
    };
    put("tokenizer.ggml.model".into(), s("gpt2"));
    put("tokenizer.ggml.pre".into(), s(v.pre));
    put("tokenizer.ggml.tokens".into(), strings(v.tokens));
    put(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array(
            MetaType::I32,
            v.token_types.into_iter().map(MetaValue::I32).collect(),
        ),
    );
    put("tokenizer.ggml.merges".into(), strings(v.merges));
    put("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(v.bos));
    put("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(v.eos));
    put("tokenizer.ggml.eot_token_id".into(), MetaValue::U32(v.eot));
    put(
        "tokenizer.ggml.add_bos_token".into(),
        MetaValue::Bool(p.arch != Arch::Qwen3),
    );
    put(
        "tokenizer.ggml.add_eos_token".into(),
        MetaValue::Bool(false),
    );
    m
}
