//! The tokenizer's description as GGUF metadata states it (`tokenizer.ggml.*`), before any
//! lookup table is built. Unit tests fill this struct directly; files go through `from_gguf`.

use crate::TokenizerError;
use muser_gguf::{GgufFile, MetaValue};

/// ggml's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    /// Special tokens such as `<|begin_of_text|>`: matched in text only when `parse_special`.
    Control = 3,
    /// Added tokens: always matched in text as whole tokens, rendered as their raw text.
    UserDefined = 4,
    Unused = 5,
    /// SentencePiece byte-fallback tokens `<0xXX>`.
    Byte = 6,
}

impl TokenType {
    pub fn from_i64(v: i64) -> Option<TokenType> {
        Some(match v {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// Which algorithm `tokenizer.ggml.model` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerModel {
    /// `"gpt2"`: byte-level BPE with ranked merges and a regex pre-tokenizer.
    Gpt2,
    /// `"llama"`: SentencePiece BPE driven by token scores, with byte fallback.
    Llama,
}

/// Everything the tokenizer needs, as stored in the file. Absent optional keys are `None` here;
/// the defaults (documented on each field) are applied by [`crate::Tokenizer::new`].
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerData {
    pub model: TokenizerModel,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name (gpt2 only). `None`, `""`, `"default"` and
    /// `"gpt2"` select GPT-2's own pattern; every other name llama.cpp knows selects its
    /// patterns, and a name it does not know is refused by `Tokenizer::new`.
    pub pre: Option<String>,
    /// (n_vocab) token texts; byte-level BPE texts are in GPT-2's byte-to-unicode alphabet.
    pub tokens: Vec<String>,
    /// (n_vocab) SentencePiece scores; empty when the file has none (then all zero).
    pub scores: Vec<f32>,
    /// (n_vocab) token types; empty when the file has none (then all `Normal`).
    pub token_types: Vec<TokenType>,
    /// BPE merges as `"left right"`, highest priority first (gpt2 only).
    pub merges: Vec<String>,
    /// Default: 1 for llama, none for gpt2.
    pub bos: Option<u32>,
    /// Default: 2 for llama, none for gpt2.
    pub eos: Option<u32>,
    /// Default: the token whose text is a known end-of-turn marker (`<|eot_id|>`, `<|im_end|>`,
    /// `<|end|>`, ...), as llama.cpp finds it.
    pub eot: Option<u32>,
    /// Default: the `<|eom_id|>` token.
    pub eom: Option<u32>,
    /// Fill-in-the-middle tokens (`tokenizer.ggml.fim_*_token_id`). Default: the token with a
    /// known text for each (`<|fim_prefix|>`, `<PRE>`, ...). Pad, repo and file-separator
    /// tokens end generation.
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
    /// Default: 0 for llama, none for gpt2.
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// Default: true for llama and for the gpt2 pre-tokenizers llama.cpp adds BOS for
    /// (`"llama-bpe"` and its other names, `"tekken"`, `"chameleon"`), false otherwise.
    pub add_bos: Option<bool>,
    /// Default: false.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (llama only). Default: true.
    pub add_space_prefix: Option<bool>,
}

impl TokenizerData {
    /// A description with only the model and tokens set; everything else absent.
    pub fn new(model: TokenizerModel, tokens: Vec<String>) -> TokenizerData {
        TokenizerData {
            model,
            pre: None,
            tokens,
            scores: Vec::new(),
            token_types: Vec::new(),
            merges: Vec::new(),
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            fim_pre: None,
            fim_suf: None,
            fim_mid: None,
            fim_pad: None,
            fim_rep: None,
            fim_sep: None,
            unk: None,
            pad: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
        }
    }

    /// Reads `tokenizer.ggml.*` from a file's metadata. Only the keys' presence and types are
    /// checked here; consistency (lengths, merges, ids in range) is checked by `Tokenizer::new`.
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerData, TokenizerError> {
        let model = match meta_str(file, "tokenizer.ggml.model")? {
            None => {
                return Err(TokenizerError::MissingKey {
                    key: "tokenizer.ggml.model",
                })
            }
            Some("gpt2") => TokenizerModel::Gpt2,
            Some("llama") => TokenizerModel::Llama,
            Some(other) => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let tokens =
            meta_str_array(file, "tokenizer.ggml.tokens")?.ok_or(TokenizerError::MissingKey {
                key: "tokenizer.ggml.tokens",
            })?;
        let scores = meta_f32_array(file, "tokenizer.ggml.scores")?.unwrap_or_default();
        let token_types = match meta_i64_array(file, "tokenizer.ggml.token_type")? {
            None => Vec::new(),
            Some(v) => v
                .iter()
                .enumerate()
                .map(|(id, &t)| {
                    TokenType::from_i64(t).ok_or(TokenizerError::BadTokenType { id, value: t })
                })
                .collect::<Result<_, _>>()?,
        };
        let merges = meta_str_array(file, "tokenizer.ggml.merges")?.unwrap_or_default();
        Ok(TokenizerData {
            model,
            pre: meta_str(file, "tokenizer.ggml.pre")?.map(str::to_string),
            tokens,
            scores,
            token_types,
            merges,
            bos: meta_id(file, "tokenizer.ggml.bos_token_id")?,
            eos: meta_id(file, "tokenizer.ggml.eos_token_id")?,
            eot: meta_id(file, "tokenizer.ggml.eot_token_id")?,
            eom: meta_id(file, "tokenizer.ggml.eom_token_id")?,
            fim_pre: meta_id(file, "tokenizer.ggml.fim_pre_token_id")?
                .or(meta_id(file, "tokenizer.ggml.prefix_token_id")?),
            fim_suf: meta_id(file, "tokenizer.ggml.fim_suf_token_id")?
                .or(meta_id(file, "tokenizer.ggml.suffix_token_id")?),
            fim_mid: meta_id(file, "tokenizer.ggml.fim_mid_token_id")?
                .or(meta_id(file, "tokenizer.ggml.middle_token_id")?),
            fim_pad: meta_id(file, "tokenizer.ggml.fim_pad_token_id")?,
            fim_rep: meta_id(file, "tokenizer.ggml.fim_rep_token_id")?,
            fim_sep: meta_id(file, "tokenizer.ggml.fim_sep_token_id")?,
            unk: meta_id(file, "tokenizer.ggml.unknown_token_id")?,
            pad: meta_id(file, "tokenizer.ggml.padding_token_id")?,
            add_bos: meta_bool(file, "tokenizer.ggml.add_bos_token")?,
            add_eos: meta_bool(file, "tokenizer.ggml.add_eos_token")?,
            add_space_prefix: meta_bool(file, "tokenizer.ggml.add_space_prefix")?,
        })
    }
}

// The metadata readers below match `MetaValue` directly so that the rules are ours: any integer
// type is accepted for an id, and a negative id (some converters write -1) means "none".

fn type_name(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(t, items) => format!("an array of {t:?} ({} items)", items.len()),
        other => meta_scalar_name(other).to_string(),
    }
}

fn meta_scalar_name(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::U8(_) => "u8",
        MetaValue::I8(_) => "i8",
        MetaValue::U16(_) => "u16",
        MetaValue::I16(_) => "i16",
        MetaValue::U32(_) => "u32",
        MetaValue::I32(_) => "i32",
        MetaValue::F32(_) => "f32",
        MetaValue::Bool(_) => "bool",
        MetaValue::String(_) => "string",
        MetaValue::Array(..) => "array",
        MetaValue::U64(_) => "u64",
        MetaValue::I64(_) => "i64",
        MetaValue::F64(_) => "f64",
    }
}

fn wrong(key: &'static str, expected: &'static str, v: &MetaValue) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: type_name(v),
    }
}

fn as_i128(v: &MetaValue) -> Option<i128> {
    Some(match *v {
        MetaValue::U8(x) => x as i128,
        MetaValue::I8(x) => x as i128,
        MetaValue::U16(x) => x as i128,
        MetaValue::I16(x) => x as i128,
        MetaValue::U32(x) => x as i128,
        MetaValue::I32(x) => x as i128,
        MetaValue::U64(x) => x as i128,
        MetaValue::I64(x) => x as i128,
        _ => return None,
    })
}

fn meta_str<'a>(file: &'a GgufFile, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(MetaValue::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong(key, "a string", v)),
    }
}

fn meta_bool(file: &GgufFile, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(MetaValue::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong(key, "a bool", v)),
    }
}

fn meta_id(file: &GgufFile, key: &'static str) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    match as_i128(v) {
        None => Err(wrong(key, "an integer", v)),
        Some(x) if x < 0 => Ok(None),
        Some(x) => u32::try_from(x)
            .map(Some)
            .map_err(|_| TokenizerError::WrongType {
                key,
                expected: "a token id below 2^32",
                found: x.to_string(),
            }),
    }
}

fn meta_array<'a>(
    file: &'a GgufFile,
    key: &'static str,
    expected: &'static str,
) -> Result<Option<&'a [MetaValue]>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(MetaValue::Array(_, items)) => Ok(Some(items)),
        Some(v) => Err(wrong(key, expected, v)),
    }
}

fn meta_str_array(
    file: &GgufFile,
    key: &'static str,
) -> Result<Option<Vec<String>>, TokenizerError> {
    const EXPECTED: &str = "an array of strings";
    let Some(items) = meta_array(file, key, EXPECTED)? else {
        return Ok(None);
    };
    items
        .iter()
        .map(|v| match v {
            MetaValue::String(s) => Ok(s.clone()),
            other => Err(wrong(key, EXPECTED, other)),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

fn meta_f32_array(file: &GgufFile, key: &'static str) -> Result<Option<Vec<f32>>, TokenizerError> {
    const EXPECTED: &str = "an array of numbers";
    let Some(items) = meta_array(file, key, EXPECTED)? else {
        return Ok(None);
    };
    items
        .iter()
        .map(|v| match *v {
            MetaValue::F32(x) => Ok(x),
            MetaValue::F64(x) => Ok(x as f32),
            ref other => as_i128(other)
                .map(|x| x as f32)
                .ok_or_else(|| wrong(key, EXPECTED, other)),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

fn meta_i64_array(file: &GgufFile, key: &'static str) -> Result<Option<Vec<i64>>, TokenizerError> {
    const EXPECTED: &str = "an array of integers";
    let Some(items) = meta_array(file, key, EXPECTED)? else {
        return Ok(None);
    };
    items
        .iter()
        .map(|v| {
            as_i128(v)
                .and_then(|x| i64::try_from(x).ok())
                .ok_or_else(|| wrong(key, EXPECTED, v))
        })
        .collect::<Result<_, _>>()
        .map(Some)
}
