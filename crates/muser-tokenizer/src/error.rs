//! Every way a tokenizer can be refused at load or a decode can fail, each naming the key, token
//! or id and the numbers involved.

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata key {key} is missing")]
    MissingKey { key: &'static str },
    #[error("tokenizer metadata key {key} should be {expected}, found {found}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("tokenizer model {0:?} is not supported (supported: \"gpt2\", \"llama\")")]
    UnsupportedModel(String),
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("{key} has {found} entries but the vocabulary has {n_vocab} tokens")]
    LengthMismatch {
        key: &'static str,
        found: usize,
        n_vocab: usize,
    },
    #[error("token type {value} of token {id} is not a ggml token type (0..=6)")]
    BadTokenType { id: usize, value: i64 },
    #[error("merge {index} ({merge:?}): {reason}")]
    BadMerge {
        index: usize,
        merge: String,
        reason: String,
    },
    #[error("{key} = {id} is outside the vocabulary of {n_vocab} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u64,
        n_vocab: usize,
    },
    #[error(
        "the byte-level vocabulary has no token for byte 0x{byte:02X} (its text would be {text:?})"
    )]
    MissingByteToken { byte: u8, text: String },
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    IdOutOfRange { id: u32, n_vocab: usize },
    #[error("pre-tokenizer regex failed: {0}")]
    Regex(String),
}
