//! Every way the engine refuses a model or an input, each naming what is wrong and the numbers
//! involved.

use muser_gguf::{GgmlType, GgufError};
use muser_quant::QuantError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("architecture '{arch}' is not supported (supported: {supported})")]
    UnsupportedArch { arch: String, supported: String },
    #[error("metadata key {key}: {msg}")]
    Metadata { key: String, msg: String },
    #[error("the model's tensors do not match architecture '{arch}':\n  {}", problems.join("\n  "))]
    Tensors { arch: String, problems: Vec<String> },
    #[error("tensor {name}: type {ty} is not supported for this role (supported: {supported})")]
    TensorType {
        name: String,
        ty: GgmlType,
        supported: &'static str,
    },
    #[error(
        "{n_new} tokens at position {n_past} do not fit the context: n_prompt = {n_new}, \
         n_past = {n_past}, n_ctx = {n_ctx}"
    )]
    ContextOverflow {
        n_past: usize,
        n_new: usize,
        n_ctx: usize,
    },
    #[error("token id {token} is out of range (n_vocab = {n_vocab})")]
    BadToken { token: u32, n_vocab: usize },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
