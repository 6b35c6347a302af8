//! The tokenizer: lookup tables built once from [`TokenizerData`], then `encode` and `decode`.

use crate::bpe::{BpeEncoder, PreTokenizer};
use crate::special::{Fragment, SpecialMatcher};
use crate::spm::{parse_byte_token, SpmEncoder, SPACE};
use crate::{TokenType, TokenizerData, TokenizerError, TokenizerModel};
use muser_gguf::GgufFile;
use std::collections::HashMap;

/// Both boxed: each holds 256-entry byte tables.
enum Encoder {
    Bpe(Box<BpeEncoder>),
    Spm(Box<SpmEncoder>),
}

pub struct Tokenizer {
    model: TokenizerModel,
    /// (n_vocab) token texts as stored in the file.
    tokens: Vec<String>,
    /// (n_vocab) token types.
    types: Vec<TokenType>,
    /// Token text -> id; a text listed twice maps to its last id, as in llama.cpp.
    vocab: HashMap<String, u32>,
    /// Every token's decoded bytes, concatenated; token i is `pieces[piece_ends[i-1]..piece_ends[i]]`.
    pieces: Vec<u8>,
    /// (n_vocab) end offsets into `pieces`.
    piece_ends: Vec<u32>,
    special: SpecialMatcher,
    encoder: Encoder,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl Tokenizer {
    /// Validates the description and builds the lookup tables.
    pub fn new(data: TokenizerData) -> Result<Tokenizer, TokenizerError> {
        let n_vocab = data.tokens.len();
        if n_vocab == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n_vocab > u32::MAX as usize {
            return Err(TokenizerError::LengthMismatch {
                key: "tokenizer.ggml.tokens",
                found: n_vocab,
                n_vocab: u32::MAX as usize,
            });
        }
        let check_len = |key, found: usize| {
            if found != 0 && found != n_vocab {
                Err(TokenizerError::LengthMismatch {
                    key,
                    found,
                    n_vocab,
                })
            } else {
                Ok(())
            }
        };
        check_len("tokenizer.ggml.scores", data.scores.len())?;
        check_len("tokenizer.ggml.token_type", data.token_types.len())?;
        let types = if data.token_types.is_empty() {
            vec![TokenType::Normal; n_vocab]
        } else {
            data.token_types
        };
        let check_id = |key, id: Option<u32>| match id {
            Some(id) if id as usize >= n_vocab => Err(TokenizerError::SpecialIdOutOfRange {
                key,
                id: id as u64,
                n_vocab,
            }),
            _ => Ok(id),
        };
        let bos = check_id("tokenizer.ggml.bos_token_id", data.bos)?;
        let eos = check_id("tokenizer.ggml.eos_token_id", data.eos)?;
        let eot = check_id("tokenizer.ggml.eot_token_id", data.eot)?;
        let eom = check_id("tokenizer.ggml.eom_token_id", data.eom)?;
        let unk = check_id("tokenizer.ggml.unknown_token_id", data.unk)?;
        let pad = check_id("tokenizer.ggml.padding_token_id", data.pad)?;

        let mut vocab = HashMap::with_capacity(n_vocab);
        for (id, text) in data.tokens.iter().enumerate() {
            vocab.insert(text.clone(), id as u32);
        }

        // llama's defaults are SentencePiece's conventional ids, used only where they exist.
        let in_vocab = |id: u32| ((id as usize) < n_vocab).then_some(id);
        let (encoder, bos, eos, unk, add_bos) = match data.model {
            TokenizerModel::Gpt2 => {
                let pre = PreTokenizer::for_name(data.pre.as_deref());
                let add_bos = data.add_bos.unwrap_or(pre.default_add_bos);
                let bpe = BpeEncoder::new(&pre, &vocab, &data.merges)?;
                (Encoder::Bpe(Box::new(bpe)), bos, eos, unk, add_bos)
            }
            TokenizerModel::Llama => {
                let unk = unk.or_else(|| in_vocab(0));
                let scores = if data.scores.is_empty() {
                    vec![0.0; n_vocab]
                } else {
                    data.scores
                };
                let add_space_prefix = data.add_space_prefix.unwrap_or(true);
                let spm = SpmEncoder::new(&vocab, scores, unk, add_space_prefix);
                let (bos, eos) = (bos.or_else(|| in_vocab(1)), eos.or_else(|| in_vocab(2)));
                (
                    Encoder::Spm(Box::new(spm)),
                    bos,
                    eos,
                    unk,
                    data.add_bos.unwrap_or(true),
                )
            }
        };

        let mut pieces = Vec::new();
        let mut piece_ends = Vec::with_capacity(n_vocab);
        for (text, &ty) in data.tokens.iter().zip(&types) {
            append_piece(&mut pieces, &encoder, text, ty);
            piece_ends.push(pieces.len() as u32);
        }
        Ok(Tokenizer {
            model: data.model,
            special: SpecialMatcher::new(&data.tokens, &types),
            tokens: data.tokens,
            types,
            vocab,
            pieces,
            piece_ends,
            encoder,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            add_bos,
            add_eos: data.add_eos.unwrap_or(false),
        })
    }

    /// Reads `tokenizer.ggml.*` from the file's metadata and builds the tokenizer.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::new(TokenizerData::from_gguf(file)?)
    }

    /// Tokenizes `text`. `add_special` prepends BOS (and appends EOS) where the file asks for
    /// them; `parse_special` lets control tokens written in the text become those tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_bytes(text.as_bytes(), add_special, parse_special)
    }

    /// As [`Tokenizer::encode`], for any bytes: byte-level BPE encodes each maximal invalid
    /// UTF-8 sequence from its bytes; SentencePiece sends invalid bytes to byte fallback.
    pub fn encode_bytes(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let mut after_special = true;
        for fragment in self.special.split(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    match &self.encoder {
                        Encoder::Bpe(bpe) => bpe.encode(t, &self.vocab, &mut out),
                        Encoder::Spm(spm) => spm.encode(t, after_special, &self.vocab, &mut out),
                    }
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The concatenated bytes of the tokens' pieces. Control tokens render as their text. For
    /// SentencePiece the `▁` prepended at encode time comes back as a leading space.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_to_piece_bytes(id)?);
        }
        Ok(out)
    }

    /// The bytes token `id` stands for (possibly part of a UTF-8 character).
    pub fn token_to_piece_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let i = self.check(id)?;
        let start = if i == 0 {
            0
        } else {
            self.piece_ends[i - 1] as usize
        };
        Ok(&self.pieces[start..self.piece_ends[i] as usize])
    }

    /// The token's text as stored in the file.
    pub fn token_text(&self, id: u32) -> Result<&str, TokenizerError> {
        Ok(&self.tokens[self.check(id)?])
    }

    pub fn token_type(&self, id: u32) -> Result<TokenType, TokenizerError> {
        Ok(self.types[self.check(id)?])
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    fn check(&self, id: u32) -> Result<usize, TokenizerError> {
        if (id as usize) < self.tokens.len() {
            Ok(id as usize)
        } else {
            Err(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.tokens.len(),
            })
        }
    }

    pub fn model(&self) -> TokenizerModel {
        self.model
    }
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    /// End of generation: EOS, EOT or EOM.
    pub fn is_eog(&self, id: u32) -> bool {
        [self.eos, self.eot, self.eom].contains(&Some(id))
    }
}

/// Appends the bytes one token decodes to.
fn append_piece(out: &mut Vec<u8>, encoder: &Encoder, text: &str, ty: TokenType) {
    if matches!(ty, TokenType::Control | TokenType::UserDefined) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    match encoder {
        Encoder::Bpe(bpe) => out.extend_from_slice(&bpe.bytes.decode_text(text)),
        Encoder::Spm(_) => match (ty, parse_byte_token(text)) {
            (TokenType::Byte, Some(b)) => out.push(b),
            _ => {
                for c in text.chars() {
                    let c = if c == SPACE { ' ' } else { c };
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
            }
        },
    }
}
