//! Tokenizers built from GGUF metadata: `gpt2` byte-level BPE and `llama` SentencePiece, special
//! tokens, and streaming detokenization that never splits a UTF-8 character.
//!
//! This crate owns text <-> token ids. It reads only `tokenizer.ggml.*` metadata and never
//! touches tensors, sampling or chat templates.

mod bpe;
mod byte_unicode;
mod data;
mod error;
mod special;
mod spm;
mod stream;
mod tokenizer;

pub use byte_unicode::ByteUnicode;
pub use data::{TokenType, TokenizerData, TokenizerModel};
pub use error::TokenizerError;
pub use stream::StreamDecoder;
pub use tokenizer::{Fim, Tokenizer};
